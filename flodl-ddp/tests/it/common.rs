//! Shared fixtures of flodl-ddp's integration tests: the vendored MNIST, loaded once per binary.

use std::sync::{Arc, OnceLock};

use flodl_data::{Dataset, Mnist, Split, Subset, Verify};

pub(crate) type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// The vendored MNIST split, loaded once per test binary.
pub(crate) fn mnist(split: Split) -> Arc<Mnist> {
    static TRAIN: OnceLock<Arc<Mnist>> = OnceLock::new();
    static TEST: OnceLock<Arc<Mnist>> = OnceLock::new();
    let cell = if split == Split::Train { &TRAIN } else { &TEST };
    cell.get_or_init(|| {
        Arc::new(
            Mnist::load(flodl_data::mnist::vendored_dir(), split, Verify::Skip)
                .expect("vendored MNIST loads"),
        )
    })
    .clone()
}

/// The first `n` training samples.
pub(crate) fn train_subset(n: usize) -> Arc<dyn Dataset> {
    Arc::new(Subset::first(mnist(Split::Train), n))
}

//! Where the workspace, its target folder and its vendored data are.

use std::env;
use std::path::{Path, PathBuf};

/// The workspace root (the parent of this crate's folder).
pub(crate) fn root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// The cargo target folder: `$CARGO_TARGET_DIR` when set (relative to the root), else `target`.
pub(crate) fn target_dir() -> PathBuf {
    let root = root();
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join("target"),
    }
}

/// The vendored MNIST folder (`data/mnist`).
pub(crate) fn mnist_dir() -> PathBuf {
    root().join("data").join("mnist")
}

/// The cargo executable that started us (`$CARGO`), else `cargo` from the path.
pub(crate) fn cargo() -> PathBuf {
    env::var_os("CARGO").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("cargo"))
}

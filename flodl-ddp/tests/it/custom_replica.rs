//! A replica written outside the crate, against its public API only (`examples/softmax.rs`,
//! softmax regression): the `Trainer` trains it to a real accuracy.

use crate::common::TestResult;
use crate::softmax;

use flodl_ddp::Policy;

/// Softmax regression trained on 8192 MNIST images (2 CPU ranks, 3 epochs) classifies at least
/// 85% of 1000 test images (chance is 10%; `Sync` on CPU ranks is bitwise deterministic, so the
/// bound cannot flake: the run reaches about 90%).
#[test]
fn softmax_regression_written_against_the_public_api_trains() -> TestResult {
    let accuracy = softmax::train(8192, 1000, 3, Policy::Sync)?;
    assert!(accuracy >= 0.85, "softmax regression reached {:.2}% only", 100.0 * accuracy);
    Ok(())
}

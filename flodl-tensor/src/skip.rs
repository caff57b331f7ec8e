//! The GPU-test gate: skip with a printed reason, or fail when a GPU is required.

/// The environment variable that turns a GPU-test skip into a failure (`cargo xtask gpu-test`
/// sets it to `1`).
pub const REQUIRE_GPU_ENV: &str = "FLODL_REQUIRE_GPU";

/// What a GPU test does when it cannot run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipDecision {
    /// Print `skipped: <reason>` and pass.
    Skip,
    /// Fail the test: a GPU was required.
    Fail,
}

/// The decision for a value of [`REQUIRE_GPU_ENV`]: unset, empty, `0` or `false` skip; any
/// other value fails.
pub fn skip_decision(require_gpu: Option<&str>) -> SkipDecision {
    match require_gpu.map(str::trim) {
        None | Some("" | "0" | "false") => SkipDecision::Skip,
        Some(_) => SkipDecision::Fail,
    }
}

/// For tests that need a GPU and cannot get one: prints `skipped: <reason>` to stderr, or, when
/// [`REQUIRE_GPU_ENV`] asks for a GPU, panics so the test fails.
///
/// # Panics
/// When `FLODL_REQUIRE_GPU` is set to anything but empty, `0` or `false`.
pub fn skip_or_fail(reason: &str) {
    let var = std::env::var(REQUIRE_GPU_ENV).ok();
    match skip_decision(var.as_deref()) {
        SkipDecision::Skip => eprintln!("skipped: {reason}"),
        SkipDecision::Fail => {
            panic!("{REQUIRE_GPU_ENV} is set but the GPU test cannot run: {reason}")
        }
    }
}

/// For tests that need `needed` GPUs: whether fewer are visible, in which case it has already
/// called [`skip_or_fail`] with "not run (needs N GPUs, M visible)" — so under
/// [`REQUIRE_GPU_ENV`] a machine with too few GPUs fails the test instead of passing it.
///
/// # Panics
/// When too few GPUs are visible and `FLODL_REQUIRE_GPU` asks for a GPU.
pub fn lacks_gpus(needed: usize) -> bool {
    let visible = crate::cuda_device_count();
    if visible >= needed {
        return false;
    }
    skip_or_fail(&format!("not run (needs {needed} GPUs, {visible} visible)"));
    true
}

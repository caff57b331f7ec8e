//! Test skips that stay visible: the GPU-test gate, and [`skip`], which every test that cannot
//! run here calls to say so.
//!
//! A skipped test still reads `ok` in the test harness's own output, so each skip also prints
//! `skipped: <test>: <reason>` straight to stderr (past the harness's capture: plain
//! `cargo test` shows it) and, when [`SKIP_LOG_ENV`] names a file, appends one line to it;
//! `.ci/run` and `cargo xtask ci` read that file back and end each test step with the list.

use std::io::Write;

/// The environment variable that turns a GPU-test skip into a failure (`cargo xtask gpu-test`
/// sets it to `1`).
pub const REQUIRE_GPU_ENV: &str = "FLODL_REQUIRE_GPU";

/// The environment variable naming the file every skip appends its line to (`.ci/run` and
/// `cargo xtask ci` set it): `<test binary> <test name>`, a tab, the reason.
pub const SKIP_LOG_ENV: &str = "FLODL_SKIP_LOG";

/// What a GPU test does when it cannot run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipDecision {
    /// Record the skip (see [`skip`]) and pass.
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

/// For tests that need a GPU and cannot get one: records the skip (see [`skip`]), or, when
/// [`REQUIRE_GPU_ENV`] asks for a GPU, panics so the test fails.
///
/// # Panics
/// When `FLODL_REQUIRE_GPU` is set to anything but empty, `0` or `false`.
pub fn skip_or_fail(reason: &str) {
    let var = std::env::var(REQUIRE_GPU_ENV).ok();
    match skip_decision(var.as_deref()) {
        SkipDecision::Skip => skip(reason),
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

/// Records that the running test skips (it returns right after, passing): prints
/// `skipped: <test>: <reason>` on stderr, written past the test harness's capture so it shows
/// under plain `cargo test`, and appends `<test>\t<reason>` to the file [`SKIP_LOG_ENV`] names,
/// when it names one. `<test>` is the test binary's name and the test's (the harness names each
/// test's thread after it). Best effort: a log that cannot be written is said on stderr.
pub fn skip(reason: &str) {
    let test = running_test();
    let reason = reason.replace(['\n', '\t'], " ");
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "skipped: {test}: {reason}");
    let Some(log) = std::env::var_os(SKIP_LOG_ENV).filter(|p| !p.is_empty()) else {
        return;
    };
    // One write of the whole line to a file opened for appending: lines of processes that skip
    // at once do not interleave.
    let line = format!("{test}\t{reason}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        let _ = writeln!(stderr, "skipped: cannot record it in {}: {e}", log.to_string_lossy());
    }
}

/// `<test binary> <test name>`: the executable's name without cargo's hash suffix, and the
/// current thread's name (the harness's name for the test; `main` outside one).
fn running_test() -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let binary = match binary.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name.to_owned()
        }
        _ => binary,
    };
    let thread = std::thread::current();
    format!("{binary} {}", thread.name().unwrap_or("<unnamed thread>"))
}

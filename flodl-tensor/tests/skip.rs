//! The GPU-test gate: `FLODL_REQUIRE_GPU=1` turns a skip into a failure.

use std::process::Command;

use flodl_tensor::{REQUIRE_GPU_ENV, SKIP_LOG_ENV, SkipDecision, skip_decision, skip_or_fail};

/// Set only in the child processes spawned below.
const CHILD_ENV: &str = "FLODL_SKIP_CHILD";

#[test]
fn decision_table() {
    for (value, want) in [
        (None, SkipDecision::Skip),
        (Some(""), SkipDecision::Skip),
        (Some("0"), SkipDecision::Skip),
        (Some("false"), SkipDecision::Skip),
        (Some("1"), SkipDecision::Fail),
        (Some("yes"), SkipDecision::Fail),
    ] {
        assert_eq!(skip_decision(value), want, "{value:?}");
    }
}

/// Calls the gate, but only inside a child process started by `require_gpu_turns_skip_into_failure`.
#[test]
fn child_gate() {
    if std::env::var_os(CHILD_ENV).is_some() {
        skip_or_fail("probe reason");
    }
}

fn run_child(
    require: Option<&str>,
    log: &std::path::Path,
) -> Result<std::process::Output, std::io::Error> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["--exact", "child_gate", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env(SKIP_LOG_ENV, log);
    match require {
        Some(v) => cmd.env(REQUIRE_GPU_ENV, v),
        None => cmd.env_remove(REQUIRE_GPU_ENV),
    };
    cmd.output()
}

#[test]
fn require_gpu_turns_skip_into_failure() -> Result<(), Box<dyn std::error::Error>> {
    let log = std::env::temp_dir().join(format!("flodl-skip-test-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let skipped = run_child(None, &log)?;
    let err = String::from_utf8_lossy(&skipped.stderr);
    assert!(skipped.status.success(), "without the variable the gate must pass: {err}");
    // Shown even though the harness captures the test's output.
    assert!(err.contains("skipped: skip child_gate: probe reason"), "no skip line: {err}");
    let logged = std::fs::read_to_string(&log)?;
    assert_eq!(logged, "skip child_gate\tprobe reason\n");

    let failed = run_child(Some("1"), &log)?;
    let out = String::from_utf8_lossy(&failed.stdout).into_owned()
        + &String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success(), "with FLODL_REQUIRE_GPU=1 the gate must fail: {out}");
    assert!(out.contains("probe reason"), "failure must carry the reason: {out}");
    assert_eq!(std::fs::read_to_string(&log)?, logged, "a failure is not a skip");
    std::fs::remove_file(&log)?;
    Ok(())
}

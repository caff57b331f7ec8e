//! Rank processes that join a running job again: `fdl launch --max-restarts` restarts a killed
//! rank process, which the controller admits at a reduce from the consensus; the run completes
//! with every sample of every epoch trained once.

use std::time::Duration;

use serde_json::Value;

mod support;

use support::launched::{
    Launched, Result, accuracy, audit, in_process, kill9, records, summary, trains_as_well,
};

/// Epochs of the job.
const EPOCHS: usize = 8;
/// The job's flags: every rank slowed so an epoch lasts a second or two.
const JOB: [&str; 16] = [
    "--backend",
    "host",
    "--policy",
    "cadence",
    "--train-subset",
    "8192",
    "--test-subset",
    "1000",
    "--epochs",
    "8",
    "--hidden",
    "64",
    "--slowdown",
    "20,20,20",
    "--watchdog",
    "10",
];

/// Every epoch recorded, and `fdl audit` finds each of its samples in the final model exactly
/// once.
fn check_coverage(dir: &std::path::Path) -> Result<Vec<Value>> {
    let epochs = records(dir, "epoch")?;
    if epochs.len() != EPOCHS {
        return Err(format!("{} epochs recorded, {EPOCHS} expected", epochs.len()).into());
    }
    let report = audit(dir, None)?;
    println!("{report}");
    Ok(epochs)
}

/// `kill -9` of rank 2's process mid-run under `--max-restarts 1`: the launcher restarts it, it
/// rejoins at a reduce and trains (its windows after the rejoin have steps), every epoch trains
/// every sample once, and the accuracy is in the band of the clean in-process run.
#[test]
fn a_killed_rank_process_is_restarted_and_rejoins() -> Result {
    let tmp = tempfile::tempdir()?;
    let clean = tmp.path().join("clean");
    let flags: Vec<&str> = JOB.iter().copied().filter(|f| !f.contains("20,20")).collect();
    let flags: Vec<&str> = flags.into_iter().filter(|f| *f != "--slowdown").collect();
    in_process(&flags, &clean)?;
    let dir = tmp.path().join("rejoined");
    let mut job = Launched::start_with(3, &["--max-restarts", "1"], &JOB, &dir, &[])?;
    job.wait_for("epoch 1/8", Duration::from_secs(90))?;
    kill9(job.pids[2])?;
    job.wait_for("[launch] restarting rank 2 (restart 1 of at most 1)", Duration::from_secs(20))?;
    job.wait_for("rank 2 rejoined at reduce", Duration::from_secs(90))?;
    let (code, out) = job.finish(Duration::from_secs(180))?;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("rank 2 was killed by signal 9"), "{out}");
    assert!(out.contains("[launch] rank 2 exited with 0"), "the restarted rank: {out}");
    let s = summary(&dir)?;
    let faults = s["faults"].as_array().ok_or("no faults")?;
    let rejoins = s["rejoins"].as_array().ok_or("no rejoins")?;
    assert_eq!((faults.len(), rejoins.len()), (1, 1), "{s}");
    assert_eq!((faults[0]["rank"].as_u64(), rejoins[0]["rank"].as_u64()), (Some(2), Some(2)));
    assert_eq!(rejoins[0]["members"], serde_json::json!([0, 1, 2]));
    check_coverage(&dir)?;
    // Its windows after the rejoin: rank 2 trained in reduces after it was admitted.
    let back = rejoins[0]["at_ms"].as_f64().ok_or("no rejoin time")?;
    let trained_after: u64 = records(&dir, "reduce")?
        .iter()
        .filter(|r| r["at_ms"].as_f64().is_some_and(|t| t > back))
        .filter_map(|r| r["steps"].get(2).and_then(Value::as_u64))
        .sum();
    assert!(trained_after > 0, "rank 2 trained nothing after its rejoin");
    let (a, c) = (accuracy(&clean)?, accuracy(&dir)?);
    trains_as_well("clean against with a rejoin", a, c, 0.8)?;
    Ok(())
}

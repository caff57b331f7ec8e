//! The hostile-member test: one process of a launched job, holding its real rank key, attacks
//! the controller over the real link (the hidden attacker mode, `FLODL_HOSTILE=2:ATTACK`), one
//! attack per job. Each attack evicts the attacker only, with a fault naming it and its
//! misconduct; the honest ranks finish with every sample of every epoch trained once and the
//! accuracy of a clean run.

use std::path::Path;
use std::time::{Duration, Instant};

mod support;

use support::launched::{Launched, Result, in_process, records, summary, trains_as_well};

/// Training samples and epochs of each job.
const TRAIN: usize = 4096;
const EPOCHS: usize = 2;
/// The jobs' flags: small, so nine jobs and a clean run cost a CI step little.
const JOB: [&str; 14] = [
    "--backend",
    "host",
    "--policy",
    "cadence",
    "--train-subset",
    "4096",
    "--test-subset",
    "500",
    "--epochs",
    "2",
    "--hidden",
    "32",
    "--watchdog",
    "10",
];
/// Jobs run at once.
const AT_ONCE: usize = 3;

/// Each attack of rank 2, and the misconduct the controller's fault must name.
const ATTACKS: [(&str, &str); 9] = [
    ("start-state", "StartState"),
    ("steps", "StepsBeyondDispatch"),
    ("nan-snapshot", "NonFinite"),
    ("inf-snapshot", "NonFinite"),
    ("misshaped-snapshot", "Misshaped"),
    ("unsolicited-eval", "Unsolicited"),
    ("unsolicited-group-id", "Unsolicited"),
    ("replay", "Replayed"),
    ("flood", "Flooded"),
];

/// One attack's job: rank 2 evicted for `misconduct` and nobody else, every epoch's samples
/// trained once; the job's accuracy.
fn attacked(attack: &str, misconduct: &str, dir: &Path) -> Result<f64> {
    let hostile = format!("2:{attack}");
    let job = Launched::start_with(3, &[], &JOB, dir, &[("FLODL_HOSTILE", &hostile)])?;
    let (code, out) = job.finish(Duration::from_secs(240))?;
    let tail: String = out.lines().rev().take(40).collect::<Vec<_>>().join("\n");
    if code != Some(0) {
        return Err(format!("{attack}: the job exited with {code:?}:\n{tail}").into());
    }
    let s = summary(dir)?;
    let faults = s["faults"].as_array().ok_or("no faults")?;
    let evicted: Vec<(Option<u64>, String)> =
        faults.iter().map(|f| (f["rank"].as_u64(), f["cause"].to_string())).collect();
    let named = evicted.len() == 1
        && evicted[0].0 == Some(2)
        && evicted[0].1.contains("Misconduct")
        && evicted[0].1.contains(misconduct);
    if !named {
        return Err(
            format!("{attack}: faults {evicted:?}, expected rank 2 for {misconduct}").into()
        );
    }
    let epochs = records(dir, "epoch")?;
    if epochs.len() != EPOCHS {
        return Err(format!("{attack}: {} epochs recorded", epochs.len()).into());
    }
    let per_epoch = (TRAIN / 64) * 64;
    for e in &epochs {
        if e["samples"].as_u64() != Some(per_epoch as u64) {
            return Err(format!("{attack}: an epoch's coverage is not exactly once: {e}").into());
        }
    }
    Ok(s["test"]["accuracy"].as_f64().ok_or("no test accuracy")?)
}

/// Every attack of the list, three jobs at a time: each evicts only the attacker and the
/// survivors train as well as the clean run of the same flags.
#[test]
fn a_hostile_member_is_evicted_and_the_job_trains_on() -> Result {
    let started = Instant::now();
    let tmp = tempfile::tempdir()?;
    let clean = in_process(&JOB, &tmp.path().join("clean"))?;
    let mut failures = Vec::new();
    for batch in ATTACKS.chunks(AT_ONCE) {
        let results: Vec<(&str, std::result::Result<f64, String>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .map(|&(attack, misconduct)| {
                    let dir = tmp.path().join(attack);
                    scope.spawn(move || {
                        (attack, attacked(attack, misconduct, &dir).map_err(|e| e.to_string()))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| ("?", Err("panicked".into()))))
                .collect()
        });
        for (attack, r) in results {
            let r = r.and_then(|acc| {
                trains_as_well(attack, clean, acc, 0.5).map(|()| acc).map_err(|e| e.to_string())
            });
            match r {
                Ok(acc) => {
                    eprintln!("{attack}: evicted rank 2; accuracy {acc:.3} (clean {clean:.3})")
                }
                Err(e) => failures.push(format!("{attack}: {e}")),
            }
        }
    }
    eprintln!("{} attacks in {:?}", ATTACKS.len(), started.elapsed());
    if failures.is_empty() { Ok(()) } else { Err(failures.join("\n").into()) }
}

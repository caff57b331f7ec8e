//! Throughput of one MNIST job run two ways, side by side (the bench examples): 2 in-process
//! ranks against 2 rank processes, under `Cadence` and `Async`, one markdown row per policy.
//! Throughput is samples trained / training wall time, from each run's summary.json.

use std::path::Path;
use std::process::Command;

pub(crate) use crate::bench_kit::Result;
use crate::bench_kit::fdl;

/// Samples per second of training of the run in `dir`, and its test accuracy.
fn throughput(dir: &Path) -> Result<(f64, f64)> {
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json"))?)?;
    let wall = s["train_wall_s"].as_f64().ok_or("no train_wall_s")?;
    let samples: f64 =
        s["ranks"].as_array().ok_or("no ranks")?.iter().filter_map(|r| r["samples"].as_f64()).sum();
    let acc = s["test"]["accuracy"].as_f64().unwrap_or(f64::NAN);
    Ok((samples / wall, acc))
}

/// Runs the workload (MLP 784-256-128-10, batch 64, 5 epochs, rank 1 slowed 2.5x) on `backend`
/// as `fdl train --ranks 2` and as `fdl PROCESSES` (named `label` in the table), each policy,
/// with the example's own arguments appended, and prints the table.
pub(crate) fn compare(backend: &str, processes: &[&str], label: &str) -> Result {
    let fdl = fdl()?;
    let extra: Vec<String> = std::env::args().skip(1).collect();
    let tmp = tempfile::tempdir()?;
    let common =
        ["--backend", backend, "--epochs", "5", "--batch-size", "64", "--slowdown", "1,2.5"];
    println!(
        "| policy | in-process samples/s | {label} samples/s | ratio | accuracy (in-process / {label}) |"
    );
    println!("|---|---|---|---|---|");
    for policy in ["cadence", "async"] {
        let mut figures = Vec::new();
        for (mode, args) in [("alone", &["train", "--ranks", "2"][..]), ("processes", processes)] {
            let out = tmp.path().join(format!("{policy}-{mode}"));
            let run = Command::new(&fdl)
                .args(args)
                .args(["--policy", policy, "--quiet"])
                .args(common)
                .args(&extra)
                .arg("--out")
                .arg(&out)
                .output()?;
            if !run.status.success() {
                return Err(format!(
                    "{policy} {mode}: fdl {}: {}\n{}",
                    run.status,
                    String::from_utf8_lossy(&run.stdout),
                    String::from_utf8_lossy(&run.stderr)
                )
                .into());
            }
            figures.push(throughput(&out)?);
        }
        let ((a, acc_a), (p, acc_p)) = (figures[0], figures[1]);
        println!("| {policy} | {a:.0} | {p:.0} | {:.3} | {acc_a:.4} / {acc_p:.4} |", p / a);
    }
    Ok(())
}

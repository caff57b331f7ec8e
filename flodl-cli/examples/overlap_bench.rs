//! The exchange overlapped with compute, side by side in one invocation: the same job of 3
//! rank processes (`fdl launch --nproc 3`, host backend, `Cadence`, MLP 784-4096-4096-10: 20M
//! parameters) in f32 and q4, each without and with `--overlap`, and q4 with the parameters in
//! 4 fragments synced in turn (`--fragments 4`) without and with `--overlap`, one markdown row
//! each: the aggregate rate (samples per second of training wall), the bytes a remote rank's
//! connection carried per reduce (its snapshot plus its update), the remote ranks' exposed
//! exchange (their time encoding and handing off snapshots) and their time in reduces (waiting
//! for the consensus and merging it), the final training loss and test accuracy at equal
//! samples, and the reduces.
//!
//! ```text
//! cargo build --release -p flodl-cli --bin fdl --example overlap_bench
//! target/release/examples/overlap_bench [EXTRA FDL FLAGS...]
//! ```
//! A harness run, not a timed test: the figures are those of the machine at the time.

mod bench_kit;

use std::process::Command;

use bench_kit::{BIG_MLP, Result, fdl};

/// Training samples of the job (one epoch).
const SAMPLES: f64 = 6144.0;

fn main() -> Result {
    let fdl = fdl()?;
    let extra: Vec<String> = std::env::args().skip(1).collect();
    let tmp = tempfile::tempdir()?;
    // After the 20M-parameter job's flags (`BIG_MLP`).
    let common =
        ["--train-subset", "6144", "--test-subset", "1000", "--epochs", "1", "--batch-size", "64"];
    println!(
        "| wire | overlap | fragments | samples/s | KB per reduce (rank 1) | exposed exchange (ms, \
         ranks 1+2) | in reduces (ms, ranks 1+2) | final train loss | test accuracy | reduces | \
         wall (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let rows = [
        ("f32", false, 1),
        ("f32", true, 1),
        ("q4", false, 1),
        ("q4", true, 1),
        ("q4", false, 4),
        ("q4", true, 4),
    ];
    for (wire, overlap, fragments) in rows {
        let out = tmp.path().join(format!("{wire}-{overlap}-{fragments}"));
        let mut cmd = Command::new(&fdl);
        cmd.args(["launch", "--nproc", "3", "--quiet", "--wire", wire]).args(BIG_MLP).args(common);
        if overlap {
            cmd.arg("--overlap");
        }
        cmd.args(["--fragments", &fragments.to_string()]);
        let run = cmd.args(&extra).arg("--out").arg(&out).output()?;
        if !run.status.success() {
            return Err(format!("{wire}: {}", String::from_utf8_lossy(&run.stderr)).into());
        }
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json"))?)?;
        let ranks = s["ranks"].as_array().ok_or("no ranks")?;
        let remote = |key: &str| -> f64 {
            ranks.iter().skip(1).filter_map(|r| r["time"][key].as_f64()).sum()
        };
        let wire_of = |key: &str| s["ranks"][1]["wire"][key].as_f64().unwrap_or(f64::NAN);
        let bytes = wire_of("sent_per_reduce") + wire_of("received_per_reduce");
        let wall = s["train_wall_s"].as_f64().unwrap_or(f64::NAN);
        println!(
            "| {wire} | {} | {fragments} | {:.0} | {:.0} | {:.0} | {:.0} | {:.4} | {:.3} | {} | \
             {wall:.1} |",
            if overlap { "on" } else { "off" },
            SAMPLES / wall,
            bytes / 1000.0,
            remote("exchange_ms"),
            remote("reduce_ms"),
            s["final_train_loss"].as_f64().unwrap_or(f64::NAN),
            s["test"]["accuracy"].as_f64().unwrap_or(f64::NAN),
            s["syncs"],
        );
    }
    Ok(())
}

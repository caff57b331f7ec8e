//! The wire formats side by side in one invocation: the same job of 3 rank processes
//! (`fdl launch --nproc 3`, host backend, `Cadence`) in f32, bf16, int8 and q4, one markdown row
//! each: the bytes of a remote rank's snapshot and of its consensus update per reduce (as the
//! controller's end of its connection counted them), their ratio to f32, the final training
//! loss, test loss and test accuracy at equal samples (every sample once per epoch), the
//! reduces, and the remote ranks' exposed exchange.
//!
//! The job: the MLP 784-4096-4096-10 (20M parameters) on 6,144 MNIST images, or with `--gpt` the
//! candle transformer `gpt-tiny` (0.83M parameters) on 768 windows of Shakespeare, evaluated on
//! 128 held-out windows (its test loss in nats per byte; no accuracy).
//!
//! ```text
//! cargo build --release -p flodl-cli --bin fdl --example wire_bench
//! target/release/examples/wire_bench [--gpt] [EXTRA FDL FLAGS...]
//! ```
//! Bytes and loss are the figures; the wall times are for orientation only.

mod bench_kit;

use std::process::Command;

use bench_kit::{BIG_MLP, Result, fdl};

fn main() -> Result {
    let fdl = fdl()?;
    let mut extra: Vec<String> = std::env::args().skip(1).collect();
    let gpt = extra.first().is_some_and(|a| a == "--gpt");
    if gpt {
        extra.remove(0);
    }
    let tmp = tempfile::tempdir()?;
    let job: Vec<&str> = if gpt {
        // A rank silent this long is declared dead: a rank's start (the corpus checked and cut)
        // outlasts the default 30 s on a loaded machine.
        vec![
            "--model",
            "gpt-tiny",
            "--backend",
            "host",
            "--policy",
            "cadence",
            "--train-subset",
            "768",
            "--test-subset",
            "128",
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--lr",
            "0.003",
            "--schedule",
            "cosine",
            "--warmup-epochs",
            "0.1",
            "--watchdog",
            "120",
        ]
    } else {
        let data = [
            "--train-subset",
            "6144",
            "--test-subset",
            "1000",
            "--epochs",
            "1",
            "--batch-size",
            "64",
        ];
        BIG_MLP.iter().chain(&data).copied().collect()
    };
    println!(
        "| wire | snapshot bytes/reduce | update bytes/reduce | × f32 | final train loss | \
         test loss | test accuracy | reduces | exposed exchange (ms, ranks 1+2) | wall (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut f32_bytes = None;
    for wire in ["f32", "bf16", "int8", "q4"] {
        let out = tmp.path().join(wire);
        let run = Command::new(&fdl)
            .args(["launch", "--nproc", "3", "--quiet", "--wire", wire])
            .args(&job)
            .args(&extra)
            .arg("--out")
            .arg(&out)
            .output()?;
        if !run.status.success() {
            return Err(format!("{wire}: {}", String::from_utf8_lossy(&run.stderr)).into());
        }
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json"))?)?;
        let ranks = s["ranks"].as_array().ok_or("no ranks")?;
        let w = &ranks.get(1).ok_or("no rank 1")?["wire"];
        let (sent, received) = (
            w["sent_per_reduce"].as_f64().unwrap_or(f64::NAN),
            w["received_per_reduce"].as_f64().unwrap_or(f64::NAN),
        );
        let base = *f32_bytes.get_or_insert(sent);
        let exposed: f64 =
            ranks.iter().skip(1).filter_map(|r| r["time"]["exchange_ms"].as_f64()).sum();
        println!(
            "| {wire} | {sent:.0} | {received:.0} | {:.4} | {:.4} | {:.4} | {:.3} | {} | \
             {exposed:.0} | {:.1} |",
            sent / base,
            s["final_train_loss"].as_f64().unwrap_or(f64::NAN),
            s["test"]["loss"].as_f64().unwrap_or(f64::NAN),
            s["test"]["accuracy"].as_f64().unwrap_or(f64::NAN),
            s["syncs"],
            s["train_wall_s"].as_f64().unwrap_or(f64::NAN),
        );
    }
    Ok(())
}

//! The transformer as rank processes: `fdl launch --nproc 2 --max-restarts 1 ... --model
//! gpt-tiny` (Cadence, rank 1 at half speed) with rank 1's process killed after the first reduce.
//! The launcher restarts it, it rejoins at a reduce, every epoch trains every window once, and
//! the validation loss ends below the entropy of the predicted bytes' frequencies (the best a
//! model that ignores context can do), computed here from the same validation slice.
//! CI: 96 steps of 8 windows of the 0.83M model, 2 ranks. A run of 144 steps took 404 s on the
//! 2-core development machine at load 13 (110 s of CPU); this one about two thirds of that.

use std::time::Duration;

use flodl_data::{Dataset, Shakespeare, Subset, TextSplit, unigram_entropy};
use serde_json::Value;

mod support;

use support::launched::{Launched, Result, kill9, records, summary};

/// Training windows, batch, epochs, validation windows: 32 steps an epoch across the ranks.
const TRAIN: usize = 256;
const BATCH: usize = 8;
const EPOCHS: usize = 3;
const VALID: usize = 64;
/// The tiny model's context, bytes.
const CONTEXT: usize = 64;

/// Entropy (nats) of the byte frequencies of the validation bytes the run predicts: the first
/// [`VALID`] windows of the held-out plays, each predicting its last [`CONTEXT`] bytes.
fn unigram_bound() -> Result<f64> {
    let valid = Subset::first(Shakespeare::vendored(TextSplit::Valid)?.windows(CONTEXT)?, VALID);
    let targets: Vec<u8> = (0..valid.len())
        .filter_map(|i| valid.inner().window(i))
        .flat_map(|w| &w[1..])
        .copied()
        .collect();
    if targets.len() != VALID * CONTEXT {
        return Err(format!("{} validation bytes", targets.len()).into());
    }
    Ok(unigram_entropy(&targets).nats)
}

/// Waits until the run in `dir` has written its first reduce record (`metrics.jsonl` is flushed
/// record by record).
fn first_reduce(dir: &std::path::Path, wait: Duration) -> Result {
    let deadline = std::time::Instant::now() + wait;
    while std::time::Instant::now() < deadline {
        if records(dir, "reduce").is_ok_and(|r| !r.is_empty()) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("no reduce within {wait:?}").into())
}

#[test]
fn a_launched_transformer_survives_a_killed_rank_and_learns_context() -> Result {
    let bound = unigram_bound()?;
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("gpt");
    let (train, valid, epochs, batch) =
        (TRAIN.to_string(), VALID.to_string(), EPOCHS.to_string(), BATCH.to_string());
    let job = [
        "--model",
        "gpt-tiny",
        "--backend",
        "host",
        "--policy",
        "cadence",
        "--train-subset",
        &train,
        "--test-subset",
        &valid,
        "--epochs",
        &epochs,
        "--batch-size",
        &batch,
        "--lr",
        "0.003",
        "--schedule",
        "cosine",
        "--warmup-epochs",
        "0.1",
        "--slowdown",
        "1,2",
        "--seed",
        "5",
        // A rank silent this long is declared dead: a step of the slowed rank on a loaded
        // machine, and a rank's start (the corpus checked and cut), outlast the default 30 s.
        "--watchdog",
        "120",
    ];
    let mut job = Launched::start_with(2, &["--max-restarts", "1"], &job, &dir, &[])?;
    // Killed after the first reduce: an epoch's line comes at a reduce's end, and the cadence
    // spaces reduces so far apart (4 in the run) that, on an idle machine, the first epoch's line
    // came with 86 of the 96 steps done and the restarted rank found no work left.
    first_reduce(&dir, Duration::from_secs(300))?;
    kill9(job.pids[1])?;
    job.wait_for("[launch] restarting rank 1 (restart 1 of at most 1)", Duration::from_secs(60))?;
    job.wait_for("rank 1 rejoined at reduce", Duration::from_secs(300))?;
    let (code, out) = job.finish(Duration::from_secs(600))?;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("rank 1 was killed by signal 9"), "{out}");
    assert!(out.contains("[launch] rank 1 exited with 0"), "the restarted rank: {out}");
    let s = summary(&dir)?;
    let faults = s["faults"].as_array().ok_or("no faults")?;
    let rejoins = s["rejoins"].as_array().ok_or("no rejoins")?;
    assert_eq!((faults.len(), rejoins.len()), (1, 1), "{s}");
    assert_eq!((faults[0]["rank"].as_u64(), rejoins[0]["rank"].as_u64()), (Some(1), Some(1)));
    // Every epoch trained each of its windows exactly once.
    let epochs = records(&dir, "epoch")?;
    assert_eq!(epochs.len(), EPOCHS, "{epochs:?}");
    for e in &epochs {
        assert_eq!(e["samples"].as_u64(), Some(((TRAIN / BATCH) * BATCH) as u64), "{e}");
    }
    // Rank 1 trained in reduces after it was admitted again.
    let back = rejoins[0]["at_ms"].as_f64().ok_or("no rejoin time")?;
    let reduces = records(&dir, "reduce")?;
    let timeline: Vec<String> =
        reduces.iter().map(|r| format!("{}ms {}", r["at_ms"], r["steps"])).collect();
    println!("killed at {:?} ms, rejoined at {back} ms; reduces: {timeline:?}", faults[0]["at_ms"]);
    let trained_after: u64 = reduces
        .iter()
        .filter(|r| r["at_ms"].as_f64().is_some_and(|t| t > back))
        .filter_map(|r| r["steps"].get(1).and_then(Value::as_u64))
        .sum();
    assert!(
        trained_after > 0,
        "rank 1 trained nothing after its rejoin at {back} ms; reduces (at, steps): {timeline:?}"
    );
    let test = &s["test"];
    let loss = test["loss"].as_f64().ok_or("no validation loss")?;
    assert_eq!(test["samples"].as_u64(), Some((VALID * CONTEXT) as u64), "{test}");
    println!(
        "launched gpt-tiny: validation {loss:.4} nats/byte against the unigram bound {bound:.4} \
         ({} validation bytes)",
        VALID * CONTEXT
    );
    assert!(loss < bound, "validation loss {loss} not below the unigram bound {bound}");
    Ok(())
}

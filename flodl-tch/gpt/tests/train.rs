//! CI's check of the tch transformer under flodl: the tiny model (~0.83M parameters) on two CPU
//! ranks, the second 2.5× slower, Cadence, on the first 1,600 training windows of 65 bytes
//! (104 KB of the training plays) for 2 epochs of batches of 16 (200 batches), evaluated on 256
//! held-out windows. It must beat the unigram-entropy bound of the validation targets (the loss
//! floor of a model predicting byte frequencies alone), train every window exactly once per
//! epoch, and, in a second run, survive the death of rank 1.

use std::sync::{Arc, Mutex};

use flodl_ddp::SampleAudit;
use flodl_tch_gpt::train::{Settings, train};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const WINDOWS: usize = 1600;
const EPOCHS: usize = 2;

/// Every rank's picks: `[rank][epoch][window]` counts.
type Seen = Arc<Mutex<Vec<Vec<Vec<u32>>>>>;

/// The picks and the audit that fills them.
fn audit() -> (Seen, SampleAudit) {
    let seen = Arc::new(Mutex::new(vec![vec![vec![0u32; WINDOWS]; EPOCHS]; 2]));
    let log = seen.clone();
    let audit: SampleAudit = Arc::new(move |rank, epoch, picks: &[usize]| {
        let mut s = log.lock().unwrap_or_else(|e| e.into_inner());
        for &p in picks {
            s[rank][epoch][p] += 1;
        }
    });
    (seen, audit)
}

fn settings(audit: SampleAudit) -> Settings {
    Settings {
        train_windows: Some(WINDOWS),
        valid_windows: Some(256),
        epochs: EPOCHS,
        audit: Some(audit),
        ..Settings::tiny()
    }
}

/// How many times the ranks together trained each window in `epoch`.
fn counts(seen: &[Vec<Vec<u32>>], epoch: usize) -> Vec<u32> {
    (0..WINDOWS).map(|w| seen.iter().map(|r| r[epoch][w]).sum()).collect()
}

#[test]
fn learns_below_the_unigram_bound_and_trains_every_window_once() -> TestResult {
    let (seen, audit) = audit();
    let out = train(&settings(audit))?;
    println!("{out:?}");
    assert!(out.faults.is_empty(), "{:?}", out.faults);
    assert!(
        out.valid_loss < out.unigram_bound,
        "validation {} nats/byte, unigram bound {}",
        out.valid_loss,
        out.unigram_bound
    );
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    for epoch in 0..EPOCHS {
        let c = counts(&seen, epoch);
        assert!(c.iter().all(|&n| n == 1), "epoch {epoch}: counts {:?}", &c[..16]);
        for (rank, r) in seen.iter().enumerate() {
            assert!(r[epoch].iter().any(|&n| n > 0), "rank {rank} trained nothing in {epoch}");
        }
    }
    Ok(())
}

#[test]
fn survives_the_death_of_the_slow_rank() -> TestResult {
    let (seen, audit) = audit();
    // Rank 1 fails at its 10th batch, inside the first epoch.
    let out = train(&Settings { fail: Some((1, 10)), ..settings(audit) })?;
    println!("{out:?}");
    match out.faults.as_slice() {
        [f] if f.rank == 1 && f.survivors == [0] => {}
        other => panic!("expected rank 1's death, rank 0 surviving: {other:?}"),
    }
    assert!(out.valid_loss.is_finite() && out.valid_loss < out.unigram_bound, "{out:?}");
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    // The first epoch: every window trained, none twice by the survivor; the second, the
    // survivor alone trains every window exactly once.
    let first = counts(&seen, 0);
    assert!(first.iter().all(|&n| n >= 1), "epoch 0 left windows out");
    assert!(seen[0][0].iter().all(|&n| n <= 1), "the survivor trained a window twice");
    assert!(seen[1][1].iter().all(|&n| n == 0), "the dead rank trained epoch 1");
    assert!(seen[0][1].iter().all(|&n| n == 1), "epoch 1 after the death");
    Ok(())
}

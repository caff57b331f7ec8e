//! A simulated coordinator drives the epoch stream: random ranks, skews, batch sizes, completion
//! orders, deaths and checkpoints; every sample is trained exactly once per epoch.

use std::collections::VecDeque;

use flodl_ddp::{
    Chunk, ChunkSizing, ElChe, EpochStream, LogicError, Speeds, StreamCoverage, Tail, Verdict,
};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn epochs_finish_in_order_and_streaming_respects_lookahead() -> TestResult {
    // 2 epochs of 4 batches of 2, two ranks, lookahead 1.
    let mut s = EpochStream::new(2, 8, 2, 2, Tail::Drop, 1)?;
    let a = s.next_chunk(0, |_| 4)?.ok_or("empty")?;
    assert_eq!(a, Chunk { epoch: 0, offset: 0, len: 8 });
    // Epoch 0 is handed out: rank 1 streams into epoch 1.
    let b = s.next_chunk(1, |_| 4)?.ok_or("empty")?;
    assert_eq!(b, Chunk { epoch: 1, offset: 0, len: 8 });
    assert_eq!(s.next_chunk(1, |_| 4)?, None);
    // Epoch 1 finishes first but is only reported after epoch 0.
    s.credit(1, &b)?;
    assert_eq!(s.pop_finished()?, None);
    s.credit(0, &a)?;
    assert_eq!(s.pop_finished()?.map(|c| c.epoch), Some(0));
    assert_eq!(s.pop_finished()?.map(|c| c.epoch), Some(1));
    assert!(s.is_finished());
    assert_eq!(s.next_chunk(0, |_| 4)?, None);
    // Lookahead 0 is an epoch barrier.
    let mut barrier = EpochStream::new(2, 8, 2, 2, Tail::Drop, 0)?;
    barrier.next_chunk(0, |_| 4)?;
    assert_eq!(barrier.next_chunk(1, |_| 4)?, None);
    assert!(matches!(barrier.next_chunk(2, |_| 1), Err(LogicError::RankOutOfRange { .. })));
    Ok(())
}

#[test]
fn resume_rejects_foreign_coverage() -> TestResult {
    let mut s = EpochStream::new(3, 64, 4, 2, Tail::Drop, 1)?;
    s.next_chunk(0, |_| 2)?;
    let cov = s.coverage();
    assert!(EpochStream::resume(&cov, 3, 64, 4, 2, Tail::Drop, 1).is_ok());
    let other_size = EpochStream::resume(&cov, 3, 128, 4, 2, Tail::Drop, 1);
    assert!(matches!(other_size, Err(LogicError::InvalidCoverage { .. })));
    Ok(())
}

/// One simulated run; returns how many times each (epoch, position) was trained.
struct Run {
    world: usize,
    epochs: usize,
    samples: usize,
    bs: usize,
    tail: Tail,
    lookahead: usize,
    speeds: Vec<f64>,
    deaths: bool,
    checkpoint: bool,
}

fn simulate(
    run: &Run,
    rng: &mut Xoshiro256PlusPlus,
) -> Result<Vec<Vec<u32>>, Box<dyn std::error::Error>> {
    let w = run.world;
    let mut stream = EpochStream::new(run.epochs, run.samples, run.bs, w, run.tail, run.lookahead)?;
    let mut elche = ElChe::new(w, 4)?;
    let sizing = ChunkSizing::default();
    let mut seen = vec![vec![0u32; run.samples]; run.epochs];
    // Per rank: queued chunks with their finish times, and the time the rank is free.
    let mut queue: Vec<VecDeque<(Chunk, f64)>> = vec![VecDeque::new(); w];
    let mut free_at = vec![0.0f64; w];
    let mut alive = vec![true; w];
    let (mut wall, mut steps) = (vec![0.0; w], vec![0u64; w]);
    let mut next_epoch = 0;
    let mut checkpointed = false;
    for _ in 0..200_000 {
        if stream.is_finished() {
            return Ok(seen);
        }
        // Keep every live rank fed with up to two chunks.
        for r in (0..w).filter(|&r| alive[r]) {
            while queue[r].len() < 2 {
                let ms = elche.ms_per_batch();
                let speeds = Speeds {
                    counts: elche.counts(),
                    ms_per_batch: &ms,
                    informed: elche.is_calibrated(),
                };
                let oldest = stream.oldest();
                let Some(c) = stream.next_chunk(r, |pool| sizing.batches(r, pool, &speeds))? else {
                    break;
                };
                assert!(c.epoch <= oldest + run.lookahead, "chunk past the lookahead");
                let cost: f64 = (0..c.batches(run.bs))
                    .map(|_| run.speeds[r] * (1.0 + rng.random_range(-0.2..0.2)))
                    .sum();
                let start = queue[r].back().map_or(free_at[r], |&(_, t)| t);
                queue[r].push_back((c, start + cost));
            }
        }
        // Complete the earliest chunk (random order among near-ties).
        let next = (0..w)
            .filter_map(|r| queue[r].front().map(|&(_, t)| (r, t + rng.random_range(0.0..0.5))))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let Some((r, _)) = next else {
            return Err("no work in flight but the run is unfinished".into());
        };
        let (c, t) = queue[r].pop_front().ok_or("empty queue")?;
        stream.credit(r, &c)?;
        free_at[r] = t;
        wall[r] += run.speeds[r] * c.batches(run.bs) as f64;
        steps[r] += c.batches(run.bs) as u64;
        for (p, n) in seen[c.epoch].iter_mut().enumerate().take(c.end()).skip(c.offset) {
            *n += 1;
            assert_eq!(*n, 1, "epoch {} position {p} trained twice", c.epoch);
        }
        while let Some(cov) = stream.pop_finished()? {
            assert_eq!(cov.epoch, next_epoch, "epochs finish in order");
            next_epoch += 1;
        }
        // A reduce now and then feeds ElChe.
        if steps.iter().zip(&alive).all(|(&s, &a)| !a || s > 0) && rng.random_bool(0.3) {
            elche.report_timing(&wall, &steps, 1.0)?;
            elche.apply_verdict(Verdict::Stable);
            wall.iter_mut().for_each(|x| *x = 0.0);
            steps.iter_mut().for_each(|x| *x = 0);
        }
        // A death: the rank's queued work returns to the pools.
        let live = alive.iter().filter(|&&a| a).count();
        if run.deaths && live > 1 && rng.random_bool(0.01) {
            let victim =
                (0..w).filter(|&r| alive[r]).nth(rng.random_range(0..live)).ok_or("no rank")?;
            alive[victim] = false;
            let back = stream.retire(victim)?;
            assert_eq!(back.len(), queue[victim].len());
            queue[victim].clear();
            elche.retire(victim)?;
        }
        // A checkpoint at a quiet moment: serialise, resume, carry on.
        if run.checkpoint && !checkpointed && queue.iter().all(VecDeque::is_empty) {
            let json = serde_json::to_string(&stream.coverage())?;
            let cov: StreamCoverage = serde_json::from_str(&json)?;
            stream = EpochStream::resume(
                &cov,
                run.epochs,
                run.samples,
                run.bs,
                w,
                run.tail,
                run.lookahead,
            )?;
            for r in (0..w).filter(|&r| !alive[r]) {
                stream.retire(r)?;
            }
            checkpointed = true;
        }
    }
    Err("simulation did not finish".into())
}

#[test]
fn every_sample_exactly_once_per_epoch_under_skew() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(2026);
    for case in 0..150 {
        let world = rng.random_range(1..9usize);
        let run = Run {
            world,
            epochs: rng.random_range(1..4),
            samples: rng.random_range(0..3000),
            bs: rng.random_range(1..65),
            tail: if rng.random_bool(0.5) { Tail::Keep } else { Tail::Drop },
            lookahead: rng.random_range(0..3),
            speeds: (0..world).map(|_| rng.random_range(1.0..8.0)).collect(),
            deaths: rng.random_bool(0.5),
            checkpoint: rng.random_bool(0.5),
        };
        let seen = simulate(&run, &mut rng)?;
        let total = run.tail.total(run.samples, run.bs);
        for (e, epoch) in seen.iter().enumerate() {
            for (p, &n) in epoch.iter().enumerate() {
                let want = u32::from(p < total);
                assert_eq!(
                    n, want,
                    "case {case} epoch {e} position {p}: {n} (tail {:?})",
                    run.tail
                );
            }
        }
    }
    Ok(())
}

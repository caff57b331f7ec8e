//! The per-epoch chunk pool: hand-computed cases and randomized exactly-once checks.

use flodl_ddp::{Chunk, ChunkPool, Coverage, LogicError, Tail};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn chunk(offset: usize, len: usize) -> Chunk {
    Chunk { epoch: 3, offset, len }
}

#[test]
fn take_and_credit_by_hand() -> TestResult {
    // 100 samples, batch 8, tail dropped: 96 positions.
    let mut pool = ChunkPool::new(3, 100, 8, 2, Tail::Drop)?;
    assert_eq!((pool.total(), pool.remaining_batches()), (96, 12));
    assert_eq!(pool.take(0, 4)?, Some(chunk(0, 32)));
    // 10 batches = 80 > 64 left: the rest.
    assert_eq!(pool.take(1, 10)?, Some(chunk(32, 64)));
    assert_eq!(pool.take(0, 1)?, None);
    assert!(pool.is_exhausted() && !pool.is_done());
    assert_eq!((pool.in_flight(0), pool.in_flight_batches(1)), (32, 8));
    pool.credit(1, &chunk(32, 64))?;
    assert!(matches!(pool.credit(1, &chunk(32, 64)), Err(LogicError::UnknownChunk { .. })));
    assert!(matches!(pool.credit(1, &chunk(0, 32)), Err(LogicError::UnknownChunk { .. })));
    pool.credit(0, &chunk(0, 32))?;
    assert!(pool.is_done());
    assert_eq!(pool.coverage().done, vec![(0, 96)]);
    Ok(())
}

#[test]
fn keep_tail_rides_on_the_last_chunk() -> TestResult {
    let cases = [
        // (samples, bs, tail, batches per take, expected chunk lengths)
        (100, 8, Tail::Keep, 12, vec![100]),
        (100, 8, Tail::Keep, 4, vec![32, 32, 36]),
        (100, 8, Tail::Drop, 4, vec![32, 32, 32]),
        (5, 8, Tail::Keep, 1, vec![5]),
        (5, 8, Tail::Drop, 1, vec![]),
    ];
    for (samples, bs, tail, per, want) in cases {
        let mut pool = ChunkPool::new(3, samples, bs, 1, tail)?;
        let mut lens = Vec::new();
        while let Some(c) = pool.take(0, per)? {
            lens.push(c.len);
        }
        assert_eq!(lens, want, "{samples} samples, bs {bs}, {tail:?}, {per} per take");
    }
    Ok(())
}

#[test]
fn retired_rank_work_is_served_first() -> TestResult {
    let mut pool = ChunkPool::new(3, 80, 4, 3, Tail::Drop)?;
    let a = pool.take(1, 2)?.ok_or("empty")?; // 0..8
    let b = pool.take(1, 3)?.ok_or("empty")?; // 8..20
    let c = pool.take(0, 1)?.ok_or("empty")?; // 20..24
    assert_eq!(pool.retire(1)?, vec![a, b]);
    assert!(matches!(pool.take(1, 1), Err(LogicError::RankRetired { rank: 1 })));
    assert!(matches!(pool.credit(1, &a), Err(LogicError::UnknownChunk { .. })));
    // Re-queued ranges come back in order, split to the requested size.
    assert_eq!(pool.take(2, 1)?, Some(chunk(0, 4)));
    assert_eq!(pool.take(0, 10)?, Some(chunk(4, 4)));
    assert_eq!(pool.take(2, 10)?, Some(chunk(8, 12)));
    assert_eq!(pool.take(2, 1)?, Some(chunk(24, 4)));
    pool.credit(0, &c)?;
    assert_eq!(pool.in_flight(1), 0);
    Ok(())
}

#[test]
fn resume_hands_out_only_uncovered_ranges() -> TestResult {
    let coverage = Coverage { epoch: 3, total: 40, done: vec![(0, 8), (16, 24), (32, 40)] };
    assert_eq!(coverage.done_len(), 24);
    let mut pool = ChunkPool::resume(&coverage, 4, 2, Tail::Drop)?;
    assert_eq!(pool.remaining(), 16);
    assert_eq!(pool.take(0, 5)?, Some(chunk(8, 8)));
    assert_eq!(pool.take(1, 5)?, Some(chunk(24, 8)));
    assert_eq!(pool.take(1, 5)?, None);
    pool.credit(1, &chunk(24, 8))?;
    pool.credit(0, &chunk(8, 8))?;
    assert!(pool.is_done());
    assert_eq!(pool.coverage().done, vec![(0, 40)]);
    let bad = [
        Coverage { epoch: 3, total: 40, done: vec![(8, 16), (0, 8)] },
        Coverage { epoch: 3, total: 40, done: vec![(0, 44)] },
        Coverage { epoch: 3, total: 40, done: vec![(2, 8)] },
        Coverage { epoch: 3, total: 40, done: vec![(8, 8)] },
    ];
    for c in bad {
        assert!(
            matches!(
                ChunkPool::resume(&c, 4, 2, Tail::Drop),
                Err(LogicError::InvalidCoverage { .. })
            ),
            "{c:?}"
        );
    }
    Ok(())
}

#[test]
fn bad_construction_is_typed() {
    assert!(matches!(
        ChunkPool::new(0, 10, 0, 1, Tail::Drop),
        Err(LogicError::InvalidValue { .. })
    ));
    assert!(matches!(
        ChunkPool::new(0, 10, 2, 0, Tail::Drop),
        Err(LogicError::WorldTooSmall { .. })
    ));
}

/// Random takes, completions in random order, retirements and a mid-epoch checkpoint/resume:
/// every position of the epoch (bar a dropped tail) is credited exactly once.
#[test]
fn every_position_exactly_once_randomized() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x5eed);
    for case in 0..400 {
        let world = rng.random_range(1..9usize);
        let bs = rng.random_range(1..17usize);
        let samples = rng.random_range(0..600usize);
        let tail = if rng.random_bool(0.5) { Tail::Keep } else { Tail::Drop };
        let mut pool = ChunkPool::new(3, samples, bs, world, tail)?;
        let mut seen = vec![0u32; samples];
        let mut held: Vec<Chunk> = Vec::new();
        let mut holder: Vec<usize> = Vec::new();
        let mut alive: Vec<usize> = (0..world).collect();
        let mut resumed = false;
        for _ in 0..10_000 {
            if pool.is_done() {
                break;
            }
            match rng.random_range(0..10) {
                0..=4 => {
                    let r = alive[rng.random_range(0..alive.len())];
                    if let Some(c) = pool.take(r, rng.random_range(0..12))? {
                        held.push(c);
                        holder.push(r);
                    }
                }
                5..=8 if !held.is_empty() => {
                    let i = rng.random_range(0..held.len());
                    let (c, r) = (held.swap_remove(i), holder.swap_remove(i));
                    pool.credit(r, &c)?;
                    for (p, n) in seen.iter_mut().enumerate().take(c.end()).skip(c.offset) {
                        *n += 1;
                        assert_eq!(*n, 1, "case {case}: position {p} twice");
                    }
                }
                9 if alive.len() > 1 && rng.random_bool(0.2) => {
                    let r = alive.swap_remove(rng.random_range(0..alive.len()));
                    let back = pool.retire(r)?;
                    let before = held.len();
                    let keep: Vec<bool> = holder.iter().map(|&h| h != r).collect();
                    let mut k = keep.iter();
                    held.retain(|_| *k.next().unwrap_or(&true));
                    holder.retain(|&h| h != r);
                    assert_eq!(before - held.len(), back.len());
                }
                9 if !resumed && held.is_empty() => {
                    // Checkpoint and resume: in-flight work would count as uncovered.
                    let cov = pool.coverage();
                    let json = serde_json::to_string(&cov)?;
                    pool = ChunkPool::resume(&serde_json::from_str(&json)?, bs, world, tail)?;
                    for &r in (0..world).collect::<Vec<_>>().iter().filter(|r| !alive.contains(r)) {
                        pool.retire(r)?;
                    }
                    resumed = true;
                }
                _ => {}
            }
        }
        assert!(pool.is_done(), "case {case}: pool never finished");
        let total = tail.total(samples, bs);
        for (p, &n) in seen.iter().enumerate() {
            assert_eq!(n, u32::from(p < total), "case {case}: position {p} ({tail:?})");
        }
    }
    Ok(())
}

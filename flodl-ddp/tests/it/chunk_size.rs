//! Chunk sizing and the epoch-tail window split against hand-computed values.

use flodl_ddp::{ChunkPool, ChunkSizing, Speeds, Tail, window_allocation};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn probe_when_uninformed() -> TestResult {
    // 6400 samples / bs 8 = 800 batches; 2 ranks: 800 / 20 = 40.
    let pool = ChunkPool::new(0, 6400, 8, 2, Tail::Drop)?;
    let speeds = Speeds { counts: &[10, 10], ms_per_batch: &[0.0, 0.0], informed: false };
    let sizing = ChunkSizing::default();
    assert_eq!(sizing.batches(0, &pool, &speeds), 40);
    // 64 batches: 64/20 = 3 -> the 4-batch floor.
    let small = ChunkPool::new(0, 512, 8, 2, Tail::Drop)?;
    assert_eq!(sizing.batches(0, &small, &speeds), 4);
    // 2 batches left: never more than remains.
    let tiny = ChunkPool::new(0, 16, 8, 2, Tail::Drop)?;
    assert_eq!(sizing.batches(1, &tiny, &speeds), 2);
    Ok(())
}

#[test]
fn proportional_with_window_cap() -> TestResult {
    // 800 batches, counts 25:10.
    let pool = ChunkPool::new(0, 6400, 8, 2, Tail::Drop)?;
    let speeds = Speeds { counts: &[25, 10], ms_per_batch: &[4.0, 10.0], informed: true };
    let uncapped = ChunkSizing { min_batches: 4, max_windows: None };
    // ceil(800*25/35) = 572, ceil(800*10/35) = 229.
    assert_eq!(uncapped.batches(0, &pool, &speeds), 572);
    assert_eq!(uncapped.batches(1, &pool, &speeds), 229);
    let capped = ChunkSizing::default();
    assert_eq!(capped.batches(0, &pool, &speeds), 50);
    assert_eq!(capped.batches(1, &pool, &speeds), 20);
    Ok(())
}

#[test]
fn tail_balance_caps_the_fast_rank() -> TestResult {
    // 40 batches in the pool; rank 1 (10 ms) takes 30, leaving 10.
    let mut pool = ChunkPool::new(0, 320, 8, 2, Tail::Drop)?;
    pool.take(1, 30)?;
    let speeds = Speeds { counts: &[25, 10], ms_per_batch: &[4.0, 10.0], informed: true };
    let sizing = ChunkSizing { min_batches: 1, max_windows: None };
    // target ceil(10*25/35) = 8; 10 < 8*2: rank 1's backlog 30*10 = 300 ms > 4 ms:
    // cap ceil(300/4) = 75, no effect.
    assert_eq!(sizing.batches(0, &pool, &speeds), 8);
    // A lighter backlog: rank 1 holds only 2 batches (20 ms) -> cap ceil(20/4) = 5.
    let mut light = ChunkPool::new(0, 96, 8, 2, Tail::Drop)?;
    light.take(1, 2)?;
    assert_eq!(sizing.batches(0, &light, &speeds), 5);
    Ok(())
}

#[test]
fn window_allocation_cases() {
    let cases: [(usize, &[usize], &[usize]); 8] = [
        (100, &[25, 10], &[25, 10]),
        (37, &[25, 10], &[25, 10]),
        // R = 1 < W: +1 on the slow rank.
        (36, &[25, 10], &[25, 11]),
        (46, &[25, 10, 10], &[25, 11, 10]),
        (47, &[25, 10, 10], &[25, 11, 11]),
        // Proportional: floors 14 and 5, remainder to the fastest.
        (20, &[25, 10], &[15, 5]),
        // Floors 1,1,1 + 1 to rank 0; lone singles move: rank 1 onto rank 2.
        (4, &[10, 10, 10], &[2, 0, 2]),
        // Retired ranks keep 0.
        (20, &[25, 0, 10], &[15, 0, 5]),
    ];
    for (rem, counts, want) in cases {
        assert_eq!(window_allocation(rem, counts), want, "rem {rem} counts {counts:?}");
    }
}

#[test]
fn window_allocation_properties() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
    for _ in 0..2000 {
        let w = rng.random_range(1..9usize);
        let counts: Vec<usize> = (0..w).map(|_| rng.random_range(0..40usize)).collect();
        let sum: usize = counts.iter().sum();
        let alive = counts.iter().filter(|&&c| c > 0).count();
        let rem = rng.random_range(0..(2 * sum + 3));
        let out = window_allocation(rem, &counts);
        let got: usize = out.iter().sum();
        for (r, (&o, &c)) in out.iter().zip(&counts).enumerate() {
            assert!(c > 0 || o == 0, "retired rank {r} got work: {counts:?} {rem} -> {out:?}");
        }
        if sum == 0 || rem >= sum + alive {
            assert_eq!(out, counts);
        } else if rem >= sum {
            assert_eq!(got, rem, "{counts:?} {rem} -> {out:?}");
        } else {
            assert_eq!(got, rem, "{counts:?} {rem} -> {out:?}");
            let holders = out.iter().filter(|&&o| o > 0).count();
            assert!(holders <= 1 || out.iter().all(|&o| o != 1), "{counts:?} {rem} -> {out:?}");
        }
    }
}

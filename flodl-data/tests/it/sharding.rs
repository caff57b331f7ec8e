//! Sharding properties: every pick exactly once per epoch across ranks, determinism from (seed, epoch).

use std::num::NonZeroUsize;

use flodl_data::{
    BatchPicks, EpochPlan, PickSpace, Result, TailPolicy, epoch_permutation, equal_partition,
    plan_batches, weighted_partition,
};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// One sharding configuration to check.
#[derive(Debug, Clone)]
struct Case {
    samples: usize,
    multiplicity: usize,
    ratios: Option<Vec<f64>>,
    world: usize,
    batch: usize,
    tail: TailPolicy,
    seed: u64,
    epoch: u64,
}

/// Builds every rank's batches for `case` and checks the coverage properties.
fn check(case: &Case) -> Result<()> {
    let space = PickSpace::new(case.samples, case.multiplicity)?;
    let perm = space.permutation(case.seed, case.epoch);
    let plans: Vec<EpochPlan> = match &case.ratios {
        Some(r) => weighted_partition(case.epoch, space.len(), r)?,
        None => equal_partition(case.epoch, space.len(), case.world)?,
    };
    let bs = NonZeroUsize::new(case.batch).unwrap_or(NonZeroUsize::MIN);
    // Times each pick is trained on (valid slots) and times it is dropped.
    let mut trained = vec![0usize; space.len()];
    let mut dropped = vec![0usize; space.len()];
    for plan in &plans {
        let batches: Vec<BatchPicks> = plan_batches(&perm, plan, bs, case.tail)?;
        let mine = plan.picks(&perm)?;
        let mut valid_seen = Vec::new();
        for (i, b) in batches.iter().enumerate() {
            assert_eq!(b.len(), case.batch, "{case:?}: every batch is full size");
            assert!(b.valid >= 1 && b.valid <= b.len());
            // Only the last batch of a plan may be padded, and padding repeats a valid pick.
            if b.is_padded() {
                assert_eq!(i, batches.len() - 1, "{case:?}");
                assert_eq!(case.tail, TailPolicy::Pad);
                assert!(b.picks[b.valid..].iter().all(|p| b.picks[..b.valid].contains(p)));
            }
            valid_seen.extend_from_slice(&b.picks[..b.valid]);
        }
        // Batches are the plan's picks in order.
        assert_eq!(valid_seen, mine[..valid_seen.len()], "{case:?}");
        let tail = mine.len() % case.batch;
        match case.tail {
            TailPolicy::Pad => assert_eq!(valid_seen.len(), mine.len()),
            TailPolicy::Drop => assert_eq!(valid_seen.len(), mine.len() - tail),
        }
        for &p in &valid_seen {
            trained[p] += 1;
        }
        for &p in &mine[valid_seen.len()..] {
            dropped[p] += 1;
        }
    }
    for p in 0..space.len() {
        assert_eq!(trained[p] + dropped[p], 1, "{case:?}: pick {p}");
    }
    if case.tail == TailPolicy::Pad {
        assert!(dropped.iter().all(|&d| d == 0));
    }
    // Each sample appears exactly `multiplicity` times, once per repeat.
    let mut per_sample = vec![0usize; case.samples];
    for p in 0..space.len() {
        per_sample[space.sample(p)] += 1;
    }
    assert!(per_sample.iter().all(|&c| c == case.multiplicity));
    Ok(())
}

#[test]
fn every_pick_exactly_once_on_small_cases() -> Result<()> {
    let ratio_sets: [Option<Vec<f64>>; 4] =
        [None, Some(vec![1.0, 3.0]), Some(vec![0.5, 0.0, 2.0]), Some(vec![0.2, 0.3, 0.1, 0.4])];
    let mut cases = 0;
    for samples in 0..=13 {
        for multiplicity in 1..=3 {
            for ratios in &ratio_sets {
                for world in 1..=4 {
                    if ratios.as_ref().is_some_and(|r| r.len() != world) {
                        continue;
                    }
                    for batch in 1..=5 {
                        for tail in [TailPolicy::Drop, TailPolicy::Pad] {
                            for (seed, epoch) in [(42, 0), (42, 1), (7, 3)] {
                                check(&Case {
                                    samples,
                                    multiplicity,
                                    ratios: ratios.clone(),
                                    world,
                                    batch,
                                    tail,
                                    seed,
                                    epoch,
                                })?;
                                cases += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(cases > 5_000, "{cases} cases");
    Ok(())
}

#[test]
fn every_pick_exactly_once_on_random_large_cases() -> Result<()> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(2026);
    for _ in 0..40 {
        let world = 1 + (rng.next_u64() % 8) as usize;
        let ratios = (rng.next_u64() % 2 == 0).then(|| {
            (0..world).map(|_| (rng.next_u64() % 1000) as f64 / 7.0 + 0.01).collect::<Vec<f64>>()
        });
        check(&Case {
            samples: (rng.next_u64() % 70_000) as usize,
            multiplicity: 1 + (rng.next_u64() % 3) as usize,
            ratios,
            world,
            batch: 1 + (rng.next_u64() % 512) as usize,
            tail: if rng.next_u64() % 2 == 0 { TailPolicy::Drop } else { TailPolicy::Pad },
            seed: rng.next_u64(),
            epoch: rng.next_u64() % 100,
        })?;
    }
    Ok(())
}

#[test]
fn plans_are_determined_by_seed_and_epoch_only() -> Result<()> {
    let bs = NonZeroUsize::new(32).unwrap_or(NonZeroUsize::MIN);
    let build = |seed: u64, epoch: u64| -> Result<Vec<Vec<BatchPicks>>> {
        let perm = epoch_permutation(10_000, seed, epoch);
        weighted_partition(epoch, perm.len(), &[1.0, 2.0, 0.5])?
            .iter()
            .map(|p| plan_batches(&perm, p, bs, TailPolicy::Pad))
            .collect()
    };
    // Recomputed independently (as every rank does): identical.
    assert_eq!(build(42, 5)?, build(42, 5)?);
    // Any change of seed or epoch gives another order, far from the identity.
    for (a, b) in [((42, 5), (42, 6)), ((42, 5), (43, 5)), ((0, 1), (1, 0))] {
        let pa = epoch_permutation(10_000, a.0, a.1);
        let pb = epoch_permutation(10_000, b.0, b.1);
        let same = pa.iter().zip(&pb).filter(|(x, y)| x == y).count();
        // Two independent permutations agree in ~1 position on average.
        assert!(same < 20, "{a:?} vs {b:?}: {same} fixed positions");
    }
    Ok(())
}

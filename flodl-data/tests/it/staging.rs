//! The staging cache: read-through values, budget, background fill, next-use versus LRU.

use std::num::NonZeroUsize;
use std::sync::Arc;

use flodl_data::{
    CacheReport, Dataset, Error, Eviction, Field, Fill, HostBatch, InMemory, PickSpace, Result,
    SampleLayout, StagingCache, StagingConfig, TailPolicy, Values, equal_partition, plan_batches,
};
use flodl_tensor::{DType, Device};
use rand::{Rng, RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

fn random_dataset(n: usize, seed: u64) -> Result<InMemory> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let layout = SampleLayout::new(vec![
        Field::new("x", &[5], DType::F32),
        Field::new("y", &[2], DType::I32),
    ])?;
    let x = (0..n * 5).map(|_| (rng.next_u64() % 1000) as f32 / 7.0).collect();
    let y = (0..n * 2).map(|_| (rng.next_u64() % 100) as i32).collect();
    InMemory::new(layout, vec![Values::F32(x), Values::I32(y)])
}

/// Sample bytes of `random_dataset`: 5 f32 + 2 i32.
const SAMPLE_BYTES: usize = 28;

/// The rank's sample stream over `epochs` epochs: rank 1 of 3, batches of 16, dropped tails.
fn advised_stream(samples: usize, multiplicity: usize, epochs: u64) -> Result<Vec<Vec<usize>>> {
    let space = PickSpace::new(samples, multiplicity)?;
    let mut batches = Vec::new();
    for epoch in 0..epochs {
        let perm = space.permutation(42, epoch);
        let plan = equal_partition(epoch, perm.len(), 3)?[1];
        let bs = NonZeroUsize::new(16).unwrap_or(NonZeroUsize::MIN);
        for b in plan_batches(&perm, &plan, bs, TailPolicy::Drop)? {
            batches.push(b.picks.iter().map(|&p| space.sample(p)).collect());
        }
    }
    Ok(batches)
}

/// Runs `batches` through a cache, checking every value against the dataset; returns totals.
fn run(
    ds: &Arc<InMemory>,
    config: StagingConfig,
    batches: &[Vec<usize>],
    settle: bool,
) -> Result<CacheReport> {
    let cache = StagingCache::new(Arc::clone(ds) as Arc<dyn Dataset>, config)?;
    cache.advise(batches.concat());
    let mut total = CacheReport::default();
    let mut got = HostBatch::new(ds.layout(), Device::Cpu);
    let mut want = HostBatch::new(ds.layout(), Device::Cpu);
    for b in batches {
        if settle {
            cache.settle()?;
        }
        let r = cache.fetch_reported(b, &mut got)?;
        total.hits += r.hits;
        total.misses += r.misses;
        ds.fetch(b, &mut want)?;
        assert_eq!(got.f32(0)?, want.f32(0)?);
        assert_eq!(got.i32(1)?, want.i32(1)?);
    }
    assert_eq!(total.hits + total.misses, batches.iter().map(Vec::len).sum::<usize>());
    Ok(total)
}

fn config(budget_samples: usize, eviction: Eviction, fill: Fill) -> StagingConfig {
    StagingConfig { budget_bytes: budget_samples * SAMPLE_BYTES, eviction, fill, fill_chunk: 32 }
}

#[test]
fn read_through_values_are_exact_and_the_budget_holds() -> Result<()> {
    let ds = Arc::new(random_dataset(500, 1)?);
    let cache = StagingCache::new(
        Arc::clone(&ds) as Arc<dyn Dataset>,
        config(50, Eviction::NextUse, Fill::Off),
    )?;
    assert_eq!(cache.capacity(), 50);
    let stream = advised_stream(500, 1, 2)?;
    cache.advise(stream.concat());
    let mut got = HostBatch::new(ds.layout(), Device::Cpu);
    let mut want = HostBatch::new(ds.layout(), Device::Cpu);
    for b in &stream {
        cache.fetch(b, &mut got)?;
        ds.fetch(b, &mut want)?;
        assert_eq!(got.f32(0)?, want.f32(0)?);
        assert_eq!(got.i32(1)?, want.i32(1)?);
        assert!((0..500).filter(|&s| cache.contains(s)).count() <= 50);
    }
    assert!(matches!(
        cache.fetch(&[500], &mut got),
        Err(Error::IndexOutOfRange { index: 500, .. })
    ));
    Ok(())
}

#[test]
fn next_use_beats_lru_on_advised_streams() -> Result<()> {
    let ds = Arc::new(random_dataset(600, 2)?);
    for multiplicity in [1, 2] {
        let stream = advised_stream(600, multiplicity, 3)?;
        let distinct = 600;
        for fraction in [0.10, 0.25, 0.50] {
            let budget = (distinct as f64 * fraction) as usize;
            let min = run(&ds, config(budget, Eviction::NextUse, Fill::Off), &stream, false)?;
            let lru = run(&ds, config(budget, Eviction::Lru, Fill::Off), &stream, false)?;
            assert!(
                min.hits > lru.hits,
                "x{multiplicity} budget {fraction}: next-use {min:?} vs lru {lru:?}"
            );
        }
    }
    Ok(())
}

#[test]
fn background_fill_serves_the_advised_stream_from_cache() -> Result<()> {
    let ds = Arc::new(random_dataset(400, 3)?);
    let stream = advised_stream(400, 1, 2)?;
    // Budget above the rank's distinct samples: after settling, every fetch hits.
    let all = run(&ds, config(400, Eviction::NextUse, Fill::Background), &stream, true)?;
    assert_eq!(all.misses, 0, "{all:?}");
    // A tight budget still does at least as well as read-through next-use.
    let filled = run(&ds, config(40, Eviction::NextUse, Fill::Background), &stream, true)?;
    let read_through = run(&ds, config(40, Eviction::NextUse, Fill::Off), &stream, false)?;
    assert!(filled.hits >= read_through.hits, "{filled:?} vs {read_through:?}");
    Ok(())
}

#[test]
fn a_new_advisory_rekeys_what_is_held() -> Result<()> {
    let ds = Arc::new(random_dataset(100, 4)?);
    let cache = StagingCache::new(
        Arc::clone(&ds) as Arc<dyn Dataset>,
        config(10, Eviction::NextUse, Fill::Background),
    )?;
    cache.advise((0..10).collect());
    cache.settle()?;
    assert!((0..10).all(|s| cache.contains(s)));
    // The new stream never uses 0..10 again: they are the first to go for 50..60.
    cache.advise((50..60).collect());
    cache.settle()?;
    assert!((50..60).all(|s| cache.contains(s)));
    assert!((0..10).all(|s| !cache.contains(s)));
    let mut out = HostBatch::new(ds.layout(), Device::Cpu);
    let r = cache.fetch_reported(&(50..60).collect::<Vec<_>>(), &mut out)?;
    assert_eq!(r, CacheReport { hits: 10, misses: 0 });
    Ok(())
}

#[test]
fn zero_budget_is_a_pass_through() -> Result<()> {
    let ds = Arc::new(random_dataset(50, 5)?);
    let stream = advised_stream(50, 1, 1)?;
    let r = run(&ds, config(0, Eviction::NextUse, Fill::Background), &stream, true)?;
    assert_eq!(r.hits, 0);
    assert!(
        StagingCache::new(
            Arc::clone(&ds) as Arc<dyn Dataset>,
            StagingConfig { fill_chunk: 0, ..StagingConfig::new(100) }
        )
        .is_err()
    );
    Ok(())
}

/// What a property case does to a cache, in order.
#[derive(Debug, Clone)]
enum Op {
    /// Advise a stream of this many samples from this seed.
    Advise(usize, u64),
    /// Fetch a batch of this many samples from this seed.
    Fetch(usize, u64),
    /// Wait for the background fill.
    Settle,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        (1usize..400, any::<u64>()).prop_map(|(n, s)| Op::Advise(n, s)),
        (1usize..64, any::<u64>()).prop_map(|(n, s)| Op::Fetch(n, s)),
        Just(Op::Settle),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Whatever the budget (not a whole number of samples included), the eviction rule, the
    /// fill mode and the sequence of advisories and fetches, the bytes the cache allocates
    /// never exceed its budget, and every fetch returns the dataset's values.
    #[test]
    fn the_cache_never_exceeds_its_budget(
        budget in 0usize..4000,
        lru in proptest::bool::ANY,
        background in proptest::bool::ANY,
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let ds = Arc::new(random_dataset(300, 5).map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?);
        let eviction = if lru { Eviction::Lru } else { Eviction::NextUse };
        let fill = if background { Fill::Background } else { Fill::Off };
        let config = StagingConfig { budget_bytes: budget, eviction, fill, fill_chunk: 16 };
        let fail = |e: Error| proptest::test_runner::TestCaseError::fail(e.to_string());
        let cache = StagingCache::new(Arc::clone(&ds) as Arc<dyn Dataset>, config).map_err(fail)?;
        let mut got = HostBatch::new(ds.layout(), Device::Cpu);
        let mut want = HostBatch::new(ds.layout(), Device::Cpu);
        for op in ops {
            match op {
                Op::Advise(n, seed) => {
                    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
                    cache.advise((0..n).map(|_| rng.random_range(0..300)).collect());
                }
                Op::Fetch(n, seed) => {
                    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
                    let picks: Vec<usize> = (0..n).map(|_| rng.random_range(0..300)).collect();
                    cache.fetch(&picks, &mut got).map_err(fail)?;
                    ds.fetch(&picks, &mut want).map_err(fail)?;
                    proptest::prop_assert_eq!(got.f32(0).map_err(fail)?, want.f32(0).map_err(fail)?);
                    proptest::prop_assert_eq!(got.i32(1).map_err(fail)?, want.i32(1).map_err(fail)?);
                }
                Op::Settle => cache.settle().map_err(fail)?,
            }
            proptest::prop_assert!(
                cache.held_bytes() <= budget,
                "{} bytes allocated over a budget of {budget}", cache.held_bytes()
            );
            proptest::prop_assert!(cache.held() * SAMPLE_BYTES <= budget);
        }
        cache.settle().map_err(fail)?;
        proptest::prop_assert!(cache.held_bytes() <= budget);
    }
}

//! The prefetcher: order, running ahead, cancellation, shutdown, errors and transforms.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flodl_data::{
    BatchPicks, Dataset, Depth, DeviceBatch, Error, Field, HostBatch, InMemory, Next, PickKey,
    PickSpace, PrefetchConfig, Prefetcher, Result, SampleLayout, TailPolicy, Transform, Values,
    equal_partition, plan_batches,
};
use flodl_tensor::{DType, Device, Stream, Tensor};
use rand::{Rng, RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// A random dataset: field 0 f32 `[3, 4]`, field 1 i32 scalar.
fn random_dataset(n: usize, seed: u64) -> Result<InMemory> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let layout = SampleLayout::new(vec![
        Field::new("x", &[3, 4], DType::F32),
        Field::new("y", &[], DType::I32),
    ])?;
    let x = (0..n * 12).map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32).collect();
    let y = (0..n).map(|_| (rng.next_u64() % 10) as i32).collect();
    InMemory::new(layout, vec![Values::F32(x), Values::I32(y)])
}

fn batches_of(
    space: &PickSpace,
    seed: u64,
    epoch: u64,
    bs: usize,
    tail: TailPolicy,
) -> Result<Vec<BatchPicks>> {
    let perm = space.permutation(seed, epoch);
    let plan = equal_partition(epoch, perm.len(), 1)?[0];
    plan_batches(&perm, &plan, NonZeroUsize::new(bs).unwrap_or(NonZeroUsize::MIN), tail)
}

fn config(space: PickSpace, seed: u64, depth: Depth) -> PrefetchConfig {
    PrefetchConfig { space, seed, depth, transform: None }
}

/// Checks a delivered batch against a synchronous fetch of the same picks.
fn check_batch(
    ds: &dyn Dataset,
    space: &PickSpace,
    picks: &BatchPicks,
    batch: &DeviceBatch,
    stream: &Stream,
) -> Result<()> {
    batch.wait(stream)?;
    let samples: Vec<usize> = picks.picks.iter().map(|&p| space.sample(p)).collect();
    let mut want = HostBatch::new(ds.layout(), Device::Cpu);
    ds.fetch(&samples, &mut want)?;
    assert_eq!(batch.valid(), picks.valid);
    assert_eq!(batch.keys().iter().map(|k| k.sample).collect::<Vec<_>>(), samples);
    let t = batch.tensors();
    assert_eq!(t[0].shape(), &[samples.len(), 3, 4]);
    assert_eq!(t[1].shape(), &[samples.len()]);
    assert_eq!(t[0].to_vec::<f32>(stream)?, want.f32(0)?);
    assert_eq!(t[1].to_vec::<i32>(stream)?, want.i32(1)?);
    Ok(())
}

fn same_batches_as_synchronous_fetch(device: Device) -> Result<()> {
    let ds: Arc<dyn Dataset> = Arc::new(random_dataset(1000, 1)?);
    let consumer = Stream::new(device)?;
    for (multiplicity, bs, tail, depth) in [
        (1, 64, TailPolicy::Drop, Depth::Fixed(3)),
        (2, 50, TailPolicy::Pad, Depth::Fixed(1)),
        (3, 7, TailPolicy::Pad, Depth::Fixed(0)),
        (1, 100, TailPolicy::Drop, Depth::default()),
    ] {
        let space = PickSpace::new(1000, multiplicity)?;
        let prefetcher = Prefetcher::new(Arc::clone(&ds), device, config(space, 9, depth))?;
        for epoch in 0..2 {
            let batches = batches_of(&space, 9, epoch, bs, tail)?;
            let feed = prefetcher.start(epoch, batches.clone())?;
            let mut n = 0;
            for (i, got) in feed.enumerate() {
                let got = got?;
                assert_eq!(got.index(), i);
                assert!(got.keys().iter().all(|k| k.epoch == epoch && k.seed == 9));
                check_batch(&*ds, &space, &batches[i], &got, &consumer)?;
                n += 1;
            }
            assert_eq!(n, batches.len());
        }
    }
    Ok(())
}

#[test]
fn cpu_batches_match_a_synchronous_fetch_in_order() -> Result<()> {
    same_batches_as_synchronous_fetch(Device::Cpu)
}

#[test]
fn cuda_batches_match_a_synchronous_fetch_in_order() -> Result<()> {
    match flodl_tensor::gpu_skip_reason() {
        Some(reason) => {
            flodl_tensor::skip_or_fail(&reason);
            Ok(())
        }
        None => same_batches_as_synchronous_fetch(Device::Cuda(0)),
    }
}

/// Spins (yielding) until `cond` holds; fails after a generous deadline instead of hanging.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::yield_now();
    }
}

#[test]
fn the_queue_refills_to_depth_ahead_of_a_slow_consumer() -> Result<()> {
    let ds: Arc<dyn Dataset> = Arc::new(random_dataset(2000, 2)?);
    let space = PickSpace::plain(2000);
    let prefetcher =
        Prefetcher::new(Arc::clone(&ds), Device::Cpu, config(space, 3, Depth::Fixed(4)))?;
    let batches = batches_of(&space, 3, 0, 32, TailPolicy::Drop)?;
    let mut feed = prefetcher.start(0, batches.clone())?;
    assert_eq!(feed.depth(), 4);
    let stream = Stream::cpu_with_threads(1);
    for i in 0..batches.len() {
        // Whenever the consumer comes back, everything it may need next is already uploaded.
        let ahead = (batches.len() - i).min(4);
        wait_until("the queue to refill", || feed.queued() >= ahead);
        let got = feed.next().ok_or(Error::WorkerLost { role: "test" })??;
        check_batch(&*ds, &space, &batches[i], &got, &stream)?;
        assert!(feed.queued() <= 4, "the queue is bounded by the depth");
    }
    assert!(feed.next().is_none());
    Ok(())
}

/// A dataset that counts the batches fetched from it.
struct Counting {
    inner: InMemory,
    fetched: AtomicUsize,
}

impl Dataset for Counting {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn layout(&self) -> &SampleLayout {
        self.inner.layout()
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> Result<()> {
        self.fetched.fetch_add(1, Ordering::SeqCst);
        self.inner.fetch(indices, out)
    }
}

#[test]
fn a_full_queue_holds_the_thread_one_batch_ahead_and_loses_nothing() -> Result<()> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(13);
    let counting = Arc::new(Counting { inner: random_dataset(1500, 13)?, fetched: 0.into() });
    let ds: Arc<dyn Dataset> = Arc::clone(&counting) as Arc<dyn Dataset>;
    let space = PickSpace::plain(1500);
    let stream = Stream::cpu_with_threads(1);
    for depth in [1usize, 2, 3, 5] {
        let bs = rng.random_range(20..120);
        let prefetcher =
            Prefetcher::new(Arc::clone(&ds), Device::Cpu, config(space, 4, Depth::Fixed(depth)))?;
        let batches = batches_of(&space, 4, depth as u64, bs, TailPolicy::Pad)?;
        let before = counting.fetched.load(Ordering::SeqCst);
        let mut feed = prefetcher.start(depth as u64, batches.clone())?;
        for (taken, picks) in batches.iter().enumerate() {
            // Sometimes the consumer comes back to a full queue (the thread has been looking
            // at it for a while), sometimes at once (it may find the queue empty).
            if rng.random_bool(0.5) {
                let ahead = (batches.len() - taken).min(depth);
                wait_until("the queue to refill", || feed.queued() >= ahead);
            }
            let fetched = counting.fetched.load(Ordering::SeqCst) - before;
            assert!(
                fetched <= taken + depth + 1,
                "{fetched} fetched, {taken} taken, depth {depth}"
            );
            let got = feed.next().ok_or(Error::WorkerLost { role: "test" })??;
            assert_eq!(got.index(), taken);
            check_batch(&counting.inner, &space, picks, &got, &stream)?;
        }
        assert!(feed.next().is_none());
        let fetched = counting.fetched.load(Ordering::SeqCst) - before;
        assert_eq!(fetched, batches.len());
    }
    Ok(())
}

#[test]
fn dropping_a_feed_cancels_its_plan_and_the_next_plan_is_clean() -> Result<()> {
    let ds: Arc<dyn Dataset> = Arc::new(random_dataset(3000, 4)?);
    let space = PickSpace::plain(3000);
    let prefetcher =
        Prefetcher::new(Arc::clone(&ds), Device::Cpu, config(space, 5, Depth::Fixed(2)))?;
    let stream = Stream::cpu_with_threads(1);
    for taken in [0usize, 1, 5] {
        let first = batches_of(&space, 5, 0, 10, TailPolicy::Drop)?;
        let mut feed = prefetcher.start(0, first)?;
        for _ in 0..taken {
            feed.next().ok_or(Error::WorkerLost { role: "test" })??;
        }
        drop(feed);
        let second = batches_of(&space, 5, 1, 30, TailPolicy::Pad)?;
        let mut n = 0;
        for (i, got) in prefetcher.start(1, second.clone())?.enumerate() {
            check_batch(&*ds, &space, &second[i], &got?, &stream)?;
            n += 1;
        }
        assert_eq!(n, second.len());
    }
    Ok(())
}

#[test]
fn dropping_the_prefetcher_mid_plan_ends_the_feed_without_hanging() -> Result<()> {
    let ds: Arc<dyn Dataset> = Arc::new(random_dataset(3000, 6)?);
    let space = PickSpace::plain(3000);
    let prefetcher =
        Prefetcher::new(Arc::clone(&ds), Device::Cpu, config(space, 1, Depth::Fixed(2)))?;
    let batches = batches_of(&space, 1, 0, 10, TailPolicy::Drop)?;
    let mut feed = prefetcher.start(0, batches)?;
    feed.next().ok_or(Error::WorkerLost { role: "test" })??;
    drop(prefetcher);
    // What was queued may still come out; then the feed reports the loss once and ends.
    let mut delivered = 0;
    let mut lost = 0;
    for item in &mut feed {
        match item {
            Ok(_) => delivered += 1,
            Err(Error::WorkerLost { .. }) => lost += 1,
            Err(e) => return Err(e),
        }
    }
    assert!(delivered <= 3, "{delivered} delivered after the drop");
    assert_eq!(lost, 1);
    assert!(feed.next().is_none());
    Ok(())
}

/// A dataset that fails (or panics) on one sample.
struct Faulty {
    inner: InMemory,
    bad: usize,
    panics: bool,
}

impl Dataset for Faulty {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn layout(&self) -> &SampleLayout {
        self.inner.layout()
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> Result<()> {
        if indices.contains(&self.bad) {
            assert!(!self.panics, "injected panic");
            return Err(Error::IndexOutOfRange { index: self.bad, len: 0 });
        }
        self.inner.fetch(indices, out)
    }
}

#[test]
fn fetch_errors_reach_the_consumer_and_end_the_plan() -> Result<()> {
    let bad = 777;
    let ds: Arc<dyn Dataset> =
        Arc::new(Faulty { inner: random_dataset(1000, 7)?, bad, panics: false });
    let space = PickSpace::plain(1000);
    let prefetcher =
        Prefetcher::new(Arc::clone(&ds), Device::Cpu, config(space, 2, Depth::Fixed(2)))?;
    let batches = batches_of(&space, 2, 0, 16, TailPolicy::Drop)?;
    let failing = batches
        .iter()
        .position(|b| b.picks.contains(&bad))
        .ok_or(Error::WorkerLost { role: "test" })?;
    let mut ok = 0;
    let mut errors = Vec::new();
    for item in prefetcher.start(0, batches.clone())? {
        match item {
            Ok(_) => ok += 1,
            Err(e) => errors.push(e),
        }
    }
    assert_eq!(ok, failing);
    assert!(matches!(errors.as_slice(), [Error::IndexOutOfRange { index, .. }] if *index == bad));
    // The prefetcher survives: a plan without the bad sample runs.
    let clean: Vec<BatchPicks> = batches.into_iter().filter(|b| !b.picks.contains(&bad)).collect();
    let n = clean.len();
    assert_eq!(prefetcher.start(1, clean)?.filter(Result::is_ok).count(), n);
    Ok(())
}

#[test]
fn a_panicking_dataset_gives_a_typed_error_not_a_hang() -> Result<()> {
    let ds: Arc<dyn Dataset> =
        Arc::new(Faulty { inner: random_dataset(100, 8)?, bad: 0, panics: true });
    let space = PickSpace::plain(100);
    let prefetcher = Prefetcher::new(ds, Device::Cpu, config(space, 2, Depth::Fixed(2)))?;
    let items: Vec<Result<DeviceBatch>> =
        prefetcher.start(0, batches_of(&space, 2, 0, 100, TailPolicy::Drop)?)?.collect();
    assert!(matches!(items.as_slice(), [Err(Error::WorkerLost { .. })]));
    // Later plans fail too: at once, or (racing the thread's unwinding, which may leave the
    // plan queued but never taken) on the first batch, whether waited for or polled.
    for epoch in 1..9 {
        match prefetcher.start(epoch, batches_of(&space, 2, epoch, 100, TailPolicy::Drop)?) {
            Err(e) => assert!(matches!(e, Error::WorkerLost { .. })),
            Ok(mut feed) if epoch % 2 == 0 => {
                // A generous bound standing in for "forever": Pending would be the hang.
                let first = feed.next_timeout(Duration::from_secs(60));
                assert!(matches!(first, Err(Error::WorkerLost { .. })), "{first:?}");
                assert!(matches!(feed.next_timeout(Duration::ZERO), Ok(Next::Done)));
            }
            Ok(feed) => {
                let items: Vec<Result<DeviceBatch>> = feed.collect();
                assert!(matches!(items.as_slice(), [Err(Error::WorkerLost { .. })]));
            }
        }
    }
    // Dropping the prefetcher of a dead thread returns.
    drop(prefetcher);
    Ok(())
}

/// Adds `repeat + 10·epoch + 100·(seed % 7)` to every value of field 0 of each row.
struct Shift;

impl Shift {
    fn amount(k: &PickKey) -> f32 {
        (k.repeat as u64 + 10 * k.epoch + 100 * (k.seed % 7)) as f32
    }
}

impl Transform for Shift {
    fn apply(&self, keys: &[PickKey], tensors: &mut [Tensor], _stream: &Stream) -> Result<()> {
        let x = tensors[0].as_mut_slice::<f32>()?;
        let width = x.len() / keys.len().max(1);
        for (row, k) in x.chunks_exact_mut(width).zip(keys) {
            for v in row {
                *v += Self::amount(k);
            }
        }
        Ok(())
    }
}

#[test]
fn transforms_are_applied_per_pick_key() -> Result<()> {
    let inner = random_dataset(200, 9)?;
    let ds: Arc<dyn Dataset> = Arc::new(inner.clone());
    let space = PickSpace::new(200, 3)?;
    let mut cfg = config(space, 12, Depth::Fixed(2));
    cfg.transform = Some(Arc::new(Shift));
    let prefetcher = Prefetcher::new(ds, Device::Cpu, cfg)?;
    let stream = Stream::cpu_with_threads(1);
    let epoch = 4;
    let batches = batches_of(&space, 12, epoch, 25, TailPolicy::Drop)?;
    for (picks, got) in batches.iter().zip(prefetcher.start(epoch, batches.clone())?) {
        let got = got?;
        let x = got.tensors()[0].to_vec::<f32>(&stream)?;
        let Values::F32(src) = inner.values(0)? else {
            return Err(Error::LayoutMismatch);
        };
        for (row, &p) in picks.picks.iter().enumerate() {
            let key = space.key(p, epoch, 12)?;
            assert_eq!(got.keys()[row], key);
            for j in 0..12 {
                let want = f64::from(src[key.sample * 12 + j]) + f64::from(Shift::amount(&key));
                assert!((f64::from(x[row * 12 + j]) - want).abs() < 1e-3);
            }
        }
    }
    Ok(())
}

#[test]
fn cpu_depth_from_the_gauge_is_four_and_never_exceeds_the_plan() -> Result<()> {
    let ds: Arc<dyn Dataset> = Arc::new(random_dataset(100, 10)?);
    let space = PickSpace::plain(100);
    let prefetcher = Prefetcher::new(ds, Device::Cpu, config(space, 0, Depth::default()))?;
    assert_eq!(prefetcher.depth_for(50, 10), 4);
    assert_eq!(prefetcher.depth_for(3, 10), 3);
    assert_eq!(prefetcher.depth_for(1, 10), 1);
    let feed = prefetcher.start(0, batches_of(&space, 0, 0, 10, TailPolicy::Drop)?)?;
    assert_eq!(feed.depth(), 4);
    assert!(
        Prefetcher::new(
            Arc::new(random_dataset(10, 1)?),
            Device::Cpu,
            config(PickSpace::plain(11), 0, Depth::Fixed(1))
        )
        .is_err()
    );
    Ok(())
}

#[test]
fn cpu_batches_reuse_the_tensors_the_consumer_dropped() -> Result<()> {
    let ds: Arc<dyn Dataset> = Arc::new(random_dataset(640, 11)?);
    let space = PickSpace::plain(640);
    // A rendezvous queue: batch i + 2 is prepared only after the consumer dropped batch i.
    let prefetcher =
        Prefetcher::new(Arc::clone(&ds), Device::Cpu, config(space, 1, Depth::Fixed(0)))?;
    let batches = batches_of(&space, 1, 0, 32, TailPolicy::Drop)?;
    let stream = Stream::cpu_with_threads(1);
    let mut addresses = Vec::new();
    for (i, got) in prefetcher.start(0, batches.clone())?.enumerate() {
        let got = got?;
        check_batch(&*ds, &space, &batches[i], &got, &stream)?;
        addresses.push(got.tensors()[0].as_slice::<f32>()?.as_ptr() as usize);
    }
    let mut distinct = addresses.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(addresses.len(), 20);
    assert!(distinct.len() <= 4, "{} distinct buffers for 20 batches", distinct.len());
    Ok(())
}

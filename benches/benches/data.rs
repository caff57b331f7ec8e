//! Data-plane benchmarks: MNIST batch fetch, prefetcher starve time, staging cache hit ratios.
//!
//! Criterion times the MNIST load and fetch (samples/s), a staging-cache hit fetch, the
//! prefetcher's production rate and a fixed-cost consumer fed by it. Two figures are not
//! timings and are printed instead (they are skipped under `--test`):
//! - prefetcher starve time: the share of wall time a consumer of fixed per-batch cost (a fixed
//!   amount of CPU work, calibrated to N ms uncontended) spends waiting for the next batch,
//!   after the first batch, split into long waits (over 100 us: the thread was behind, or waited
//!   for a core) and the rest (what each hand-over costs);
//! - staging cache hit ratio, next use (Belady) versus LRU, at budgets of 10/25/50% of MNIST.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use flodl_benches::{Unit, bench_name, criterion_config};
use flodl_data::mnist::vendored_dir;
use flodl_data::{
    BatchPicks, CacheReport, Dataset, Depth, Eviction, Fill, HostBatch, Mnist, PrefetchConfig,
    Prefetcher, Split, StagingCache, StagingConfig, TailPolicy, Verify, epoch_permutation,
    equal_partition, plan_batches,
};
use flodl_tensor::{Device, Stream};

const SEED: u64 = 42;

fn mnist() -> Arc<Mnist> {
    Arc::new(Mnist::load(vendored_dir(), Split::Train, Verify::Skip).expect("vendored MNIST"))
}

fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).expect("non-zero batch size")
}

/// The batches of `rank` of `world` for one epoch.
fn rank_batches(n: usize, epoch: u64, world: usize, rank: usize, bs: usize) -> Vec<BatchPicks> {
    let perm = epoch_permutation(n, SEED, epoch);
    let plan = equal_partition(epoch, n, world).expect("partition")[rank];
    plan_batches(&perm, &plan, nz(bs), TailPolicy::Drop).expect("batches")
}

fn in_test_mode() -> bool {
    std::env::args().any(|a| a == "--test")
}

fn data(c: &mut Criterion) {
    let ds = mnist();
    let mut g = c.benchmark_group("data");

    // MNIST batch fetch: random indices (an epoch's order) gathered into a reusable host batch.
    let perm = epoch_permutation(ds.len(), SEED, 0);
    for bs in [64usize, 256] {
        let mut out = HostBatch::new(ds.layout(), Device::Cpu);
        let mut at = 0;
        g.throughput(Unit::Samples.throughput(bs as u64));
        let id =
            BenchmarkId::new(bench_name("cpu", "mnist_fetch", Unit::Samples), format!("bs{bs}"));
        g.bench_function(id, |b| {
            b.iter(|| {
                if at + bs > perm.len() {
                    at = 0;
                }
                ds.fetch(&perm[at..at + bs], &mut out).expect("fetch");
                at += bs;
            })
        });
    }

    // MNIST load (the CLI does it on every run): read, decompress and convert the train split.
    g.sample_size(10);
    g.throughput(Unit::Samples.throughput(ds.len() as u64));
    for (verify, tag) in [(Verify::Skip, "train"), (Verify::Sha256, "train_sha256")] {
        let id = BenchmarkId::new(bench_name("cpu", "mnist_load", Unit::Samples), tag);
        g.bench_function(id, |b| {
            b.iter(|| Mnist::load(vendored_dir(), Split::Train, verify).expect("load"))
        });
    }
    g.sample_size(20);

    // Staging cache, all hits: the read-through fast path.
    let cache = StagingCache::new(
        Arc::clone(&ds) as Arc<dyn Dataset>,
        StagingConfig {
            fill: Fill::Off,
            ..StagingConfig::new(ds.len() * ds.layout().sample_bytes())
        },
    )
    .expect("cache");
    let hot: Vec<usize> = perm[..256].to_vec();
    let mut out = HostBatch::new(ds.layout(), Device::Cpu);
    cache.fetch(&hot, &mut out).expect("warm the cache");
    g.throughput(Unit::Samples.throughput(256));
    let id = BenchmarkId::new(bench_name("cpu", "staging_hit_fetch", Unit::Samples), "bs256");
    g.bench_function(id, |b| b.iter(|| cache.fetch(&hot, &mut out).expect("fetch")));
    drop(cache);

    // Prefetcher production rate: one plan of 16 batches of 256, consumer does nothing.
    let prefetcher = Prefetcher::new(
        Arc::clone(&ds) as Arc<dyn Dataset>,
        Device::Cpu,
        PrefetchConfig::new(ds.len(), SEED),
    )
    .expect("prefetcher");
    let stream = Stream::cpu_with_threads(1);
    let plan: Vec<BatchPicks> = rank_batches(ds.len(), 0, 1, 0, 256).into_iter().take(16).collect();
    g.throughput(Unit::Samples.throughput(16 * 256));
    let id = BenchmarkId::new(bench_name("cpu", "prefetch_plan", Unit::Samples), "16xbs256");
    g.bench_function(id, |b| {
        b.iter(|| {
            for batch in prefetcher.start(0, plan.clone()).expect("start") {
                batch.expect("batch").wait(&stream).expect("wait");
            }
        })
    });
    g.finish();

    if in_test_mode() {
        eprintln!("data figures skipped under --test");
        return;
    }
    starve_bench(c, &ds);
    starve_figures(&ds);
    hit_ratio_figures(&ds);
}

/// A fixed amount of CPU work, `units` rounds of a xorshift (a stand-in for a training step:
/// like one, it takes longer in wall time when the cores are contended).
fn work(units: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..units {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x)
}

/// Work units per millisecond of uncontended CPU time (the fastest of several runs).
fn units_per_ms() -> u64 {
    let units = 2_000_000;
    let best = (0..7)
        .map(|_| {
            let t = Instant::now();
            work(units);
            t.elapsed()
        })
        .min()
        .unwrap_or(Duration::from_millis(1));
    (units as f64 / (best.as_secs_f64() * 1e3)).max(1.0) as u64
}

/// A consumer's endless stream of batches: MNIST train epochs of batch size `bs`, each next
/// plan started when the current one has only `depth` batches left (as a rank that knows its
/// next plan does), so epoch boundaries are included.
struct Consumer {
    ds: Arc<Mnist>,
    bs: usize,
    prefetcher: Prefetcher,
    feeds: std::collections::VecDeque<flodl_data::Feed>,
    next_epoch: u64,
    stream: Stream,
}

impl Consumer {
    fn new(ds: &Arc<Mnist>, bs: usize, depth: Depth) -> Self {
        let prefetcher = Prefetcher::new(
            Arc::clone(ds) as Arc<dyn Dataset>,
            Device::Cpu,
            PrefetchConfig { depth, ..PrefetchConfig::new(ds.len(), SEED) },
        )
        .expect("prefetcher");
        Self {
            ds: Arc::clone(ds),
            bs,
            prefetcher,
            feeds: std::collections::VecDeque::new(),
            next_epoch: 0,
            stream: Stream::cpu_with_threads(1),
        }
    }

    fn start_next(&mut self) {
        let plan = rank_batches(self.ds.len(), self.next_epoch, 1, 0, self.bs);
        self.feeds.push_back(self.prefetcher.start(self.next_epoch, plan).expect("start"));
        self.next_epoch += 1;
    }

    /// Takes the next batch; returns how long the consumer waited for it.
    fn take(&mut self) -> Duration {
        loop {
            if self.feeds.len() < 2
                && self.feeds.back().is_none_or(|f| f.remaining() <= f.depth().max(1))
            {
                self.start_next();
            }
            let feed = self.feeds.front_mut().expect("a feed");
            let t = Instant::now();
            match feed.next() {
                Some(batch) => {
                    let batch = batch.expect("batch");
                    batch.wait(&self.stream).expect("wait");
                    let waited = t.elapsed();
                    // Freeing the batch is the consumer's business, not waiting.
                    drop(batch);
                    return waited;
                }
                None => {
                    self.feeds.pop_front();
                }
            }
        }
    }
}

/// Time a consumer spent waiting for batches.
#[derive(Debug, Default, Clone, Copy)]
struct Starve {
    total: Duration,
    // Waits over `LONG_WAIT`, and their sum.
    long: usize,
    long_total: Duration,
}

/// A wait longer than a hand-over can take: the thread was behind, or waited for a core.
const LONG_WAIT: Duration = Duration::from_micros(100);

impl Starve {
    fn add(&mut self, waited: Duration) {
        self.total += waited;
        if waited > LONG_WAIT {
            self.long += 1;
            self.long_total += waited;
        }
    }

    /// `"<share>% of wall (<ms> ms of <ms> ms; <n> waits over 100 us: <ms> ms)"`.
    fn describe(&self, wall: Duration) -> String {
        format!(
            "{:.3}% of wall ({:.2} ms of {:.0} ms; {} waits over 100 us: {:.2} ms)",
            100.0 * self.total.as_secs_f64() / wall.as_secs_f64().max(1e-9),
            self.total.as_secs_f64() * 1e3,
            wall.as_secs_f64() * 1e3,
            self.long,
            self.long_total.as_secs_f64() * 1e3
        )
    }
}

/// A consumer's per-batch cost.
#[derive(Debug, Clone, Copy)]
enum Cost {
    /// This many work units on the consumer's own thread (a CPU rank's training step).
    Work(u64),
    /// Off the CPU for this long (a GPU rank's thread waiting for its step to finish).
    OffCpu(Duration),
}

/// Consumes `batches` batches at `cost` each after one warm-up batch; returns (starve, wall).
fn starve_run(
    ds: &Arc<Mnist>,
    bs: usize,
    cost: Cost,
    depth: Depth,
    batches: usize,
) -> (Starve, Duration) {
    let mut s = Consumer::new(ds, bs, depth);
    s.take();
    let start = Instant::now();
    let mut starve = Starve::default();
    for _ in 0..batches {
        starve.add(s.take());
        match cost {
            Cost::Work(units) => {
                work(units);
            }
            Cost::OffCpu(d) => std::thread::sleep(d),
        }
    }
    (starve, start.elapsed())
}

/// Criterion: time per consumed batch for a consumer of fixed cost (so the excess over the cost
/// is the starve time); the starve share of every measured call is printed afterwards.
fn starve_bench(c: &mut Criterion, ds: &Arc<Mnist>) {
    let mut g = c.benchmark_group("data");
    let bs = 256;
    let per_ms = units_per_ms();
    for cost_ms in [1u64, 2] {
        let cost = cost_ms * per_ms;
        let mut s = Consumer::new(ds, bs, Depth::default());
        s.take();
        let mut starve = Starve::default();
        let mut wall = Duration::ZERO;
        g.throughput(Unit::Samples.throughput(bs as u64));
        let id = BenchmarkId::new(
            bench_name("cpu", "prefetch_consume", Unit::Samples),
            format!("bs{bs}_cost{cost_ms}ms"),
        );
        g.bench_function(id, |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    starve.add(s.take());
                    work(cost);
                }
                let e = t.elapsed();
                wall += e;
                e
            })
        });
        if wall.is_zero() {
            // Filtered out on the command line.
            continue;
        }
        println!(
            "data/prefetch: starve {} consumer {cost_ms} ms of work/batch, bs {bs}, gauge depth (cpu: {}), load {}",
            starve.describe(wall),
            flodl_data::CPU_DEPTH,
            load_average()
        );
    }
    g.finish();
}

/// The machine's 1-minute load average (the cores are shared; figures depend on it).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

fn starve_figures(ds: &Arc<Mnist>) {
    let bs = 256;
    let n = 300;
    let per_ms = units_per_ms();
    for round in 1..=3 {
        // Production time per batch with an idle consumer, for scale.
        let (_, wall) = starve_run(ds, bs, Cost::Work(0), Depth::Fixed(2), n);
        println!(
            "data/prefetch round {round}: production {:.1} us per batch of {bs} (idle consumer, {n} batches), load {}",
            wall.as_secs_f64() * 1e6 / n as f64,
            load_average()
        );
        for (cost_ms, off_cpu, depth) in [
            (1u64, false, Depth::Fixed(2)),
            (1, false, Depth::Fixed(4)),
            (1, false, Depth::Fixed(8)),
            (2, false, Depth::Fixed(2)),
            (5, false, Depth::Fixed(2)),
            (1, true, Depth::Fixed(2)),
            (2, true, Depth::Fixed(2)),
        ] {
            let cost = if off_cpu {
                Cost::OffCpu(Duration::from_millis(cost_ms))
            } else {
                Cost::Work(cost_ms * per_ms)
            };
            let (starve, wall) = starve_run(ds, bs, cost, depth, n);
            let kind = if off_cpu { "off-cpu wait" } else { "of cpu work" };
            println!(
                "data/prefetch round {round}: starve {} consumer {cost_ms} ms {kind}/batch, bs {bs}, {n} batches, {depth:?}, load {}",
                starve.describe(wall),
                load_average()
            );
        }
    }
}

/// Hit ratio of a read-through cache over the advised stream of rank 0 of 2, 3 epochs, bs 256.
fn hit_ratio(
    ds: &Arc<Mnist>,
    budget_samples: usize,
    eviction: Eviction,
    fill: Fill,
    per_ms: u64,
) -> f64 {
    let sample_bytes = ds.layout().sample_bytes();
    let cache = StagingCache::new(
        Arc::clone(ds) as Arc<dyn Dataset>,
        StagingConfig {
            budget_bytes: budget_samples * sample_bytes,
            eviction,
            fill,
            fill_chunk: 256,
        },
    )
    .expect("cache");
    let batches: Vec<Vec<usize>> =
        (0..3).flat_map(|e| rank_batches(ds.len(), e, 2, 0, 256)).map(|b| b.picks).collect();
    cache.advise(batches.concat());
    let mut out = HostBatch::new(ds.layout(), Device::Cpu);
    let mut total = CacheReport::default();
    for b in &batches {
        if fill == Fill::Background {
            // A consumer with a 1 ms step of work: the read-ahead runs during it.
            work(per_ms);
        }
        let r = cache.fetch_reported(b, &mut out).expect("fetch");
        total.hits += r.hits;
        total.misses += r.misses;
    }
    total.hits as f64 / (total.hits + total.misses) as f64
}

fn hit_ratio_figures(ds: &Arc<Mnist>) {
    let per_ms = units_per_ms();
    println!("data/staging: hit ratio, MNIST train, rank 0 of 2, 3 epochs of advisories, bs 256");
    for pct in [10usize, 25, 50] {
        let budget = ds.len() * pct / 100;
        let min = hit_ratio(ds, budget, Eviction::NextUse, Fill::Off, per_ms);
        let lru = hit_ratio(ds, budget, Eviction::Lru, Fill::Off, per_ms);
        let filled = hit_ratio(ds, budget, Eviction::NextUse, Fill::Background, per_ms);
        println!(
            "data/staging: budget {pct:>2}% ({budget} samples): next-use {:.1}%  lru {:.1}%  next-use + read-ahead (1 ms-of-work consumer) {:.1}%",
            100.0 * min,
            100.0 * lru,
            100.0 * filled
        );
    }
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = data
}
criterion_main!(benches);

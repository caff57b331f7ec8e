//! Scheduling-logic benchmarks: ElChe's per-reduce update and the runtime's chunk dispatch.
//!
//! Both are pure CPU logic on the coordinator's thread; the figures are operations per second:
//! `elche_report` = one `report_timing` plus `apply_verdict` (one reduce's bookkeeping), and
//! `chunk_dispatch` = one chunk handed out by the runtime's `Dispatcher` (progressive, sized
//! from ElChe's counts), completed, and complete epochs popped, for 2, 4 and 8 ranks.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use flodl_benches::{Unit, bench_name, criterion_config};
use flodl_ddp::{Cutting, Dispatcher, ElChe, Verdict, WorkTally};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::time::Instant;

const WORLDS: [usize; 3] = [2, 4, 8];

/// Per-rank ms/batch with a 1x..3x skew and ±10% noise per window.
fn timings(world: usize, rng: &mut Xoshiro256PlusPlus, counts: &[usize]) -> (Vec<f64>, Vec<u64>) {
    let wall = (0..world)
        .map(|r| {
            let ms = 2.0 + 4.0 * r as f64 / world as f64;
            counts[r] as f64 * ms * (1.0 + rng.random_range(-0.1..0.1))
        })
        .collect();
    (wall, counts.iter().map(|&c| c as u64).collect())
}

fn elche_report(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");
    g.throughput(Unit::Elements.throughput(1));
    for world in WORLDS {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
        let mut el = ElChe::new(world, 10).expect("valid ElChe");
        let id = BenchmarkId::new(
            bench_name("cpu", "elche_report", Unit::Elements),
            format!("w{world}"),
        );
        g.bench_function(id, |b| {
            b.iter(|| {
                let (wall, steps) = timings(world, &mut rng, el.counts());
                el.report_timing(&wall, &steps, 1.0).expect("matching lengths");
                el.apply_verdict(Verdict::Stable);
                std::hint::black_box(el.counts().len())
            })
        });
    }
    g.finish();
}

fn chunk_dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");
    g.throughput(Unit::Elements.throughput(1));
    // MNIST-sized epochs in batches of 64, many epochs so the stream rarely restarts.
    let (samples, bs, epochs) = (60_000usize, 64usize, 1_000usize);
    for world in WORLDS {
        let mut el = ElChe::new(world, 10).expect("valid ElChe");
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(2);
        for _ in 0..10 {
            let (wall, steps) = timings(world, &mut rng, el.counts());
            el.report_timing(&wall, &steps, 1.0).expect("matching lengths");
        }
        let counts = el.counts().to_vec();
        let fresh = || {
            Dispatcher::new(world, bs, samples / bs, epochs, Cutting::Progressive { min_chunk: 4 })
        };
        let mut book = fresh();
        let mut rank = 0;
        let id = BenchmarkId::new(
            bench_name("cpu", "chunk_dispatch", Unit::Elements),
            format!("w{world}"),
        );
        g.bench_function(id, |b| {
            b.iter(|| {
                rank = (rank + 1) % world;
                match book.next_chunk(rank, &counts, true, Instant::now()) {
                    Some(chunk) => {
                        let work = WorkTally {
                            batches: chunk.batches(bs),
                            samples: chunk.len,
                            ..WorkTally::default()
                        };
                        assert!(book.complete(rank, &chunk, &work, Instant::now()), "a held chunk");
                    }
                    None => book = fresh(),
                }
                while book.pop_complete().is_some() {}
                std::hint::black_box(book.oldest())
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = elche_report, chunk_dispatch
}
criterion_main!(benches);

//! Collective benchmarks: HostComm all-reduce (2 and 4 ranks) against the machine's memcpy.
//!
//! All-reduce throughput is *algorithm bandwidth*: bytes of one rank's buffer per operation.
//! Memcpy throughput follows the shared convention, bytes read plus bytes written (twice the
//! buffer), so it is the memory traffic one copy generates. A `W`-rank HostComm all-reduce reads
//! every rank's buffer once and writes every rank's buffer once: `2·W·bytes` of traffic, so its
//! fraction of copy bandwidth is `2·W·algbw / memcpy`.

use std::sync::mpsc;
use std::thread;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use flodl_benches::{Unit, bench_name, criterion_config};
use flodl_nccl::HostComm;

/// Rank threads 1..W of a HostComm group, each running as many all-reduces as it is told.
struct Ranks {
    orders: Vec<mpsc::SyncSender<u64>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Ranks {
    /// Spawns ranks 1.. of `comms` with buffers of `len` floats; returns them and rank 0.
    fn spawn(mut comms: Vec<HostComm>, len: usize) -> (Ranks, HostComm) {
        let first = comms.remove(0);
        let weight = 1.0 / (comms.len() + 1) as f32;
        let (orders, threads) = comms
            .into_iter()
            .map(|mut comm| {
                let (tx, rx) = mpsc::sync_channel::<u64>(1);
                let handle = thread::spawn(move || {
                    let mut buf = vec![comm.rank() as f32; len];
                    while let Ok(iters) = rx.recv() {
                        for _ in 0..iters {
                            if comm.all_reduce_weighted_f32(&mut [&mut buf], weight).is_err() {
                                return;
                            }
                        }
                    }
                });
                (tx, handle)
            })
            .unzip();
        (Ranks { orders, threads }, first)
    }

    fn start(&self, iters: u64) {
        for order in &self.orders {
            // A rank that stopped makes rank 0 fail loudly on its next operation.
            let _ = order.send(iters);
        }
    }

    fn stop(self) {
        drop(self.orders);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

fn collective(c: &mut Criterion) {
    let mut group = c.benchmark_group("collective");
    for len in [1usize << 20, 10 << 20] {
        let label = format!("{}M", len >> 20);
        let bytes = (len * size_of::<f32>()) as u64;
        group.throughput(Unit::Bytes.throughput(2 * bytes));
        let src = vec![1.5f32; len];
        let mut dst = vec![0.0f32; len];
        group.bench_function(
            BenchmarkId::new(bench_name("cpu", "memcpy", Unit::Bytes), &label),
            |b| b.iter(|| dst.copy_from_slice(std::hint::black_box(&src))),
        );
        group.bench_function(
            BenchmarkId::new(bench_name("cpu", "memcpy_2threads", Unit::Bytes), &label),
            |b| {
                b.iter(|| {
                    let half = len / 2;
                    let (d0, d1) = dst.split_at_mut(half);
                    let (s0, s1) = src.split_at(half);
                    thread::scope(|s| {
                        s.spawn(|| d1.copy_from_slice(s1));
                        d0.copy_from_slice(s0);
                    });
                })
            },
        );
        group.throughput(Unit::Bytes.throughput(bytes));
        for world in [2usize, 4] {
            let (ranks, mut first) = Ranks::spawn(HostComm::group(world), len);
            let weight = 1.0 / world as f32;
            let mut buf = vec![0.0f32; len];
            let name = bench_name("cpu", &format!("host_all_reduce_{world}ranks"), Unit::Bytes);
            group.bench_function(BenchmarkId::new(name, &label), |b| {
                b.iter_custom(|iters| {
                    ranks.start(iters);
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        if let Err(e) = first.all_reduce_weighted_f32(&mut [&mut buf], weight) {
                            panic!("all-reduce failed: {e}");
                        }
                    }
                    start.elapsed()
                })
            });
            drop(first);
            ranks.stop();
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = collective
}
criterion_main!(benches);

//! Collective benchmarks: HostComm all-reduce (2 and 4 ranks) against the machine's memcpy.
//!
//! All-reduce throughput is *algorithm bandwidth*: bytes of one rank's buffer per operation.
//! Memcpy throughput follows the shared convention, bytes read plus bytes written (twice the
//! buffer), so it is the memory traffic one copy generates. A `W`-rank HostComm all-reduce reads
//! every rank's buffer once and writes every rank's buffer once: `2·W·bytes` of traffic, so its
//! fraction of copy bandwidth is `2·W·algbw / memcpy`.
//!
//! On a shared machine wall time mostly measures how much CPU the scheduler grants, so the
//! `*_cputime` entries time the same work by the CPU time its threads consumed (summed over
//! threads, from `/proc/thread-self/schedstat`) and count every byte read and written: their
//! throughput is memory traffic per CPU-second, comparable between the all-reduce and memcpy
//! whatever the load. They are left out where schedstat is unavailable.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use flodl_benches::{Unit, bench_name, criterion_config};
use flodl_nccl::HostComm;

/// CPU time the calling thread has consumed, if the kernel reports it.
fn thread_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok().map(Duration::from_nanos)
}

/// What timing a batch of operations reports: the wall time, and the CPU time of every thread
/// involved (if known).
#[derive(Debug, Clone, Copy)]
struct Timing {
    wall: Duration,
    cpu: Option<Duration>,
}

/// Rank threads 1..W of a HostComm group, each running as many all-reduces as it is told and
/// answering with the CPU time they took.
struct Ranks {
    orders: Vec<mpsc::SyncSender<u64>>,
    reports: mpsc::Receiver<Option<Duration>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Ranks {
    /// Spawns ranks 1.. of `comms` with buffers of `len` floats; returns them and rank 0.
    fn spawn(mut comms: Vec<HostComm>, len: usize) -> (Ranks, HostComm) {
        let first = comms.remove(0);
        let weight = 1.0 / (comms.len() + 1) as f32;
        let (report, reports) = mpsc::sync_channel(comms.len());
        let (orders, threads) = comms
            .into_iter()
            .map(|mut comm| {
                let (tx, rx) = mpsc::sync_channel::<u64>(1);
                let report = report.clone();
                let handle = thread::spawn(move || {
                    let mut buf = vec![comm.rank() as f32; len];
                    while let Ok(iters) = rx.recv() {
                        let start = thread_cpu_time();
                        for _ in 0..iters {
                            if comm.all_reduce_weighted_f32(&mut [&mut buf], weight).is_err() {
                                return;
                            }
                        }
                        let cpu = thread_cpu_time().zip(start).map(|(end, start)| end - start);
                        if report.send(cpu).is_err() {
                            return;
                        }
                    }
                });
                (tx, handle)
            })
            .unzip();
        (Ranks { orders, reports, threads }, first)
    }

    /// Runs `iters` all-reduces on every rank (rank 0 on the calling thread).
    fn run(&self, first: &mut HostComm, buf: &mut [f32], iters: u64) -> Timing {
        for order in &self.orders {
            // A rank that stopped makes rank 0 fail loudly below.
            let _ = order.send(iters);
        }
        let weight = 1.0 / (self.orders.len() + 1) as f32;
        let cpu_start = thread_cpu_time();
        let start = Instant::now();
        for _ in 0..iters {
            if let Err(e) = first.all_reduce_weighted_f32(&mut [&mut *buf], weight) {
                panic!("all-reduce failed: {e}");
            }
        }
        let wall = start.elapsed();
        let mut cpu = thread_cpu_time().zip(cpu_start).map(|(end, start)| end - start);
        for _ in &self.orders {
            let theirs = self.reports.recv().ok().flatten();
            cpu = cpu.zip(theirs).map(|(a, b)| a + b);
        }
        Timing { wall, cpu }
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
    let has_cpu_time = thread_cpu_time().is_some();
    for len in [1usize << 20, 10 << 20] {
        let label = format!("{}M", len >> 20);
        let bytes = (len * size_of::<f32>()) as u64;
        let src = vec![1.5f32; len];
        let mut dst = vec![0.0f32; len];
        group.throughput(Unit::Bytes.throughput(2 * bytes));
        group.bench_function(
            BenchmarkId::new(bench_name("cpu", "memcpy", Unit::Bytes), &label),
            |b| {
                b.iter(|| {
                    std::hint::black_box(&mut dst).copy_from_slice(std::hint::black_box(&src))
                })
            },
        );
        if has_cpu_time {
            group.bench_function(
                BenchmarkId::new(bench_name("cpu", "memcpy_cputime", Unit::Bytes), &label),
                |b| {
                    b.iter_custom(|iters| {
                        let start = thread_cpu_time().unwrap_or_default();
                        for _ in 0..iters {
                            std::hint::black_box(&mut dst)
                                .copy_from_slice(std::hint::black_box(&src));
                        }
                        thread_cpu_time().unwrap_or_default().saturating_sub(start)
                    })
                },
            );
        }
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
        for world in [2usize, 4] {
            let (ranks, mut first) = Ranks::spawn(HostComm::group(world), len);
            let mut buf = vec![0.0f32; len];
            let op = format!("host_all_reduce_{world}ranks");
            group.throughput(Unit::Bytes.throughput(bytes));
            group.bench_function(
                BenchmarkId::new(bench_name("cpu", &op, Unit::Bytes), &label),
                |b| b.iter_custom(|iters| ranks.run(&mut first, &mut buf, iters).wall),
            );
            if has_cpu_time {
                let op = format!("{op}_cputime");
                group.throughput(Unit::Bytes.throughput(2 * world as u64 * bytes));
                group.bench_function(
                    BenchmarkId::new(bench_name("cpu", &op, Unit::Bytes), &label),
                    |b| {
                        b.iter_custom(|iters| {
                            ranks.run(&mut first, &mut buf, iters).cpu.unwrap_or_default()
                        })
                    },
                );
            }
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

//! Kernel benchmarks: weighted sum beside memcpy, gemm, L2 norm (CPU, and CUDA when present).
//!
//! Throughput follows the shared convention: bytes read plus bytes written. A `W`-input weighted
//! sum of `N` floats moves `(W + 1)·N·4` bytes; a memcpy of `N` floats moves `2·N·4`; an L2 norm
//! reads `N·4`. Gemm counts `2·n³` flops. CPU gemm runs on a 1-thread stream; the weighted sum
//! and the norm run on a 1-thread stream (`_1thread`, like the single-threaded memcpy) and on a
//! stream with every core.
//!
//! On Linux the single-threaded CPU cases are measured a second time in thread CPU time
//! (`_cputime` ids): on a shared machine, time the thread spends descheduled is not the
//! kernel's, and these ids leave it out (memory stalls still count). Wall-clock ids are the
//! primary figures.

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, criterion_group, criterion_main};
use flodl_benches::{Unit, bench_name, criterion_config, time_iters};
use flodl_tensor::ops::{self, Transpose};
use flodl_tensor::{DType, Device, Stream, Tensor, gpu_skip_reason};

/// 16M floats (64 MiB): far larger than any cache.
const N: usize = 16 << 20;

fn streams(threads: Option<usize>) -> Vec<Stream> {
    let mut v = vec![threads.map_or_else(Stream::cpu, Stream::cpu_with_threads)];
    match gpu_skip_reason() {
        None => match Stream::new(Device::Cuda(0)) {
            Ok(s) => v.push(s),
            Err(e) => eprintln!("cuda benches skipped: {e}"),
        },
        Some(reason) => eprintln!("cuda benches skipped: {reason}"),
    }
    v
}

/// The calling thread's CPU time (Linux, 64-bit).
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod thread_clock {
    use std::time::Duration;

    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }

    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }

    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

    pub(crate) fn now() -> Option<Duration> {
        let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec (i64 fields on 64-bit Linux) and the clock
        // id is the thread CPU-time clock every Linux kernel provides.
        let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
mod thread_clock {
    pub(crate) fn now() -> Option<std::time::Duration> {
        None
    }
}

/// Benchmarks `run` (single-threaded CPU work) under `op` in wall time and, where the thread
/// clock exists, under `op_cputime` in thread CPU time.
fn single_thread(
    g: &mut BenchmarkGroup<'_, WallTime>,
    op: &str,
    param: &str,
    mut run: impl FnMut(),
) {
    g.bench_function(BenchmarkId::new(bench_name("cpu", op, Unit::Bytes), param), |b| {
        b.iter(&mut run)
    });
    if thread_clock::now().is_some() {
        let id = BenchmarkId::new(bench_name("cpu", &format!("{op}_cputime"), Unit::Bytes), param);
        g.bench_function(id, |b| {
            b.iter_custom(|iters| {
                let start = thread_clock::now().unwrap_or_default();
                for _ in 0..iters {
                    run();
                }
                thread_clock::now().unwrap_or_default().saturating_sub(start)
            })
        });
    }
}

fn kernels(c: &mut Criterion) {
    let mut g = c.benchmark_group("kernels");

    // Plain memcpy of the same size: the bandwidth yardstick.
    let src = vec![1.0f32; N];
    let mut dst = vec![0.0f32; N];
    g.throughput(Unit::Bytes.throughput((2 * N * 4) as u64));
    single_thread(&mut g, "memcpy", "16M", || dst.copy_from_slice(std::hint::black_box(&src)));
    drop((src, dst));

    // The averaging path on a 1-thread stream (a CPU rank), wall and CPU time.
    let one = Stream::cpu_with_threads(1);
    let inputs: Vec<Tensor> =
        (0..8).map(|i| Tensor::rand_uniform(&[N], -1.0, 1.0, i, &one).expect("input")).collect();
    let mut out = Tensor::zeros(&[N], DType::F32, &one).expect("output");
    for w in [2usize, 4, 8] {
        let refs: Vec<&Tensor> = inputs.iter().take(w).collect();
        let weights = vec![1.0 / w as f32; w];
        g.throughput(Unit::Bytes.throughput(((w + 1) * N * 4) as u64));
        single_thread(&mut g, "weighted_sum_1thread", &format!("W{w}_16M"), || {
            ops::weighted_sum(&refs, &weights, &mut out, &one).expect("weighted_sum")
        });
    }
    g.throughput(Unit::Bytes.throughput((N * 4) as u64));
    single_thread(&mut g, "l2_norm_1thread", "16M", || {
        std::hint::black_box(ops::l2_norm(&inputs[0], &one).expect("l2_norm"));
    });
    drop((inputs, out));

    // The same on a stream with every core, and on CUDA when present.
    for s in streams(None) {
        let dev = s.device();
        let sync = || s.synchronize().expect("stream synchronize");
        let inputs: Vec<Tensor> =
            (0..8).map(|i| Tensor::rand_uniform(&[N], -1.0, 1.0, i, &s).expect("input")).collect();
        let mut out = Tensor::zeros(&[N], DType::F32, &s).expect("output");
        for w in [2usize, 4, 8] {
            let refs: Vec<&Tensor> = inputs.iter().take(w).collect();
            let weights = vec![1.0 / w as f32; w];
            g.throughput(Unit::Bytes.throughput(((w + 1) * N * 4) as u64));
            let id =
                BenchmarkId::new(bench_name(dev, "weighted_sum", Unit::Bytes), format!("W{w}_16M"));
            g.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    time_iters(
                        iters,
                        || ops::weighted_sum(&refs, &weights, &mut out, &s).expect("weighted_sum"),
                        sync,
                    )
                })
            });
        }
        g.throughput(Unit::Bytes.throughput((N * 4) as u64));
        g.bench_function(BenchmarkId::new(bench_name(dev, "l2_norm", Unit::Bytes), "16M"), |b| {
            b.iter_custom(|iters| {
                time_iters(
                    iters,
                    || {
                        std::hint::black_box(ops::l2_norm(&inputs[0], &s).expect("l2_norm"));
                    },
                    sync,
                )
            })
        });
    }

    // Gemm: single-threaded on the CPU, cuBLAS on CUDA.
    for s in streams(Some(1)) {
        let dev = s.device();
        let sync = || s.synchronize().expect("stream synchronize");
        for n in [512usize, 1024] {
            let a = Tensor::rand_uniform(&[n, n], -1.0, 1.0, 1, &s).expect("a");
            let bm = Tensor::rand_uniform(&[n, n], -1.0, 1.0, 2, &s).expect("b");
            let mut cm = Tensor::zeros(&[n, n], DType::F32, &s).expect("c");
            let mut run = || {
                ops::gemm(1.0, &a, Transpose::No, &bm, Transpose::No, 0.0, &mut cm, &s)
                    .expect("gemm")
            };
            g.throughput(Unit::Flops.throughput(2 * (n as u64).pow(3)));
            let op = if dev.is_cpu() { "gemm_1thread" } else { "gemm" };
            g.bench_function(BenchmarkId::new(bench_name(dev, op, Unit::Flops), n), |b| {
                b.iter_custom(|iters| time_iters(iters, &mut run, sync))
            });
            if dev.is_cpu() && thread_clock::now().is_some() {
                let id = BenchmarkId::new(bench_name(dev, "gemm_1thread_cputime", Unit::Flops), n);
                g.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        let start = thread_clock::now().unwrap_or_default();
                        for _ in 0..iters {
                            run();
                        }
                        thread_clock::now().unwrap_or_default().saturating_sub(start)
                    })
                });
            }
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = kernels
}
criterion_main!(benches);

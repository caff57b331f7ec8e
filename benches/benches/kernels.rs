//! Kernel benchmarks: weighted sum beside memcpy, gemm, L2 norm (CPU, and CUDA when present).
//!
//! Throughput follows the shared convention: bytes read plus bytes written. A `W`-input weighted
//! sum of `N` floats moves `(W + 1)·N·4` bytes; a memcpy of `N` floats moves `2·N·4`; an L2 norm
//! reads `N·4`. Gemm counts `2·n³` flops. CPU gemm runs on a 1-thread stream; the other CPU
//! kernels use a stream with every core, as the averaging path does.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
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

fn kernels(c: &mut Criterion) {
    let mut g = c.benchmark_group("kernels");

    // Plain memcpy of the same size: the bandwidth yardstick.
    let src = vec![1.0f32; N];
    let mut dst = vec![0.0f32; N];
    g.throughput(Unit::Bytes.throughput((2 * N * 4) as u64));
    g.bench_function(BenchmarkId::new(bench_name("cpu", "memcpy", Unit::Bytes), "16M"), |b| {
        b.iter(|| dst.copy_from_slice(std::hint::black_box(&src)))
    });
    drop((src, dst));

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

    for s in streams(Some(1)) {
        let dev = s.device();
        let sync = || s.synchronize().expect("stream synchronize");
        for n in [512usize, 1024] {
            let a = Tensor::rand_uniform(&[n, n], -1.0, 1.0, 1, &s).expect("a");
            let bm = Tensor::rand_uniform(&[n, n], -1.0, 1.0, 2, &s).expect("b");
            let mut cm = Tensor::zeros(&[n, n], DType::F32, &s).expect("c");
            g.throughput(Unit::Flops.throughput(2 * (n as u64).pow(3)));
            let op = if dev.is_cpu() { "gemm_1thread" } else { "gemm" };
            g.bench_function(BenchmarkId::new(bench_name(dev, op, Unit::Flops), n), |b| {
                b.iter_custom(|iters| {
                    time_iters(
                        iters,
                        || {
                            ops::gemm(1.0, &a, Transpose::No, &bm, Transpose::No, 0.0, &mut cm, &s)
                                .expect("gemm")
                        },
                        sync,
                    )
                })
            });
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

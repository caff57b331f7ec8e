//! Quantization benchmarks: the wire formats' encode and decode beside a plain f32 copy.
//!
//! Throughput follows the shared convention, bytes read plus bytes written: a copy of `N` floats
//! moves `2·N·4` bytes; quantizing reads `N·4` and writes `encoded_len(N)`; dequantizing the
//! reverse; error feedback reads the delta and reads and writes the residual (`3·N·4`) besides
//! the encoded bytes. Every case runs on a 1-thread stream (like the copy) and on a stream with
//! every core (`_all` ids). The CPU kernels only (a CUDA version does not exist yet).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use flodl_benches::{Unit, bench_name, criterion_config};
use flodl_tensor::quant::QuantFormat;
use flodl_tensor::{DType, ErrorFeedback, Stream, Tensor, ops};

/// 16M floats (64 MiB): far larger than any cache.
const N: usize = 16 << 20;

fn quant(c: &mut Criterion) {
    let mut group = c.benchmark_group("quant");
    let one = Stream::cpu_with_threads(1);
    let x = Tensor::rand_uniform(&[N], -1.0, 1.0, 7, &one).expect("input");
    let src = x.to_vec::<f32>(&one).expect("host copy");
    let mut dst = vec![0.0f32; N];
    group.throughput(Unit::Bytes.throughput(2 * 4 * N as u64));
    group
        .bench_function(BenchmarkId::new(bench_name("cpu", "copy_f32", Unit::Bytes), "16M"), |b| {
            b.iter(|| dst.copy_from_slice(std::hint::black_box(&src)))
        });
    for (s, tag) in [(Stream::cpu_with_threads(1), ""), (Stream::cpu(), "_all")] {
        let x = Tensor::from_slice(&src, &[N], &s).expect("input");
        let mut y = Tensor::zeros(&[N], DType::F32, &s).expect("output");
        for f in QuantFormat::ALL {
            let mut bytes = vec![0u8; f.encoded_len(N)];
            let moved = (4 * N + bytes.len()) as u64;
            group.throughput(Unit::Bytes.throughput(moved));
            let id = |op: &str| {
                BenchmarkId::new(bench_name("cpu", &format!("{op}_{f}{tag}"), Unit::Bytes), "16M")
            };
            group.bench_function(id("quantize"), |b| {
                b.iter(|| ops::quantize(f, &x, &mut bytes, &s).expect("quantize"))
            });
            group.bench_function(id("dequantize"), |b| {
                b.iter(|| ops::dequantize(f, &bytes, &mut y, &s).expect("dequantize"))
            });
            let mut state = ErrorFeedback::new(f, N, &s).expect("state");
            group.throughput(Unit::Bytes.throughput(moved + 2 * 4 * N as u64));
            group.bench_function(id("feedback"), |b| {
                b.iter(|| state.encode(&x, &mut bytes, &s).expect("encode"))
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = quant
}
criterion_main!(benches);

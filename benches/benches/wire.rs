//! A model-sized state through one connection's frames in every wire format: the rank encoding
//! its snapshot, the controller decoding it, the controller encoding a consensus update (each
//! through that end's coder under int8 and q4: the delta from the view, quantized, error
//! feedback). The state is the MLP 784-4096-4096-10's (20M parameters, 80 MB in f32).
//!
//! Throughput is the state's f32 bytes per operation (80 MB), so the formats compare directly.

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use flodl_benches::{Unit, bench_name, criterion_config};
use flodl_ddp::WireFormat;
use flodl_ddp::wire_rig::Rig;

/// The tensors of MLP 784-4096-4096-10: weight and bias of each layer.
const SIZES: [usize; 6] = [784 * 4096, 4096, 4096 * 4096, 4096, 4096 * 10, 10];

fn wire(c: &mut Criterion) {
    let mut group = c.benchmark_group("wire");
    group.sample_size(10);
    let n: usize = SIZES.iter().sum();
    group.throughput(Unit::Bytes.throughput(4 * n as u64));
    for format in WireFormat::ALL {
        let mut rig = Rig::new(format, &SIZES).expect("rig");
        let id = |op: &str| {
            BenchmarkId::new(
                bench_name("cpu", &format!("{op}_{}", format.name()), Unit::Bytes),
                "80MB",
            )
        };
        let snapshot = rig.snapshot();
        group.bench_function(id("snapshot_encode"), |b| {
            b.iter_batched(
                || snapshot.clone(),
                |s| rig.encode_snapshot(s).expect("encode"),
                BatchSize::PerIteration,
            )
        });
        let bytes = rig.encode_snapshot(snapshot.clone()).expect("encode");
        group.bench_function(id("snapshot_decode"), |b| {
            b.iter(|| rig.decode_snapshot(&bytes).expect("decode"))
        });
        let update = rig.update();
        group.bench_function(id("update_encode"), |b| {
            b.iter_batched(
                || update.clone(),
                |u| rig.encode_update(u).expect("encode"),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = criterion_config().warm_up_time(std::time::Duration::from_millis(500));
    targets = wire
}
criterion_main!(benches);

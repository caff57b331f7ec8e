//! DDP benchmarks: one training step of the reference MLP, and one DDP step end to end.
//!
//! Workload of the performance targets: MNIST, MLP 784-256-128-10, batch 64, SGD lr 0.05
//! momentum 0.9, one thread per rank.
//!
//! - `cpu_mlp_step@sample`: forward, backward and optimizer step of one rank on a resident batch
//!   (the compute floor of every mode).
//! - `cpu_ddp_<policy>_<backend>_2ranks@sample`: a step of a 2-rank run through the whole runtime
//!   (dispatch, fetch, upload, step, reduces, metrics), timed over the run's training wall time
//!   (replica construction excluded) and divided by the steps each rank trained; throughput
//!   counts the samples of both ranks.

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use flodl_benches::{Unit, bench_name, criterion_config};
use flodl_data::{Dataset, HostBatch, Mnist, Split, Subset, Verify};
use flodl_ddp::{Backend, Batch, Devices, Mlp, MlpConfig, Optimizer, Policy, Replica, Trainer};
use flodl_tensor::{Device, Stream, Tensor};

const BATCH: usize = 64;

fn mlp() -> MlpConfig {
    MlpConfig::new(&[784, 256, 128, 10], Optimizer::sgd(0.9))
}

fn mnist() -> Option<Arc<Mnist>> {
    match Mnist::load(flodl_data::mnist::vendored_dir(), Split::Train, Verify::Skip) {
        Ok(m) => Some(Arc::new(m)),
        Err(e) => {
            eprintln!("skipped: MNIST unavailable ({e})");
            None
        }
    }
}

fn mlp_step(c: &mut Criterion, data: &Mnist) -> Result<(), Box<dyn std::error::Error>> {
    let stream = Stream::cpu_with_threads(1);
    let mut model = Mlp::new(&mlp(), BATCH, 42, &stream)?;
    let mut host = HostBatch::new(data.layout(), Device::Cpu);
    let picks: Vec<usize> = (0..BATCH).collect();
    data.fetch(&picks, &mut host)?;
    let x = Tensor::from_slice(host.f32(0)?, &[BATCH, 784], &stream)?;
    let y = Tensor::from_slice(host.i32(1)?, &[BATCH], &stream)?;
    let batch = Batch::new(vec![x, y])?;
    let mut g = c.benchmark_group("ddp");
    g.throughput(Unit::Samples.throughput(BATCH as u64));
    g.bench_function(bench_name("cpu", "mlp_step", Unit::Samples), |b| {
        b.iter(|| {
            // Errors cannot happen on these fixed shapes; a failure would show as a NaN loss.
            let loss = model.train_step(&batch).unwrap_or(f32::NAN);
            let _ = model.step(0.05);
            loss
        })
    });
    g.finish();
    Ok(())
}

fn ddp_step(c: &mut Criterion, data: &Arc<Mnist>) {
    // 100 steps per rank per epoch keep one run short; longer measurements run more epochs.
    let train: Arc<dyn Dataset> = Arc::new(Subset::first(data.clone(), 2 * BATCH * 100));
    let batches_per_rank = train.len() / BATCH / 2;
    let mut g = c.benchmark_group("ddp");
    g.throughput(Unit::Samples.throughput(2 * BATCH as u64));
    g.sample_size(10);
    for (policy, backend) in [
        (Policy::Sync, Backend::Collective),
        (Policy::Cadence, Backend::Collective),
        (Policy::Cadence, Backend::Host),
        (Policy::Async, Backend::Host),
    ] {
        let op = format!("ddp_{}_{}_2ranks", policy.name(), backend.name());
        g.bench_function(bench_name("cpu", &op, Unit::Samples), |b| {
            b.iter_custom(|iters| {
                // One run covers `epochs` passes; its time per step is scaled to `iters` steps.
                let epochs = (iters as usize).div_ceil(batches_per_rank).max(1);
                let run = Trainer::new(Mlp::factory(mlp()))
                    .dataset(train.clone())
                    .batch_size(BATCH)
                    .epochs(epochs)
                    .devices(Devices::Cpu(2))
                    .policy(policy)
                    .backend(backend)
                    .learning_rate(0.05)
                    .run()
                    .and_then(|h| h.join());
                let state = run.expect("a 2-rank CPU run of the reference MLP trains");
                let steps = (state.samples / (2 * BATCH)).max(1) as f64;
                Duration::from_secs_f64(state.train_ms / 1000.0 / steps * iters as f64)
            })
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(data) = mnist() else { return };
    if let Err(e) = mlp_step(c, &data) {
        eprintln!("mlp_step skipped: {e}");
    }
    ddp_step(c, &data);
}

criterion_group! {
    name = ddp;
    config = criterion_config();
    targets = benches
}
criterion_main!(ddp);

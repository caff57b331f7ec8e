//! GPU runs: every policy × backend on the visible GPUs, and GPU ranks mixed with CPU ranks.
//! Without a usable GPU each test prints `skipped: <reason>` and passes (fails under
//! `FLODL_REQUIRE_GPU=1`).

use std::sync::Arc;
use std::time::Duration;

use flodl_data::{Dataset, Mnist, Split, Subset, Verify};
use flodl_ddp::{Backend, Devices, Mlp, MlpConfig, Optimizer, Policy, Trainer};
use flodl_tensor::Device;

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// The GPU ranks to use: every GPU when there are two or more, else the one GPU twice (two
/// ranks on one device; the collective then goes through the host); `None` after a skip.
fn gpu_ranks() -> Option<Vec<Device>> {
    if let Some(reason) = flodl_tensor::gpu_skip_reason() {
        flodl_tensor::skip_or_fail(&reason);
        return None;
    }
    let n = flodl_tensor::cuda_device_count();
    Some(if n >= 2 { (0..n).map(Device::Cuda).collect() } else { vec![Device::Cuda(0); 2] })
}

fn run(devices: Vec<Device>, policy: Policy, backend: Backend) -> TestResult {
    let mnist = Mnist::load(flodl_data::mnist::vendored_dir(), Split::Train, Verify::Skip)?;
    let data: Arc<dyn Dataset> = Arc::new(Subset::first(mnist, 4096));
    let state = Trainer::new(Mlp::factory(MlpConfig::new(&[784, 128, 10], Optimizer::sgd(0.9))))
        .dataset(data)
        .batch_size(64)
        .epochs(2)
        .devices(Devices::List(devices))
        .policy(policy)
        .backend(backend)
        .learning_rate(0.05)
        .stall_timeout(Duration::from_secs(120))
        .run()?
        .join()?;
    let last = state.epochs.last().ok_or("no epoch")?;
    assert!(last.avg_loss < 0.6, "{policy:?} {backend:?}: loss {}", last.avg_loss);
    assert_eq!(last.samples, 4096);
    Ok(())
}

fn mode(policy: Policy, backend: Backend) -> TestResult {
    match gpu_ranks() {
        Some(devices) => run(devices, policy, backend),
        None => Ok(()),
    }
}

#[test]
fn sync_collective() -> TestResult {
    mode(Policy::Sync, Backend::Collective)
}

#[test]
fn sync_host() -> TestResult {
    mode(Policy::Sync, Backend::Host)
}

#[test]
fn cadence_collective() -> TestResult {
    mode(Policy::Cadence, Backend::Collective)
}

#[test]
fn cadence_host() -> TestResult {
    mode(Policy::Cadence, Backend::Host)
}

#[test]
fn async_collective() -> TestResult {
    mode(Policy::Async, Backend::Collective)
}

#[test]
fn async_host() -> TestResult {
    mode(Policy::Async, Backend::Host)
}

#[test]
fn mixed_gpu_cpu_host() -> TestResult {
    let Some(mut devices) = gpu_ranks() else { return Ok(()) };
    devices.truncate(1);
    devices.push(Device::Cpu);
    run(devices, Policy::Cadence, Backend::Host)
}

/// An NCCL group of one formed through the controller: a cluster run of one GPU process on the
/// collective backend goes through the coordinator, which asks its lowest rank for the group's
/// unique id and relays it back; the rank joins the group and trains with it.
#[test]
fn nccl_group_of_one_through_the_controller() -> TestResult {
    if let Some(reason) = flodl_tensor::gpu_skip_reason() {
        flodl_tensor::skip_or_fail(&reason);
        return Ok(());
    }
    let mnist = Mnist::load(flodl_data::mnist::vendored_dir(), Split::Train, Verify::Skip)?;
    let data: Arc<dyn Dataset> = Arc::new(Subset::first(mnist, 2048));
    let place = flodl_ddp::Cluster::in_memory(1)?.remove(0).join_timeout(Duration::from_secs(20));
    let started = Trainer::new(Mlp::factory(MlpConfig::new(&[784, 64, 10], Optimizer::sgd(0.9))))
        .dataset(data)
        .batch_size(64)
        .epochs(1)
        .devices(Devices::AllGpus)
        .policy(Policy::Sync)
        .backend(Backend::Collective)
        .learning_rate(0.05)
        .stall_timeout(Duration::from_secs(120))
        .cluster(place)
        .start()?;
    let state = match started {
        flodl_ddp::Started::Coordinator(handle) => handle.join()?,
        flodl_ddp::Started::Rank(_) => return Err("rank 0 did not host the controller".into()),
    };
    let last = state.epochs.last().ok_or("no epoch")?;
    assert_eq!(last.samples, 2048);
    assert!(state.reduces >= 32, "{} reduces", state.reduces);
    assert!(last.avg_loss < 1.0, "loss {}", last.avg_loss);
    Ok(())
}

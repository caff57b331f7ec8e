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

/// Rejoin on NCCL, through the controller: a cluster of two GPU processes (in memory, each on
/// its own GPU) on the collective backend; rank 1's process fails mid-run, rank 0 goes on in a
/// group of one, and a new process for rank 1 joins: a new NCCL group forms with it at the next
/// reduce, from which it holds the consensus and trains. Needs two GPUs (NCCL refuses two ranks
/// of one group on one GPU): with fewer it prints why and passes.
#[test]
fn nccl_rank_rejoins_through_the_controller() -> TestResult {
    use flodl_ddp::{Cluster, Error, FailingReplica, Failure, ReplicaContext, Started};
    if let Some(reason) = flodl_tensor::gpu_skip_reason() {
        flodl_tensor::skip_or_fail(&reason);
        return Ok(());
    }
    let gpus = flodl_tensor::cuda_device_count();
    if gpus < 2 {
        flodl_tensor::skip(&format!("an NCCL rejoin needs 2 or more GPUs, found {gpus}"));
        return Ok(());
    }
    const SAMPLES: usize = 4096;
    let mnist = Mnist::load(flodl_data::mnist::vendored_dir(), Split::Train, Verify::Skip)?;
    let data: Arc<dyn Dataset> = Arc::new(Subset::first(mnist, SAMPLES));
    let build = move |fail_at: Option<usize>| {
        let mlp = MlpConfig::new(&[784, 64, 10], Optimizer::sgd(0.9));
        let factory = move |ctx: &ReplicaContext| -> flodl_ddp::Result<FailingReplica<Mlp>> {
            let inner = Mlp::new(&mlp, ctx.batch_size, ctx.seed, &ctx.stream)?;
            Ok(FailingReplica::new(inner, fail_at, Failure::Error))
        };
        // Each batch held 200 times its compute: the run outlasts the death and the rejoin.
        Trainer::new(factory)
            .dataset(data.clone())
            .batch_size(32)
            .epochs(8)
            .devices(Devices::AllGpus)
            .policy(Policy::Cadence)
            .backend(Backend::Collective)
            .learning_rate(0.05)
            .slowdown(vec![200.0; 2])
            .stall_timeout(Duration::from_secs(120))
    };
    let wait = Duration::from_secs(60);
    let places = Cluster::in_memory(2)?;
    let controller = build(None).cluster(places[0].clone().join_timeout(wait));
    let controller = std::thread::spawn(move || match controller.start() {
        Ok(Started::Coordinator(handle)) => handle.join(),
        Ok(Started::Rank(_)) => Err(Error::Aborted),
        Err(e) => Err(e),
    });
    let place = places[1].clone().join_timeout(wait);
    let (doomed, again) = (build(Some(40)), build(None));
    let one = std::thread::spawn(move || -> std::result::Result<(), String> {
        let run = |t: Trainer| match t.cluster(place.clone()).start() {
            Ok(Started::Rank(rank)) => rank.join(),
            Ok(Started::Coordinator(_)) => Err(Error::Aborted),
            Err(e) => Err(e),
        };
        match run(doomed) {
            Err(Error::Rank { rank: 1, .. }) => {}
            other => return Err(format!("rank 1's first process: {other:?}")),
        }
        run(again).map_err(|e| format!("rank 1's second process: {e}"))
    });
    let state = controller.join().map_err(|_| "the controller panicked")??;
    one.join().map_err(|_| "rank 1's thread panicked")??;
    assert!(matches!(state.faults.as_slice(), [f] if f.rank == 1), "{:?}", state.faults);
    assert!(
        matches!(state.rejoins.as_slice(), [r] if r.rank == 1 && r.members == [0, 1]),
        "{:?}",
        state.rejoins
    );
    for e in &state.epochs {
        assert_eq!(e.samples, SAMPLES, "epoch {} trained {} samples", e.epoch, e.samples);
    }
    let last = state.epochs.last().ok_or("no epoch")?;
    assert!(last.ranks.get(1).is_some_and(|r| r.samples > 0), "rank 1 trained nothing: {last:?}");
    assert!(last.avg_loss < 1.0, "loss {}", last.avg_loss);
    Ok(())
}

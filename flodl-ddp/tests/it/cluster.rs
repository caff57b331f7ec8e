//! Cluster runs within one process: a controller and ranks that each think they are their own
//! process, joined through in-memory connections (every path but the transport, which the
//! CLI's launch tests cover over TLS on loopback).

use crate::common::{TestResult, mnist, train_subset};

use std::sync::Arc;
use std::time::Duration;

use flodl_data::{Dataset, Split, Subset};
use flodl_ddp::{
    Backend, Cluster, Devices, Error, Mlp, MlpConfig, Optimizer, Placement, Policy, Started,
    TrainedState, Trainer, WireFormat,
};

const WORLD: usize = 3;
const SAMPLES: usize = 4096;
/// Slack on accuracy between a cluster run and the in-process run of the same spec
/// (`Cadence` and `Async` runs of this size vary by a few points from run to run).
const BAND: f64 = 0.06;

fn trainer(policy: Policy, train: &Arc<dyn Dataset>, test: &Arc<dyn Dataset>) -> Trainer {
    let mlp = MlpConfig::new(&[784, 64, 10], Optimizer::sgd(0.9));
    Trainer::new(Mlp::factory(mlp))
        .dataset(train.clone())
        .test_dataset(test.clone(), 2)
        .devices(Devices::Cpu(WORLD))
        .policy(policy)
        .backend(Backend::Host)
        .batch_size(32)
        .epochs(2)
        .learning_rate(0.05)
        .stall_timeout(Duration::from_secs(30))
}

/// Runs a cluster of `trainers` (one per rank, in rank order) on in-memory connections;
/// returns the controller's outcome and every other rank's.
fn run_cluster(
    trainers: Vec<Trainer>,
) -> (flodl_ddp::Result<TrainedState>, Vec<flodl_ddp::Result<()>>) {
    let places = match Cluster::in_memory(trainers.len()) {
        Ok(p) => p,
        Err(e) => return (Err(e), Vec::new()),
    };
    let mut threads = Vec::new();
    for (trainer, place) in trainers.into_iter().zip(places) {
        let place = place.join_timeout(Duration::from_secs(20));
        threads.push(std::thread::spawn(move || match trainer.cluster(place).start() {
            Ok(Started::Coordinator(handle)) => Ok(Some(handle.join())),
            Ok(Started::Rank(rank)) => rank.join().map(|()| None),
            Err(e) => Err(e),
        }));
    }
    let mut controller = Err(Error::Aborted);
    let mut ranks = Vec::new();
    for (rank, thread) in threads.into_iter().enumerate() {
        let outcome = thread.join().unwrap_or(Err(Error::Aborted));
        match (rank, outcome) {
            (0, Ok(Some(state))) => controller = state,
            (0, Ok(None)) => controller = Err(Error::Aborted),
            (0, Err(e)) => controller = Err(e),
            (_, outcome) => ranks.push(outcome.map(|_| ())),
        }
    }
    (controller, ranks)
}

/// Every policy on the host backend: the cluster run trains every sample of every epoch,
/// every rank ends well, and its accuracy is in the band of the in-process run of the same
/// flags; the bf16 wire gives the same band.
#[test]
fn cluster_runs_match_in_process_runs() -> TestResult {
    let train = train_subset(SAMPLES);
    let test: Arc<dyn Dataset> = Arc::new(Subset::first(mnist(Split::Test), 2000));
    for (policy, wire) in [
        (Policy::Sync, WireFormat::F32),
        (Policy::Cadence, WireFormat::F32),
        (Policy::Async, WireFormat::Bf16),
    ] {
        let alone = trainer(policy, &train, &test).run()?.join()?;
        let spec = trainer(policy, &train, &test)
            .wire(wire)
            .cluster(Cluster::in_memory(WORLD)?.remove(0))
            .spec()?;
        assert_eq!(spec.placement, Placement::Processes);
        let trainers = (0..WORLD).map(|_| trainer(policy, &train, &test).wire(wire)).collect();
        let (controller, ranks) = run_cluster(trainers);
        let state = controller?;
        for (i, r) in ranks.into_iter().enumerate() {
            r.map_err(|e| format!("{policy:?}: rank {} ended badly: {e}", i + 1))?;
        }
        let per_epoch = (SAMPLES / 32) * 32;
        for e in &state.epochs {
            assert_eq!(
                e.samples, per_epoch,
                "{policy:?}: epoch {} trained {} samples",
                e.epoch, e.samples
            );
            assert_eq!(e.ranks.len(), WORLD);
            assert!(e.ranks.iter().all(|r| r.samples > 0), "{policy:?}: a rank trained nothing");
        }
        let (a, c) = (
            alone.final_eval().map_or(0.0, |e| e.accuracy),
            state.final_eval().map_or(0.0, |e| e.accuracy),
        );
        assert!(
            a > 0.8 && (a - c).abs() <= BAND,
            "{policy:?}/{wire}: in-process {a:.3}, cluster {c:.3}"
        );
    }
    Ok(())
}

/// A rank with another run specification is refused by the controller, which names it; the
/// rank sees its controller gone; a rank that never comes is named after the join timeout.
#[test]
fn mismatched_or_missing_ranks_are_named() -> TestResult {
    let train = train_subset(1024);
    let test: Arc<dyn Dataset> = Arc::new(Subset::first(mnist(Split::Test), 256));
    let mut trainers: Vec<Trainer> =
        (0..2).map(|_| trainer(Policy::Cadence, &train, &test)).collect();
    trainers.push(trainer(Policy::Cadence, &train, &test).seed(7));
    let (controller, ranks) = run_cluster(trainers);
    match controller {
        Err(Error::RunMismatch { rank: 2 }) => {}
        other => return Err(format!("expected rank 2 refused, got {other:?}").into()),
    }
    assert!(ranks.iter().all(Result::is_err), "a rank of a refused run ended well: {ranks:?}");
    let mut places = Cluster::in_memory(WORLD)?;
    let controller = places.remove(0).join_timeout(Duration::from_millis(300));
    match trainer(Policy::Cadence, &train, &test).cluster(controller).start() {
        Err(Error::RanksMissing { missing, .. }) if missing == [1, 2] => Ok(()),
        other => Err(format!("expected ranks 1 and 2 missing, got {other:?}").into()),
    }
}

/// The collective backend across processes needs the `mpi` feature (without it: one line
/// saying what to use; with it the controller is kept apart from the ranks), and a cluster
/// rank has no `DdpHandle`.
#[test]
fn cluster_runs_refuse_what_they_cannot_do() -> TestResult {
    let train = train_subset(1024);
    let test: Arc<dyn Dataset> = Arc::new(Subset::first(mnist(Split::Test), 256));
    let place = Cluster::in_memory(2)?.remove(0);
    match trainer(Policy::Cadence, &train, &test).backend(Backend::Collective).cluster(place).spec()
    {
        Ok(spec) if cfg!(feature = "mpi") && spec.controller_apart() => {}
        Err(Error::Config(why))
            if !cfg!(feature = "mpi") && why.contains("--backend host") && !why.contains('\n') => {}
        other => return Err(format!("collective across processes: {other:?}").into()),
    }
    let place = Cluster::in_memory(2)?.remove(1).join_timeout(Duration::from_millis(200));
    match trainer(Policy::Cadence, &train, &test).cluster(place).run() {
        Err(Error::Config(why)) if why.contains("Trainer::start") => Ok(()),
        other => Err(format!("run() on rank 1: {other:?}").into()),
    }
}

/// A new process joins a running run: the controller starts on a quorum of 2 of a world of 3,
/// and rank 2's process (a rank id never used yet) joins after the first epoch. It is
/// admitted at a reduce and trains; every epoch trains each of its samples exactly once, and
/// the accuracy is in the band of the in-process run.
#[test]
fn a_new_rank_joins_a_running_run() -> TestResult {
    let train = train_subset(SAMPLES);
    let test: Arc<dyn Dataset> = Arc::new(Subset::first(mnist(Split::Test), 2000));
    // About 2 s an epoch (each batch held 100 times its compute): rank 2 joins well before the end.
    let slow = |t: Trainer| t.epochs(5).slowdown(vec![100.0; WORLD]);
    let alone = slow(trainer(Policy::Cadence, &train, &test)).run()?.join()?;
    let mut places = Cluster::in_memory(WORLD)?.into_iter();
    let (zero, one, two) = match (places.next(), places.next(), places.next()) {
        (Some(a), Some(b), Some(c)) => (a, b, c),
        _ => return Err("three places".into()),
    };
    let (epoch_tx, epochs) = std::sync::mpsc::channel();
    let controller = slow(trainer(Policy::Cadence, &train, &test))
        .on_epoch(move |m| {
            let _ = epoch_tx.send(m.epoch);
        })
        .cluster(zero.quorum(2).join_timeout(Duration::from_secs(20)));
    let controller = std::thread::spawn(move || match controller.start() {
        Ok(Started::Coordinator(handle)) => handle.join(),
        Ok(Started::Rank(_)) => Err(Error::Aborted),
        Err(e) => Err(e),
    });
    let start_rank = |trainer: Trainer, place: Cluster| {
        std::thread::spawn(move || match trainer.cluster(place).start() {
            Ok(Started::Rank(rank)) => rank.join(),
            Ok(Started::Coordinator(_)) => Err(Error::Aborted),
            Err(e) => Err(e),
        })
    };
    let first = start_rank(slow(trainer(Policy::Cadence, &train, &test)), one);
    epochs.recv_timeout(Duration::from_secs(120))?;
    let late = start_rank(slow(trainer(Policy::Cadence, &train, &test)), two);
    let state = controller.join().map_err(|_| "the controller panicked")??;
    first.join().map_err(|_| "rank 1 panicked")??;
    late.join().map_err(|_| "rank 2 panicked")??;
    assert_eq!(state.rejoins.len(), 1, "{:?}", state.rejoins);
    assert_eq!((state.rejoins[0].rank, state.rejoins[0].members.clone()), (2, vec![0, 1, 2]));
    assert!(state.faults.is_empty(), "{:?}", state.faults);
    let per_epoch = (SAMPLES / 32) * 32;
    for e in &state.epochs {
        assert_eq!(e.samples, per_epoch, "epoch {} trained {} samples", e.epoch, e.samples);
    }
    let last = state.epochs.last().ok_or("no epoch")?;
    assert!(last.ranks.get(2).is_some_and(|r| r.samples > 0), "rank 2 trained nothing: {last:?}");
    let (a, c) = (
        alone.final_eval().map_or(0.0, |e| e.accuracy),
        state.final_eval().map_or(0.0, |e| e.accuracy),
    );
    assert!(a > 0.8 && (a - c).abs() <= BAND, "in-process {a:.3}, grown {c:.3}");
    Ok(())
}

//! Fault tolerance on CPU ranks: a rank whose replica fails, panics or hangs is declared dead
//! and the survivors finish the run, in every policy × backend.

use crate::common::{TestResult, mnist, train_subset};

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use flodl_data::{Dataset, Split, Subset};
use flodl_ddp::checkpoint::{Checkpoint, SaveReason};
use flodl_ddp::{
    Backend, Batch, DdpHandle, Devices, Error, FailingReplica, Failure, FaultCause, FaultEvent,
    Mlp, MlpConfig, Optimizer, Policy, Replica, ReplicaContext, Result, SampleAudit, TrainedState,
    Trainer,
};
use flodl_tensor::Tensor;
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

const POLICIES: [Policy; 3] = [Policy::Sync, Policy::Cadence, Policy::Async];
const BACKENDS: [Backend; 2] = [Backend::Collective, Backend::Host];
/// Samples trained per epoch, batch size and epochs of the fault runs.
const SAMPLES: usize = 8192 + 19;
const BATCH: usize = 32;
const EPOCHS: usize = 3;
/// The least test accuracy a run with a death must reach (measured: 0.87-0.90 without a death,
/// 0.865-0.91 with one).
const ACCURACY: f64 = 0.84;
/// The most accuracy a death may cost against the same run without it (`Cadence` and `Async`
/// runs of this size vary by about ±0.03 from run to run without any death).
const MAX_DROP: f64 = 0.05;

/// A gate a hung replica waits on until the test opens it (after the run), at most a minute so
/// a broken watchdog fails the test instead of hanging it (the gate then records that it gave
/// up).
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cond: Condvar,
    gave_up: std::sync::atomic::AtomicBool,
}

impl Gate {
    fn wait(&self) {
        let guard = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let waited = self.cond.wait_timeout_while(guard, Duration::from_secs(60), |open| !*open);
        if waited.is_ok_and(|(_, t)| t.timed_out()) {
            self.gave_up.store(true, std::sync::atomic::Ordering::Release);
        }
    }

    fn gave_up(&self) -> bool {
        self.gave_up.load(std::sync::atomic::Ordering::Acquire)
    }

    fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cond.notify_all();
    }
}

/// How the doomed rank goes.
#[derive(Clone)]
enum Fate {
    /// Its train step returns an error.
    Error,
    /// Its train step panics.
    Panic,
    /// Its train step blocks until the gate opens.
    Hang(Arc<Gate>),
}

/// An `Mlp` that meets its fate at its `at`-th train step; with `buffers`, it also holds a
/// small buffer and may meet a fate (an error is a panic there) the `n`-th time its buffers
/// are lent for writing (the rank's initial load is the first time, its `k`-th reduce the
/// `k + 1`-th).
struct Doomed {
    inner: Mlp,
    steps: usize,
    fate: Option<(usize, Fate)>,
    buffers: Vec<Tensor>,
    lent: usize,
    lend_fate: Option<(usize, Fate)>,
}

impl Doomed {
    fn new(ctx: &ReplicaContext, fate: Option<(usize, Fate)>) -> Result<Doomed> {
        let cfg = MlpConfig::new(&[784, 64, 10], Optimizer::sgd(0.9));
        Ok(Doomed {
            inner: Mlp::new(&cfg, ctx.batch_size, ctx.seed, &ctx.stream)?,
            steps: 0,
            fate,
            buffers: Vec::new(),
            lent: 0,
            lend_fate: None,
        })
    }
}

impl Replica for Doomed {
    fn train_step(&mut self, batch: &Batch) -> Result<f32> {
        self.steps += 1;
        match &self.fate {
            Some((at, fate)) if *at == self.steps => match fate {
                Fate::Error => return Err(Error::replica("injected fault")),
                Fate::Panic => panic!("injected panic"),
                Fate::Hang(gate) => gate.wait(),
            },
            _ => {}
        }
        self.inner.train_step(batch)
    }
    fn step(&mut self, lr: f32) -> Result<()> {
        self.inner.step(lr)
    }
    fn parameters(&self) -> &[Tensor] {
        self.inner.parameters()
    }
    fn parameters_mut(&mut self) -> &mut [Tensor] {
        self.inner.parameters_mut()
    }
    fn buffers(&self) -> &[Tensor] {
        &self.buffers
    }
    fn buffers_mut(&mut self) -> &mut [Tensor] {
        self.lent += 1;
        match &self.lend_fate {
            Some((at, Fate::Hang(gate))) if *at == self.lent => gate.wait(),
            Some((at, _)) if *at == self.lent => panic!("injected panic inside a reduce"),
            _ => {}
        }
        &mut self.buffers
    }
    fn evaluate_batch(&mut self, batch: &Batch) -> Result<Option<flodl_ddp::BatchEval>> {
        self.inner.evaluate_batch(batch)
    }
}

/// Every rank's audited picks: `[rank][epoch][sample]` counts.
type Seen = Arc<Mutex<Vec<Vec<Vec<u32>>>>>;

fn audit(ranks: usize) -> (Seen, SampleAudit) {
    let seen: Seen = Arc::new(Mutex::new(vec![vec![vec![0; SAMPLES]; EPOCHS]; ranks]));
    let log = seen.clone();
    let audit: SampleAudit = Arc::new(move |rank, epoch, picks: &[usize]| {
        let mut s = log.lock().unwrap_or_else(|e| e.into_inner());
        for &p in picks {
            s[rank][epoch][p] += 1;
        }
    });
    (seen, audit)
}

/// A 3-rank run of `policy` × `backend` in which `rank` meets `fate` at its step `at`.
fn trainer(policy: Policy, backend: Backend, doomed: Option<(usize, usize, Fate)>) -> Trainer {
    let factory = move |ctx: &ReplicaContext| -> Result<Doomed> {
        let fate = doomed
            .as_ref()
            .filter(|(rank, _, _)| *rank == ctx.rank)
            .map(|(_, at, fate)| (*at, fate.clone()));
        Doomed::new(ctx, fate)
    };
    let test: Arc<dyn Dataset> = Arc::new(Subset::first(mnist(Split::Test), 2000));
    Trainer::new(factory)
        .dataset(train_subset(SAMPLES))
        .test_dataset(test, EPOCHS)
        .batch_size(BATCH)
        .epochs(EPOCHS)
        .devices(Devices::Cpu(3))
        .policy(policy)
        .backend(backend)
        .learning_rate(0.05)
        .stall_timeout(Duration::from_secs(20))
        .watchdog(Duration::from_secs(3))
        .snapshot_timeout(Duration::from_secs(2), 3)
}

/// The final accuracy of a finished run, after checking its state is whole and finite.
fn checked_accuracy(state: &TrainedState, what: &str) -> std::result::Result<f64, String> {
    if state.epochs.len() != EPOCHS {
        return Err(format!("{what}: {} epochs", state.epochs.len()));
    }
    if state.params.is_empty() || state.params.iter().flat_map(|t| &t.data).any(|x| !x.is_finite())
    {
        return Err(format!("{what}: the final parameters are not finite"));
    }
    let eval = state.final_eval().ok_or_else(|| format!("{what}: no final evaluation"))?;
    Ok(eval.accuracy)
}

/// Checks the audit of a run in which `dead` died: in every epoch the survivors train no
/// sample twice and, with the dead rank's batches, cover every trained position at least once
/// (a sample is seen twice only when the dead rank had trained it in a chunk it never
/// finished, which went back to the living); in every epoch after the dead rank's last batch
/// the survivors train every sample exactly once. Returns the number of such epochs.
fn check_coverage(
    seen: &Seen,
    dead: usize,
    epochs: usize,
    what: &str,
) -> std::result::Result<usize, String> {
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    let trained = SAMPLES / BATCH * BATCH;
    let mut after_death = 0;
    for epoch in 0..epochs {
        let dead_counts = &seen[dead][epoch];
        let mut covered = 0;
        for sample in 0..SAMPLES {
            let living: u32 =
                (0..seen.len()).filter(|&r| r != dead).map(|r| seen[r][epoch][sample]).sum();
            let by_dead = dead_counts[sample];
            if living > 1 || by_dead > 1 {
                return Err(format!(
                    "{what} epoch {epoch}: sample {sample} trained {living}+{by_dead} times"
                ));
            }
            if living + by_dead > 0 {
                covered += 1;
            }
        }
        if covered != trained {
            return Err(format!("{what} epoch {epoch}: {covered} samples covered of {trained}"));
        }
        let dead_trained = dead_counts.iter().any(|&c| c > 0);
        let later_dead = (epoch..epochs).any(|e| seen[dead][e].iter().any(|&c| c > 0));
        if !later_dead {
            let once = (0..SAMPLES)
                .filter(|&s| (0..seen.len()).map(|r| seen[r][epoch][s]).sum::<u32>() == 1)
                .count();
            if once != trained {
                return Err(format!("{what} epoch {epoch} (after the death): {once} samples once"));
            }
            after_death += 1;
        } else if !dead_trained {
            // An epoch the dead rank skipped but trained later: impossible, epochs stream in order.
            return Err(format!("{what} epoch {epoch}: the dead rank trained a later epoch only"));
        }
    }
    Ok(after_death)
}

/// Reads the run's epochs until it ends, then its fault events, then joins it; the final
/// state carries the same events.
fn finish(mut handle: DdpHandle) -> Result<(TrainedState, Vec<FaultEvent>)> {
    while handle.next_metrics(Duration::from_secs(120)).is_some() {}
    let events = handle.poll_fault_events();
    let state = handle.join()?;
    assert_eq!(state.faults, events, "the final state carries the polled fault events");
    Ok((state, events))
}

fn one_fault(events: &[FaultEvent], rank: usize, what: &str) -> std::result::Result<(), String> {
    match events {
        [e] if e.rank == rank && !e.survivors.contains(&rank) && e.survivors.len() == 2 => Ok(()),
        other => Err(format!("{what}: expected one fault event for rank {rank}, got {other:?}")),
    }
}

/// In every policy × backend, a rank that fails or panics at a random step dies and the two
/// survivors finish the run: the death is reported, the epochs after it train every sample
/// exactly once (and the death's epoch every sample at least once), the final state is finite
/// and its accuracy stays close to a run without the death.
#[test]
fn survivors_finish_after_a_death_in_every_mode() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(61);
    let mut case = 0;
    for policy in POLICIES {
        for backend in BACKENDS {
            let rank = rng.random_range(0..3);
            // A step within the rank's first epoch or so (~85 batches each): the last epoch
            // then streams to the survivors alone.
            let at = rng.random_range(3..90);
            let fate = if case % 2 == 0 { Fate::Error } else { Fate::Panic };
            let kind = if case % 2 == 0 { "error" } else { "panic" };
            case += 1;
            let what = format!("{policy:?} {backend:?}, rank {rank} {kind} at step {at}");
            let (seen, audit) = audit(3);
            let dir = tempfile::tempdir()?;
            let handle = trainer(policy, backend, Some((rank, at, fate)))
                .sample_audit(audit)
                .checkpoint_dir(dir.path())
                .run()?;
            let (state, events) = finish(handle)?;
            // The survivors' final state is saved, and it is the state the run returned.
            let saved = Checkpoint::read(&dir.path().join("latest.fdlck"))?;
            assert_eq!(saved.reason, SaveReason::GracefulShutdown, "{what}");
            let first = saved.params.records().first().and_then(|r| r.to_f32_vec());
            assert_eq!(first.as_ref(), state.params.first().map(|p| &p.data), "{what}");
            one_fault(&events, rank, &what)?;
            let accuracy = checked_accuracy(&state, &what)?;
            let after = check_coverage(&seen, rank, EPOCHS, &what)?;
            let (clean, clean_events) = finish(trainer(policy, backend, None).run()?)?;
            let clean = checked_accuracy(&clean, &what)?;
            println!("{what}: accuracy {accuracy:.4} (clean {clean:.4}), {after} epochs after");
            assert!(clean_events.is_empty(), "{what}: a death in the clean run");
            assert!(accuracy >= ACCURACY, "{what}: accuracy {accuracy}");
            assert!(accuracy >= clean - MAX_DROP, "{what}: accuracy {accuracy}, clean {clean}");
            assert!(after >= 1, "{what}: no epoch after the death");
        }
    }
    Ok(())
}

/// Under `Sync` (3 CPU ranks, batches of 64) a rank that fails at its 100th step has had its
/// first 99 batches averaged into the consensus: the survivors train only the rest of its
/// share, so no sample but those of the failed batch is trained twice, and the epoch's metrics
/// (and the final state) count the 99 batches for the dead rank, on both backends.
#[test]
fn the_survivors_retrain_only_what_the_consensus_lacks() -> TestResult {
    const BATCH: usize = 64;
    const SHARE: usize = 120;
    let samples = 3 * SHARE * BATCH;
    for backend in BACKENDS {
        let what = format!("Sync {backend:?}");
        let seen: Arc<Mutex<Vec<Vec<u32>>>> = Arc::new(Mutex::new(vec![vec![0; samples]; 3]));
        let log = seen.clone();
        let audit: SampleAudit = Arc::new(move |rank, _epoch, picks: &[usize]| {
            let mut s = log.lock().unwrap_or_else(|e| e.into_inner());
            picks.iter().for_each(|&p| s[rank][p] += 1);
        });
        let factory = move |ctx: &ReplicaContext| -> Result<FailingReplica<Mlp>> {
            let cfg = MlpConfig::new(&[784, 64, 10], Optimizer::sgd(0.9));
            let inner = Mlp::new(&cfg, ctx.batch_size, ctx.seed, &ctx.stream)?;
            Ok(FailingReplica::new(inner, (ctx.rank == 1).then_some(100), Failure::Error))
        };
        let handle = Trainer::new(factory)
            .dataset(train_subset(samples))
            .batch_size(BATCH)
            .epochs(1)
            .devices(Devices::Cpu(3))
            .policy(Policy::Sync)
            .backend(backend)
            .learning_rate(0.05)
            .sample_audit(audit)
            .stall_timeout(Duration::from_secs(20))
            .watchdog(Duration::from_secs(3))
            .run()?;
        let (state, events) = finish(handle)?;
        one_fault(&events, 1, &what)?;
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        let twice = (0..samples).filter(|&p| seen[1][p] > 0 && seen[0][p] + seen[2][p] > 0).count();
        let missed = (0..samples).filter(|&p| seen.iter().all(|s| s[p] == 0)).count();
        assert!(twice <= BATCH, "{what}: {twice} samples trained by the dead rank and again");
        assert_eq!(missed, 0, "{what}: samples never trained");
        let epoch = state.epochs.first().ok_or("no epoch")?;
        let batches: Vec<usize> = epoch.ranks.iter().map(|r| r.batches).collect();
        assert_eq!(batches[1], 99, "{what}: the dead rank's batches {batches:?}");
        assert_eq!(batches.iter().sum::<usize>(), 3 * SHARE, "{what}: batches {batches:?}");
        assert_eq!(epoch.ranks[1].samples, 99 * BATCH, "{what}");
        assert_eq!(state.samples, samples, "{what}: samples in the final state");
    }
    Ok(())
}

/// When every rank dies (each at its own step, by error or panic) the run ends with the typed
/// unrecoverable error naming the loss of every rank, on both backends and in every policy,
/// without hanging.
#[test]
fn every_rank_dead_is_unrecoverable() -> TestResult {
    for policy in POLICIES {
        for backend in BACKENDS {
            let what = format!("{policy:?} {backend:?}");
            let factory = move |ctx: &ReplicaContext| -> Result<Doomed> {
                let fate = if ctx.rank == 1 { Fate::Panic } else { Fate::Error };
                Doomed::new(ctx, Some((2 + 3 * ctx.rank, fate)))
            };
            let dir = tempfile::tempdir()?;
            let handle = Trainer::new(factory)
                .checkpoint_dir(dir.path())
                .dataset(train_subset(2048))
                .batch_size(BATCH)
                .devices(Devices::Cpu(3))
                .policy(policy)
                .backend(backend)
                .stall_timeout(Duration::from_secs(20))
                .watchdog(Duration::from_secs(3))
                .run()?;
            match finish(handle) {
                Err(Error::Unrecoverable {
                    reason: SaveReason::AllRanksLost,
                    last,
                    bundle,
                    ..
                }) => {
                    assert!(last.is_some(), "{what}: no last error");
                    // A bundle with the reason (the starting state: no save was due yet).
                    let path = bundle.ok_or("no failure bundle")?;
                    let saved = Checkpoint::read(&path)?;
                    assert_eq!(saved.reason, SaveReason::AllRanksLost, "{what}");
                }
                Err(other) => panic!("{what}: unexpected error {other}"),
                Ok(_) => panic!("{what}: a run without ranks finished"),
            }
        }
    }
    Ok(())
}

/// A rank that stops answering (its train step blocks until the test ends) is declared dead by
/// the watchdog, and the run completes on the survivors, in every policy on both backends.
#[test]
fn watchdog_declares_a_hung_rank_dead() -> TestResult {
    let watchdog = Duration::from_secs(2);
    for policy in POLICIES {
        for backend in BACKENDS {
            let what = format!("{policy:?} {backend:?}");
            let gate = Arc::new(Gate::default());
            let (seen, audit) = audit(3);
            let handle = trainer(policy, backend, Some((2, 20, Fate::Hang(gate.clone()))))
                .epochs(2)
                .watchdog(watchdog)
                .sample_audit(audit)
                .run()?;
            let outcome = finish(handle);
            // The audit is read before the hung rank's thread (detached) is let go, so that
            // its later batches are not counted.
            let after = check_coverage(&seen, 2, 2, &what);
            gate.open();
            let (state, events) = outcome?;
            // The deaths first: a survivor declared dead too would have its unreduced work
            // trained again by the other, which the coverage check reads as trained twice.
            one_fault(&events, 2, &what)?;
            assert!(after? >= 1, "{what}: no epoch after the hang");
            match &events[0].cause {
                FaultCause::Silent { after } | FaultCause::MissedReduce { after, .. } => {
                    assert!(*after >= watchdog, "{what}: declared dead after {after:?}")
                }
                other => panic!("{what}: unexpected cause {other}"),
            }
            assert_eq!(state.epochs.len(), 2, "{what}");
            assert!(state.params.iter().flat_map(|t| &t.data).all(|x| x.is_finite()), "{what}");
        }
    }
    Ok(())
}

/// A rank that dies (panics, or hangs until the watchdog gives up on it) inside the `k`-th
/// reduce of a `Sync` run on the collective backend, after the parameters were averaged with
/// it and before the buffers were: the survivors restore their pre-reduce state and redo the
/// reduce without it, so the run ends bitwise where a run whose rank died at its `k`-th train
/// step (just before that reduce) ends.
#[test]
fn death_inside_a_reduce_is_redone_by_the_survivors() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
    let gate = Arc::new(Gate::default());
    for inside_fate in [Fate::Panic, Fate::Hang(gate.clone())] {
        let k = rng.random_range(2..50);
        let run = |inside: Option<Fate>| -> Result<(TrainedState, Vec<FaultEvent>)> {
            let factory = move |ctx: &ReplicaContext| -> Result<Doomed> {
                let doomed = ctx.rank == 2;
                let fate = (doomed && inside.is_none()).then_some((k, Fate::Error));
                let mut r = Doomed::new(ctx, fate)?;
                r.buffers = vec![Tensor::zeros(&[8], flodl_tensor::DType::F32, &ctx.stream)?];
                r.lend_fate = inside.clone().filter(|_| doomed).map(|f| (k + 1, f));
                Ok(r)
            };
            let handle = Trainer::new(factory)
                .dataset(train_subset(2048))
                .batch_size(BATCH)
                .epochs(2)
                .devices(Devices::Cpu(3))
                .policy(Policy::Sync)
                .backend(Backend::Collective)
                .learning_rate(0.05)
                .stall_timeout(Duration::from_secs(20))
                .watchdog(Duration::from_secs(2))
                .run()?;
            finish(handle)
        };
        let hangs = matches!(inside_fate, Fate::Hang(_));
        let (inside, inside_events) = run(Some(inside_fate))?;
        let (before, before_events) = run(None)?;
        one_fault(&inside_events, 2, &format!("inside reduce {k}"))?;
        one_fault(&before_events, 2, &format!("before reduce {k}"))?;
        let cause = &inside_events[0].cause;
        match cause {
            FaultCause::StuckInReduce { .. } => assert!(hangs, "{cause}"),
            FaultCause::Panicked { .. } => assert!(!hangs, "{cause}"),
            other => panic!("reduce {k}: unexpected cause {other}"),
        }
        assert!(inside.params == before.params, "reduce {k}: the final parameters differ");
        assert_eq!(inside.epochs.len(), 2);
    }
    // The hung rank's thread was detached: let it go.
    gate.open();
    Ok(())
}

/// Of two ranks one dies: the lone survivor (a host collective group of one) trains the rest of
/// the run alone, in every policy × backend.
#[test]
fn a_lone_survivor_finishes_the_run() -> TestResult {
    for policy in POLICIES {
        for backend in BACKENDS {
            let what = format!("{policy:?} {backend:?}");
            let factory = move |ctx: &ReplicaContext| -> Result<Doomed> {
                Doomed::new(ctx, (ctx.rank == 0).then_some((5, Fate::Error)))
            };
            let handle = Trainer::new(factory)
                .dataset(train_subset(2048))
                .batch_size(BATCH)
                .epochs(2)
                .devices(Devices::Cpu(2))
                .policy(policy)
                .backend(backend)
                .learning_rate(0.05)
                .stall_timeout(Duration::from_secs(20))
                .watchdog(Duration::from_secs(3))
                .run()?;
            let (state, events) = finish(handle)?;
            match events.as_slice() {
                [e] if e.rank == 0 && e.survivors == [1] => {}
                other => panic!("{what}: unexpected fault events {other:?}"),
            }
            assert_eq!(state.epochs.len(), 2, "{what}");
            assert_eq!(state.samples, 2 * 2048, "{what}");
            assert!(state.params.iter().flat_map(|t| &t.data).all(|x| x.is_finite()), "{what}");
        }
    }
    Ok(())
}

/// A run that fails (no failure allowed, one rank errs) while another rank hangs in its replica
/// returns the failure without waiting for the hung rank: `join` leaves its thread behind after
/// the stall timeout instead of joining it.
#[test]
fn a_failed_run_leaves_a_hung_rank_behind() -> TestResult {
    let gate = Arc::new(Gate::default());
    let hang = gate.clone();
    let factory = move |ctx: &ReplicaContext| -> Result<Doomed> {
        let fate = match ctx.rank {
            1 => Some((2, Fate::Error)),
            2 => Some((2, Fate::Hang(hang.clone()))),
            _ => None,
        };
        Doomed::new(ctx, fate)
    };
    let outcome = Trainer::new(factory)
        .dataset(train_subset(2048))
        .batch_size(BATCH)
        .devices(Devices::Cpu(3))
        .policy(Policy::Sync)
        .stall_timeout(Duration::from_secs(2))
        .watchdog(Duration::from_secs(30))
        .max_failures(0)
        .run()?
        .join();
    let gave_up = gate.gave_up();
    gate.open();
    match outcome {
        Err(Error::Rank { rank: 1, .. }) => {}
        other => panic!("unexpected outcome {:?}", other.map(|s| s.epochs.len())),
    }
    assert!(!gave_up, "join waited for the hung rank until its gate gave up");
    Ok(())
}

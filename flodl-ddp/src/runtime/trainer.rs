//! The `Trainer` builder: what to train, on which devices, how often to average.

use crate::contract::model_size::ModelSize;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flodl_data::Dataset;
use flodl_tensor::Device;

use crate::checkpoint::{Checkpoint, CheckpointError, SaveInterval};
use crate::config_error::{ConfigError, Field, Problem};
use crate::contract::replica::{Replica, ReplicaContext};
use crate::control::guard::{Guard, TREND_THRESHOLD, TREND_THRESHOLD_EASGD, TrendGuard};
use crate::control::outer::OuterKind;
use crate::control::policy::{Backend, Policy};
use crate::control::schedule::Schedule;
use crate::control::schedule_kind::ScheduleKind;
use crate::control::speed_change::SpeedChange;
use crate::cooperative::bridge::Bridge;
use crate::cooperative::worker::Worker;
use crate::link::frame::WireFormat;
use crate::runtime::cluster::{Cluster, RankHandle, Seat, Started, own_device};
use crate::runtime::engine::prefetch::Prefetch;
use crate::runtime::engine::run_config::{
    CheckpointPlan, EpochCallback, Factory, RunConfig, SampleAudit,
};
use crate::runtime::engine::staging::Staging;
use crate::runtime::handle::Cooperative;
use crate::runtime::handle::DdpHandle;
use crate::runtime::settings::RunSettings;
use crate::runtime::spec::{
    CheckpointSpec, CollectiveEngine, DataChecksums, DataSpec, ElCheKnobs, Machine, Placement,
    RunSpec,
};
use crate::state::HostTensor;
use crate::{Error, Result};

/// Which devices the ranks run on: one rank per device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    /// `n` CPU ranks, each a single thread.
    Cpu(usize),
    /// One rank per visible CUDA GPU.
    AllGpus,
    /// Exactly these devices, in rank order (CPU and GPUs may be mixed).
    List(Vec<Device>),
}

impl Devices {
    /// The devices, one per rank.
    ///
    /// # Errors
    /// [`Error::Invalid`] when the list is empty or `AllGpus` finds none.
    pub fn resolve(&self) -> Result<Vec<Device>> {
        let list = match self {
            Devices::Cpu(n) => vec![Device::Cpu; *n],
            Devices::AllGpus => (0..flodl_tensor::cuda_device_count()).map(Device::Cuda).collect(),
            Devices::List(list) => list.clone(),
        };
        if list.is_empty() {
            let why = match self {
                Devices::AllGpus => flodl_tensor::gpu_skip_reason()
                    .unwrap_or_else(|| "no CUDA device is visible".into()),
                _ => "no device given".into(),
            };
            return Err(
                ConfigError::unsupported(Field::Devices, format!("no rank to run: {why}")).into()
            );
        }
        Ok(list)
    }
}

/// Where a resumed run reads its checkpoint; both go through [`crate::checkpoint::locate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeFrom {
    /// The newest intact bundle of a checkpoint directory: `latest.fdlck`, or the highest step
    /// bundle when `latest` is missing or corrupt.
    Latest(PathBuf),
    /// This bundle file.
    File(PathBuf),
}

impl ResumeFrom {
    /// The path given.
    pub fn path(&self) -> &std::path::Path {
        match self {
            ResumeFrom::Latest(path) | ResumeFrom::File(path) => path,
        }
    }

    /// Finds and reads the bundle (format, checksum and invariants checked; compatibility is
    /// not); bundles passed over on the way are logged.
    ///
    /// # Errors
    /// As [`crate::checkpoint::locate`].
    fn read(&self) -> std::result::Result<Checkpoint, CheckpointError> {
        let found = crate::checkpoint::locate(self.path())?;
        for (path, why) in &found.skipped {
            tracing::warn!(path = %path.display(), %why, "checkpoint skipped");
        }
        Ok(found.checkpoint)
    }
}

/// The watchdog deadline unless [`Trainer::watchdog`] says otherwise.
pub(crate) const DEFAULT_WATCHDOG: Duration = Duration::from_secs(30);

/// The default divergence guard: the trend rule at 0.05, or 0.3 under EASGD blending.
fn default_guard(easgd: bool) -> Guard {
    let threshold = if easgd { TREND_THRESHOLD_EASGD } else { TREND_THRESHOLD };
    Guard::Trend(TrendGuard::new(threshold))
}

/// Configures and starts a data-parallel training run.
///
/// ```no_run
/// # use std::sync::Arc;
/// # fn demo(train: Arc<dyn flodl_data::Dataset>) -> flodl_ddp::Result<()> {
/// use flodl_ddp::{Backend, Devices, Mlp, MlpConfig, Optimizer, Policy, Trainer};
/// let mlp = MlpConfig::new(&[784, 256, 128, 10], Optimizer::sgd(0.9));
/// let handle = Trainer::new(Mlp::factory(mlp))
///     .dataset(train)
///     .devices(Devices::Cpu(2))
///     .policy(Policy::Cadence)
///     .backend(Backend::Collective)
///     .learning_rate(0.05)
///     .run()?;
/// let state = handle.join()?;
/// # let _ = state; Ok(()) }
/// ```
pub struct Trainer {
    factory: Factory,
    dataset: Option<Arc<dyn Dataset>>,
    test: Option<Arc<dyn Dataset>>,
    on_epoch: Option<EpochCallback>,
    audit: Option<SampleAudit>,
    /// Where the coordinator writes the run's exactly-once ledger.
    ledger: Option<std::path::PathBuf>,
    /// Where the coordinator streams its state's changes for a standby controller.
    standby: Option<flume::Sender<Vec<u8>>>,
    resume: Option<ResumeFrom>,
    cluster: Option<Cluster>,
    /// The one copy of the run's options: every setter writes here, and [`spec`](Self::spec)
    /// resolves it (devices, data, defaults that follow other options) and checks it.
    draft: RunSpec,
    /// Resolved into the draft's `devices` (and `placement`) by [`spec`](Self::spec).
    devices: Devices,
    /// Set by the user; otherwise the default follows the stall timeout.
    watchdog: Option<Duration>,
    /// Set by the user; otherwise the default follows EASGD.
    guard: Option<Guard>,
    /// When and how many bundles, in effect once a directory is given.
    checkpoint: CheckpointSpec,
    /// Whether [`checkpoint_dir`](Self::checkpoint_dir) was given.
    saves: bool,
    /// A schedule given by name, made by [`spec`](Self::spec) once the run's length is known.
    named: Option<NamedSchedule>,
}

/// A learning-rate schedule by name, as [`RunSettings`] give it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct NamedSchedule {
    /// Which schedule.
    kind: ScheduleKind,
    /// Its peak rate (unset: the draft schedule's).
    lr: Option<f64>,
    /// Epochs of linear warmup before it.
    warmup_epochs: f64,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("draft", &self.draft)
            .field("devices", &self.devices)
            .finish_non_exhaustive()
    }
}

impl Trainer {
    /// A trainer whose ranks build their replica with `factory` (called once per rank, inside
    /// the rank's thread).
    ///
    /// Defaults: batch size 64, 1 epoch, 1 CPU rank, `Cadence` on the `Collective` backend,
    /// seed 42, learning rate 0.01, no test set, no slowdown, stall timeout 120 s, snapshot
    /// timeout 5 s with 3 retries, [`Prefetch::Auto`], watchdog 30 s, no limit on failed ranks.
    pub fn new<R, F>(factory: F) -> Trainer
    where
        R: Replica + 'static,
        F: Fn(&ReplicaContext) -> Result<R> + Send + Sync + 'static,
    {
        let factory: Factory =
            Arc::new(move |ctx: &ReplicaContext| Ok(Box::new(factory(ctx)?) as Box<dyn Replica>));
        Trainer {
            factory,
            dataset: None,
            test: None,
            on_epoch: None,
            audit: None,
            ledger: None,
            standby: None,
            resume: None,
            cluster: None,
            draft: RunSpec::default(),
            devices: Devices::Cpu(1),
            watchdog: None,
            guard: None,
            checkpoint: CheckpointSpec {
                dir: PathBuf::new(),
                every: SaveInterval::every_epochs(1),
                keep: 3,
            },
            saves: false,
            named: None,
        }
    }

    /// Applies every setting `settings` gives (an unset one leaves this trainer's value): the
    /// one place a named setting becomes a trainer option. A schedule given by name is made by
    /// [`spec`](Self::spec), over the run's length in cohort steps.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the option: both `ranks` and `devices`, a watchdog no
    /// [`Duration`] holds, checkpoint keys without `checkpoint_dir`, `checkpoint_every_reduces`
    /// 0. Every other rule is [`RunSpec::check`]'s, at [`spec`](Self::spec).
    pub fn settings(mut self, settings: &RunSettings) -> Result<Trainer> {
        let s = settings.clone();
        match (s.ranks, s.devices) {
            (Some(_), Some(_)) => {
                let why = "ranks and devices cannot be used together";
                return Err(ConfigError::unsupported(Field::Devices, why).into());
            }
            (Some(n), None) => self.devices = Devices::Cpu(n),
            (None, Some(list)) => self.devices = Devices::List(list),
            (None, None) => {}
        }
        let d = &mut self.draft;
        d.policy = s.policy.unwrap_or(d.policy);
        d.backend = s.backend.unwrap_or(d.backend);
        d.epochs = s.epochs.unwrap_or(d.epochs);
        d.batch_size = s.batch_size.unwrap_or(d.batch_size);
        d.seed = s.seed.unwrap_or(d.seed);
        d.slowdown = s.slowdown.unwrap_or(std::mem::take(&mut d.slowdown));
        d.speed_changes = s.speed_change.unwrap_or(std::mem::take(&mut d.speed_changes));
        d.prefetch = s.prefetch.unwrap_or(d.prefetch);
        d.staging = s.staging.unwrap_or(d.staging);
        d.max_failures = s.max_failures.unwrap_or(d.max_failures);
        d.standby = s.standby.unwrap_or(d.standby);
        d.wire = s.wire.unwrap_or(d.wire);
        d.overlap = s.overlap.or(d.overlap);
        d.fragments = s.fragments.unwrap_or(d.fragments);
        d.elche.overhead_target = s.overhead_target.unwrap_or(d.elche.overhead_target);
        d.eval_every = s.eval_every.unwrap_or(d.eval_every);
        if let Some(lr) = s.lr {
            self = self.learning_rate(lr as f32);
        }
        if s.schedule.is_some() || s.warmup_epochs.is_some() {
            self.named = Some(NamedSchedule {
                kind: s.schedule.unwrap_or(ScheduleKind::Constant),
                lr: s.lr,
                warmup_epochs: s.warmup_epochs.unwrap_or(0.0),
            });
        }
        if let Some(secs) = s.watchdog {
            let deadline = Duration::try_from_secs_f64(secs).map_err(|_| {
                ConfigError::out_of_range(
                    Field::Watchdog,
                    format!("{secs:?}"),
                    "more than 0 and at most a week",
                )
            })?;
            self.watchdog = Some(deadline);
        }
        if s.checkpoint_every_reduces == Some(0) {
            return Err(ConfigError::out_of_range(Field::CheckpointEvery, 0, "at least 1").into());
        }
        match s.checkpoint_dir {
            Some(dir) => {
                let reduces = s.checkpoint_every_reduces;
                // Reduces alone turn the per-epoch default off.
                let epochs = s.checkpoint_every.unwrap_or(if reduces.is_some() { 0 } else { 1 });
                let interval = SaveInterval {
                    every_epochs: std::num::NonZeroU64::new(epochs as u64),
                    every_reduces: reduces.and_then(|n| std::num::NonZeroU64::new(n as u64)),
                };
                self = self.checkpoint_dir(dir).checkpoint_every(interval);
                if let Some(keep) = s.keep_checkpoints {
                    self = self.keep_checkpoints(keep);
                }
            }
            None => {
                let given = [
                    (Field::CheckpointEvery, s.checkpoint_every.or(s.checkpoint_every_reduces)),
                    (Field::KeepCheckpoints, s.keep_checkpoints),
                ];
                if let Some((field, _)) = given.iter().find(|(_, v)| v.is_some()) {
                    let problem = Problem::Needs { other: Field::Checkpoint, to_be: "given" };
                    return Err(ConfigError { field: *field, problem }.into());
                }
            }
        }
        Ok(self)
    }

    /// A trainer for the cooperative tier: the user's own loop trains each rank through a
    /// [`Worker`](crate::Worker), so no replica factory is given. Start it with
    /// [`run_cooperative`](Self::run_cooperative) ([`run`](Self::run) fails: its ranks have no
    /// replica to build). Same defaults as [`new`](Self::new).
    pub fn cooperative() -> Trainer {
        Trainer::new(|_: &ReplicaContext| -> Result<Bridge> {
            Err(ConfigError::unsupported(
                Field::Dataset,
                "a cooperative trainer has no replicas: start it with Trainer::run_cooperative",
            )
            .into())
        })
    }

    /// Starts the run with the cooperative tier: every rank trains through a
    /// [`Worker`](crate::Worker) that the user's own loop drives (its own forward, backward and
    /// optimizer, in any stack), while the runtime runs everything else as for a
    /// [`Replica`]: dispatch, ElChe windows, the policy and backend, the learning-rate
    /// schedule, averaging, metrics, checkpoints and fault handling. `initial` is the model's
    /// trainable parameters (shapes and values, in the order the user's
    /// [`Parameters`](crate::Parameters) lends them): every worker's model is overwritten with
    /// them before its first step. Returns as [`run`](Self::run) does, with one worker per rank
    /// beside the handle; each worker must be driven on a thread of its own until its
    /// `next_step` answers `None`.
    ///
    /// The cooperative tier runs on CPU ranks in one process. It offers no evaluation (the
    /// user evaluates the joined [`TrainedState`](crate::TrainedState)), no optimizer state in
    /// checkpoints and no gradient clipping ([`Error::MissingCapability`]).
    ///
    /// # Errors
    /// Those of [`run`](Self::run); [`Error::Invalid`] for a cluster run, a rank that is not a
    /// CPU, or an `initial` tensor whose values do not fill its shape.
    pub fn run_cooperative(mut self, initial: Vec<HostTensor>) -> Result<Cooperative> {
        if self.cluster.is_some() {
            let why = "the cooperative tier runs in one process (no cluster run yet)";
            return Err(ConfigError::unsupported(Field::Cluster, why).into());
        }
        let spec = self.spec()?;
        if let Some(d) = spec.devices.iter().find(|d| **d != Device::Cpu) {
            let why = format!("the cooperative tier runs on CPU ranks, not {d}");
            return Err(ConfigError::unsupported(Field::Devices, why).into());
        }
        if let Some(p) = initial.iter().find(|p| p.shape.iter().product::<usize>() != p.data.len())
        {
            let why = format!(
                "an initial parameter of shape {:?} holds {} values",
                p.shape,
                p.data.len()
            );
            return Err(ConfigError::unsupported(Field::ModelSize, why).into());
        }
        // The rank waits for its worker up to the watchdog (a silent rank is declared dead by
        // then anyway); the worker waits for its rank up to every wait the rank may be in.
        let (rank_wait, worker_wait) = (spec.watchdog, spec.stall_timeout + spec.watchdog);
        let mut ends = Vec::with_capacity(spec.world());
        let mut workers = Vec::with_capacity(spec.world());
        for rank in 0..spec.world() {
            let (order_tx, order_rx) = flume::bounded(1);
            let (answer_tx, answer_rx) = flume::bounded(1);
            ends.push(Some((order_tx, answer_rx)));
            workers.push(Worker::new(rank, order_rx, answer_tx, worker_wait));
        }
        let ends = Arc::new(Mutex::new(ends));
        let initial: Arc<[HostTensor]> = initial.into();
        self.factory = Arc::new(move |ctx: &ReplicaContext| {
            let end = ends
                // A panic of another rank's factory leaves the ends as they were.
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get_mut(ctx.rank)
                .and_then(Option::take);
            let (orders, answers) = end.ok_or(Error::WorkerTaken { rank: ctx.rank })?;
            let bridge = Bridge::new(ctx, &initial, orders, answers, rank_wait)?;
            Ok(Box::new(bridge) as Box<dyn Replica>)
        });
        let handle = self.run()?;
        Ok(Cooperative { handle, workers })
    }

    /// Makes this a cluster run's trainer: every rank its own process, this process the one
    /// `cluster` names ([`start`](Self::start) binds the controller on rank 0, or joins it).
    /// The world is the cluster's; [`devices`](Self::devices) then names the kind of device
    /// each process trains on — [`Devices::Cpu`] (the count is ignored) or [`Devices::AllGpus`]
    /// (each process takes `cuda:LOCAL_RANK` of its host). Only the host backend runs across
    /// processes so far.
    pub fn cluster(mut self, cluster: Cluster) -> Trainer {
        self.cluster = Some(cluster);
        self
    }

    /// How model states travel between a cluster run's processes (default f32; bf16 halves
    /// the bytes of snapshots, updates and initial states, the consensus staying f32 on the
    /// controller). In-process ranks always exchange f32.
    pub fn wire(mut self, format: WireFormat) -> Trainer {
        self.draft.wire = format;
        self
    }

    /// The training dataset (required).
    pub fn dataset(mut self, dataset: Arc<dyn Dataset>) -> Trainer {
        self.dataset = Some(dataset);
        self
    }

    /// A test dataset evaluated on the averaged model at the end of every `every`-th epoch and
    /// of the last one (`spec` refuses `every` 0).
    pub fn test_dataset(mut self, dataset: Arc<dyn Dataset>, every: usize) -> Trainer {
        self.test = Some(dataset);
        self.draft.eval_every = every;
        self
    }

    /// Which rank evaluates the test set (default [`crate::EvalRank::Fastest`]).
    pub fn eval_rank(mut self, rank: crate::EvalRank) -> Trainer {
        self.draft.eval_rank = rank;
        self
    }

    /// Calls `callback` with every epoch's metrics, evaluation included (see [`EpochCallback`]).
    pub fn on_epoch(
        mut self,
        callback: impl Fn(&crate::EpochMetrics) + Send + Sync + 'static,
    ) -> Trainer {
        self.on_epoch = Some(Arc::new(callback));
        self
    }

    /// Samples per batch on every rank.
    pub fn batch_size(mut self, batch_size: usize) -> Trainer {
        self.draft.batch_size = batch_size;
        self
    }

    /// Passes over the dataset.
    pub fn epochs(mut self, epochs: usize) -> Trainer {
        self.draft.epochs = epochs;
        self
    }

    /// The ranks' devices.
    pub fn devices(mut self, devices: Devices) -> Trainer {
        self.devices = devices;
        self
    }

    /// When to average.
    pub fn policy(mut self, policy: Policy) -> Trainer {
        self.draft.policy = policy;
        self
    }

    /// How to average.
    pub fn backend(mut self, backend: Backend) -> Trainer {
        self.draft.backend = backend;
        self
    }

    /// The seed of the initial weights and of the epoch permutations.
    pub fn seed(mut self, seed: u64) -> Trainer {
        self.draft.seed = seed;
        self
    }

    /// The learning rate every rank's optimizer steps with (a constant schedule).
    pub fn learning_rate(mut self, lr: f32) -> Trainer {
        self.draft.schedule = Schedule::Constant { lr: f64::from(lr) };
        self
    }

    /// A learning-rate schedule indexed in cohort steps (the batches of all ranks up to the
    /// last reduce, plus the rank's own since); replaces [`learning_rate`](Self::learning_rate).
    pub fn schedule(mut self, schedule: Schedule) -> Trainer {
        self.draft.schedule = schedule;
        self.named = None;
        self
    }

    /// The linear scaling rule: every rate is multiplied by `1 + (ranks − 1)·ratio` (default 0,
    /// no scaling; 1 scales by the number of ranks).
    pub fn lr_scale_ratio(mut self, ratio: f64) -> Trainer {
        self.draft.lr_scale_ratio = ratio;
        self
    }

    /// ElChe's knobs.
    pub fn elche(mut self, knobs: ElCheKnobs) -> Trainer {
        self.draft.elche = knobs;
        self
    }

    /// Per-rank slowdown factors (speed-skew emulation): after each step, rank `r` waits
    /// `(factors[r] − 1) ×` the step's compute time. One factor per rank, or none (every rank
    /// at full speed); `spec` refuses any other count ([`Problem::PerRank`]).
    pub fn slowdown(mut self, factors: Vec<f64>) -> Trainer {
        self.draft.slowdown = factors;
        self
    }

    /// Ranks whose speed changes for part of the run, on top of their
    /// [`slowdown`](Self::slowdown) (a bench's emulation of a device throttled for a while):
    /// each [`SpeedChange`] slows its rank's steps by its factor over its span of the run's
    /// cohort steps. `spec` refuses a change of no rank of the run, a factor below 1 or a span
    /// outside the run ([`Field::SpeedChange`]).
    pub fn speed_changes(mut self, changes: Vec<SpeedChange>) -> Trainer {
        self.draft.speed_changes = changes;
        self
    }

    /// How long any rank or the coordinator waits for a peer before the run fails (a rank's
    /// own liveness is judged by the [`watchdog`](Self::watchdog), at most this long).
    pub fn stall_timeout(mut self, timeout: Duration) -> Trainer {
        self.draft.stall_timeout = timeout;
        self
    }

    /// Host backend: how long a round waits for snapshots before it is soft-aborted and
    /// retried, and how many rounds in a row may be (the run then fails).
    pub fn snapshot_timeout(mut self, timeout: Duration, retries: usize) -> Trainer {
        self.draft.snapshot_timeout = timeout;
        self.draft.max_stalled_rounds = retries.max(1);
        self
    }

    /// The watchdog deadline: a rank that sends nothing for this long (ranks send a heartbeat
    /// when otherwise quiet, so silence means it is stuck in its replica), or that has not
    /// entered a reduce this long after it was called while the others wait in the collective,
    /// is declared dead; its collective group is aborted and the survivors regroup and go on.
    /// A collective also gives up on its own after this long (aborting its group), and a rank
    /// still inside a reduce its peers gave up on is declared dead a quarter of it later. Default
    /// 30 s, but never more than the stall timeout (a shorter stall timeout lowers it).
    ///
    /// The two deadlines divide the waits: the watchdog decides when a *rank* is dead (it is
    /// the one liveness deadline, for silence and collectives alike); the stall timeout bounds
    /// every other wait (replicas being built, final states, a full channel, a prefetched
    /// batch, a rank waiting for the coordinator).
    pub fn watchdog(mut self, deadline: Duration) -> Trainer {
        self.watchdog = Some(deadline);
        self
    }

    /// How many ranks may die before the run stops (default: no limit; the run goes on while
    /// a rank is alive). Past the limit the run fails with the error of the rank that died
    /// last; 0 makes any rank's failure the run's failure.
    pub fn max_failures(mut self, max: usize) -> Trainer {
        self.draft.max_failures = max;
        self
    }

    /// Streams the controller's state's changes into `lane` (an in-process standby's end: see
    /// `engine/standby/`; a cluster run streams to its [`Standby`](crate::Standby) rank).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn standby_lane(mut self, lane: flume::Sender<Vec<u8>>) -> Trainer {
        self.standby = Some(lane);
        self
    }

    /// Cluster runs (host backend): the rank whose process holds the first standby controller,
    /// which mirrors the controller's state and takes over when rank 0's process dies (default
    /// rank 1; each later term's standby is the next rank's, see [`crate::Standby::host`]).
    pub fn standby(mut self, standby: crate::Standby) -> Trainer {
        self.draft.standby = standby;
        self
    }

    /// The term of this run's controller: 0 (the default) for a run's first controller; a
    /// standby that took over and the ranks that follow it run its [`crate::Takeover::term`]
    /// (a rank joins a controller of its own term only: the term is part of the spec's hash).
    pub fn term(mut self, term: u64) -> Trainer {
        self.draft.term = term;
        self
    }

    /// Writes the run's exactly-once ledger to `path` (where the coordinator runs): which
    /// sample positions each consensus holds and what deaths threw away, one JSON line per
    /// reduce and death, read back by [`crate::ledger::Audit::read`] (`fdl audit`).
    pub fn ledger(mut self, path: impl Into<std::path::PathBuf>) -> Trainer {
        self.ledger = Some(path.into());
        self
    }

    /// Calls `audit(rank, epoch, indices)` for every training batch.
    pub fn sample_audit(mut self, audit: SampleAudit) -> Trainer {
        self.audit = Some(audit);
        self
    }

    /// The work-weighting exponent γ of the average (default 1): a rank that trained `n`
    /// batches since the last reduce counts with mass `n^γ` (γ = 0: every rank that stepped
    /// counts equally); a rank with no batch takes no part, and buffers are averaged equally
    /// over the ranks that stepped. Both backends use the same weights.
    pub fn gamma(mut self, gamma: f64) -> Trainer {
        self.draft.gamma = gamma;
        self
    }

    /// The divergence guard whose verdicts ElChe obeys (`Cadence` and `Async`; never consulted
    /// under `Sync`). Default: the trend guard with threshold 0.05 (0.3 with EASGD blending).
    /// [`Guard::Off`] turns the measurement off.
    pub fn guard(mut self, guard: Guard) -> Trainer {
        self.guard = Some(guard);
        self
    }

    /// The outer optimizer applied to each round's consensus (default
    /// [`OuterKind::Average`]): on the collective backend every rank steps its own copy after
    /// the all-reduce (deterministic, so all stay identical with no extra collective); on the
    /// host backend the coordinator steps it once before the average is sent back. It is never
    /// stepped on a round where no rank trained. Under [`OuterKind::Nesterov`] (DiLoCo) every
    /// rank resets its inner optimizer state after each round.
    pub fn outer(mut self, outer: OuterKind) -> Trainer {
        self.draft.outer = outer;
        self
    }

    /// EASGD blending on the host backend (meant for `Async`; BEHAVIOUR's default α is 0.5):
    /// on each update a rank pulls its replica towards the average instead of taking it,
    /// `W_local ← (1 − α)·W_local + α·W_avg` (`W_avg` shifted by what the rank trained since
    /// its snapshot, as the plain update is); buffers are overwritten. α = 1 is exactly the
    /// plain update. The default guard's trend threshold becomes 0.3.
    pub fn easgd(mut self, alpha: f32) -> Trainer {
        self.draft.easgd = Some(alpha);
        self
    }

    /// Host backend: a rank does not stop at its window's end while its snapshot travels: it
    /// trains on into its next window, and when the round's consensus `c` arrives it merges
    /// it into the parameters it has then, `W ← W + μ·(c − W_snapshot)` with the mixing
    /// factor μ in (0, 1] (times EASGD's α when both are set). The steps trained meanwhile are
    /// kept and weigh in the next round's average. Off by default; a `Sync` run with it is no
    /// longer bitwise reproducible (how far a rank trains meanwhile depends on timing).
    pub fn overlap(mut self, mix: f32) -> Trainer {
        self.draft.overlap = Some(mix);
        self
    }

    /// Host backend: cuts the parameters into `count` fragments of equal size (the tensors
    /// laid end to end, cut into runs of values: a tensor may be split between fragments), and
    /// syncs one of them per reduce in turn (reduce k syncs fragment k mod F, as in Streaming
    /// DiLoCo), so an exchange carries 1/F of the model and the link is busy evenly. A fragment's average weighs each rank by the steps it trained since that
    /// fragment was last synced; a reduce that saves a checkpoint syncs every fragment, and
    /// the final state averages every fragment. 1 (the default) syncs the whole model at every
    /// reduce; more needs the plain average as the outer optimizer, and at most as many
    /// fragments as the model has parameter values (checked when the run starts).
    pub fn fragments(mut self, count: usize) -> Trainer {
        self.draft.fragments = count;
        self
    }

    /// Clips each rank's gradients to this global L2 norm before every optimizer step. The
    /// replica must expose [`Replica::gradients_mut`]: [`run`](Self::run) fails with
    /// [`Error::MissingCapability`] otherwise.
    pub fn max_grad_norm(mut self, max_norm: f32) -> Trainer {
        self.draft.max_grad_norm = Some(max_norm);
        self
    }

    /// Whether ranks prepare their batches ahead on a background thread (default
    /// [`Prefetch::Auto`]: CUDA ranks do, CPU ranks do not). A rank waits for a prefetched batch
    /// at most the stall timeout.
    pub fn prefetch(mut self, prefetch: Prefetch) -> Trainer {
        self.draft.prefetch = prefetch;
        self
    }

    /// Whether each rank stages its training samples in a host cache filled ahead from the
    /// coordinator's advisories (default [`Staging::Auto`]: for datasets that read from
    /// storage). Batches and their order are the same either way; with prefetching on, the
    /// prefetcher reads through the cache.
    pub fn staging(mut self, staging: Staging) -> Trainer {
        self.draft.staging = staging;
        self
    }

    /// Saves checkpoint bundles in `dir` (created if needed): at reduces as
    /// [`checkpoint_every`](Self::checkpoint_every) says (default: after every epoch), when
    /// [`DdpHandle::checkpoint_now`] asks, and at the end of the run (see
    /// [`crate::checkpoint`] for the files). A save is taken at a reduce: every rank captures
    /// its state right after averaging and trains nothing until the coordinator has assembled
    /// the bundle (file IO happens after the ranks are released).
    pub fn checkpoint_dir(mut self, dir: impl Into<PathBuf>) -> Trainer {
        self.checkpoint.dir = dir.into();
        self.saves = true;
        self
    }

    /// When periodic checkpoints are saved (needs [`checkpoint_dir`](Self::checkpoint_dir)).
    pub fn checkpoint_every(mut self, interval: SaveInterval) -> Trainer {
        self.checkpoint.every = interval;
        self
    }

    /// How many step bundles the checkpoint directory keeps (default 3; `spec` refuses 0).
    pub fn keep_checkpoints(mut self, keep: usize) -> Trainer {
        self.checkpoint.keep = keep;
        self
    }

    /// The model's size (parameters and optimizer state per parameter, e.g.
    /// [`MlpConfig::size`](crate::MlpConfig::size)): [`spec`](Self::spec) then refuses a run
    /// whose replicas do not fit a device's free memory, before any is built. Unknown by
    /// default (not checked).
    pub fn model_size(mut self, size: ModelSize) -> Trainer {
        self.draft.model = Some(size);
        self
    }

    /// Resumes from a checkpoint: the consensus model, every rank's optimizer state, the outer
    /// optimizer, ElChe, the guard, the cohort step and the epochs' metrics are restored, and
    /// only the ranges of the open epochs the bundle does not cover are trained. The bundle
    /// must come from a run with the same model and the same [`crate::ResumeTerms`] (batch
    /// size, training set, seed, schedule, policy, backend and the other settings that change
    /// the maths); the epoch count may differ. A resumed `Sync` run on the same devices ends
    /// bitwise equal to the uninterrupted one.
    ///
    /// Elastic resume: the world size and the devices may differ. Then each rank's inner
    /// optimizer state is mapped by [`crate::checkpoint::RankMap`]'s rule (new rank `r` takes
    /// old rank `r mod W`'s), ElChe starts its estimates afresh for the new world, and the
    /// rest of each open epoch is re-sharded over the new ranks (under `Sync`, split evenly),
    /// so every remaining sample is still trained exactly once.
    pub fn resume(mut self, from: ResumeFrom) -> Trainer {
        self.resume = Some(from);
        self
    }

    /// The run this trainer describes, checked and resolved, without running it: the
    /// [`RunSpec`] every process of the run must agree on ([`run`](Self::run) runs exactly
    /// this). Reads nothing from disk (the checkpoint directory and the bundle to resume from
    /// are looked at by `run`).
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the option: a missing dataset, no device, a collective
    /// backend across processes without MPI, or any rule of [`RunSpec::check`] (checked
    /// against this machine's cores and memory).
    pub fn spec(&self) -> Result<RunSpec> {
        self.spec_on(&Machine::this())
    }

    /// [`spec`](Self::spec), checked against `machine` instead of this one.
    ///
    /// # Errors
    /// As [`spec`](Self::spec).
    pub fn spec_on(&self, machine: &Machine) -> Result<RunSpec> {
        let dataset = self.dataset.as_deref().ok_or_else(missing_dataset)?;
        let mut spec = self.draft.clone();
        (spec.devices, spec.placement) = match &self.cluster {
            Some(cluster) => (vec![self.device_kind()?; cluster.world()], cluster.placement()),
            None => (self.devices.resolve()?, Placement::Threads),
        };
        // GPU processes average through NCCL (ids relayed by the controller); CPU processes
        // through MPI.
        if spec.collective_engine() == Some(CollectiveEngine::Mpi) {
            check_mpi()?;
        }
        spec.train = DataSpec::of(dataset);
        spec.test = self.test.as_deref().map(DataSpec::of);
        if self.cluster.is_some() {
            // The data itself is part of a cluster run: a rank that loaded other samples hashes
            // another spec and is refused at the hello.
            spec.data = Some(DataChecksums::of(dataset, self.test.as_deref())?);
        }
        spec.watchdog = self.watchdog.unwrap_or(DEFAULT_WATCHDOG.min(spec.stall_timeout));
        spec.guard = self.guard.clone().unwrap_or_else(|| default_guard(spec.easgd.is_some()));
        spec.lr_scale = crate::control::schedule::lr_scale(spec.world(), spec.lr_scale_ratio);
        spec.checkpoint = self.saves.then(|| self.checkpoint.clone());
        if let Some(named) = self.named {
            spec.schedule = named.resolve(&spec)?;
        }
        spec.check(machine)?;
        Ok(spec)
    }

    /// Checks the configuration ([`spec`](Self::spec)), starts the run and returns once every
    /// rank's replica is built and checked against the others (and a resumed bundle), as
    /// training begins.
    ///
    /// # Errors
    /// Those of [`spec`](Self::spec); [`Error::Checkpoint`] when the checkpoint directory cannot
    /// be created or listed, or the checkpoint to resume from is missing, unreadable, corrupt,
    /// or from a run of another configuration (`TermMismatch` names the setting) or model; [`Error::Rank`] when a
    /// rank's replica cannot be built; [`Error::MissingCapability`] when an option needs a part
    /// of the contract the replica does not offer; [`Error::ReplicaMismatch`] when the replicas
    /// disagree.
    pub fn run(self) -> Result<DdpHandle> {
        if let Some(cluster) = &self.cluster
            && !cluster.hosts_controller(self.draft.backend, self.device_kind()?)
        {
            let why = format!(
                "this process is rank {} of a cluster run, which has no DdpHandle: start it \
                 with Trainer::start, whose RankHandle reports the rank's outcome",
                cluster.rank().unwrap_or(0)
            );
            return Err(ConfigError::unsupported(Field::Cluster, why).into());
        }
        match self.start()? {
            Started::Coordinator(handle) => Ok(handle),
            Started::Rank(rank) => {
                let why = format!("rank {} of a cluster run has no DdpHandle", rank.rank());
                Err(ConfigError::unsupported(Field::Cluster, why).into())
            }
        }
    }

    /// The kind of device of a cluster run's processes.
    fn device_kind(&self) -> Result<Device> {
        match &self.devices {
            Devices::Cpu(_) => Ok(Device::Cpu),
            Devices::AllGpus if flodl_tensor::cuda_device_count() > 0 => Ok(Device::Cuda(0)),
            Devices::AllGpus => {
                let why = flodl_tensor::gpu_skip_reason()
                    .unwrap_or_else(|| "no CUDA device is visible".into());
                Err(ConfigError::unsupported(Field::Devices, format!("no rank to run: {why}"))
                    .into())
            }
            Devices::List(_) => Err(ConfigError::unsupported(
                Field::Devices,
                "a cluster run's processes each pick their device: use Devices::Cpu or \
                 Devices::AllGpus (cuda:LOCAL_RANK)",
            )
            .into()),
        }
    }

    /// Starts the run in this process, as [`run`](Self::run) does, and says what this process
    /// runs. Without [`cluster`](Self::cluster), or on a cluster run's rank 0, that is the
    /// whole run ([`Started::Coordinator`], after binding the controller and waiting for every
    /// other rank to join); on another rank's process it joins the controller and runs that
    /// one rank ([`Started::Rank`]: its `join` reports the rank's outcome).
    ///
    /// # Errors
    /// Those of [`run`](Self::run); in a cluster run, [`Error::RanksMissing`] when ranks did
    /// not join in time, [`Error::RunMismatch`] when one runs another spec, and the
    /// transport's errors (a rank refused by the controller says why).
    pub fn start(self) -> Result<Started> {
        let spec = self.spec()?;
        let dataset = self.dataset.ok_or_else(missing_dataset)?;
        let checkpoints = match &spec.checkpoint {
            // Opened now: an unusable directory fails the run before anything trains.
            Some(c) => Some(CheckpointPlan {
                store: crate::checkpoint::CheckpointStore::open(&c.dir, c.keep)?,
                interval: c.every,
            }),
            None => None,
        };
        let mut config = RunConfig {
            spec,
            factory: self.factory,
            dataset,
            test: self.test,
            on_epoch: self.on_epoch,
            audit: self.audit,
            ledger: self.ledger,
            checkpoints,
            resume: None,
            own: None,
            standby: self.standby,
            mirror: None,
        };
        if let Some(cluster) = &self.cluster {
            let run = config.spec.hash()?.0;
            let kind = config.spec.devices.first().copied().unwrap_or(Device::Cpu);
            match cluster.seat() {
                Seat::Rank(rank) => {
                    config.own = Some((rank, own_device(kind, cluster.local_rank())));
                }
                Seat::Controller if !config.spec.controller_apart() => {
                    return Err(ConfigError::unsupported(
                        Field::Cluster,
                        "a controller of its own serves only runs of the collective backend \
                         across processes (MPI); with the host backend rank 0's process hosts \
                         the controller",
                    )
                    .into());
                }
                Seat::Controller => {}
            }
            if let Some(rank) =
                cluster.rank().filter(|_| !cluster.hosts_controller(self.draft.backend, kind))
            {
                // The controller alone saves and resumes: a rank restores from `Init`.
                config.checkpoints = None;
                if config.spec.standby_rank() == Some(rank) {
                    let term = crate::runtime::engine::standby::Term(config.spec.term);
                    config.mirror = Some(crate::runtime::engine::standby::SharedMirror::new(
                        cluster.world(),
                        term,
                    ));
                }
                let frames = cluster.rendezvous().join(
                    run,
                    rank,
                    cluster.world(),
                    cluster.join_wait(),
                    config.spec.watchdog,
                )?;
                return Ok(Started::Rank(RankHandle::start(Arc::new(config), rank, frames)?));
            }
        }
        if let Some(from) = &self.resume {
            let bundle = from.read()?;
            config.spec.check_bundle(&bundle)?;
            config.resume =
                Some(Arc::new(crate::runtime::engine::capture::decode(&config, bundle)?));
        }
        let remote = match &self.cluster {
            Some(cluster) => {
                let run = config.spec.hash()?.0;
                let silence = config.spec.watchdog;
                // Every rank but this process's own.
                let ranks: Vec<usize> =
                    (0..cluster.world()).filter(|&r| Some(r) != cluster.rank()).collect();
                let (world, quorum) = (cluster.world(), cluster.quorum_of());
                cluster.rendezvous().accept(
                    run,
                    world,
                    &ranks,
                    quorum,
                    cluster.join_wait(),
                    silence,
                )?
            }
            None => (Vec::new(), None),
        };
        DdpHandle::start(Arc::new(config), remote).map(Started::Coordinator)
    }
}

impl NamedSchedule {
    /// The schedule over `spec`'s run: its epochs of full batches, in cohort steps (the batches
    /// of all ranks together); the draft's schedule when this one is constant without warmup.
    ///
    /// # Errors
    /// [`Field::WarmupEpochs`] when the warmup is negative, not a number, or not shorter than
    /// the run.
    fn resolve(self, spec: &RunSpec) -> Result<Schedule> {
        let w = self.warmup_epochs;
        if !(w.is_finite() && w >= 0.0 && w < spec.epochs.max(1) as f64) {
            let e = ConfigError::out_of_range(
                Field::WarmupEpochs,
                w,
                "at least 0 and less than the epochs",
            );
            return Err(e.into());
        }
        let per_epoch = spec.batches_per_epoch() as u64;
        let total = spec.epochs as u64 * per_epoch;
        let warmup = (w * per_epoch as f64).round() as u64;
        let lr = self.lr.unwrap_or_else(|| crate::runtime::spec::base_rate(&spec.schedule));
        Ok(self.kind.build(lr, total, warmup).unwrap_or_else(|| spec.schedule.clone()))
    }
}

/// Checks that the collective backend can run across processes on `devices`: CPU ranks,
/// through MPI (feature `mpi`).
///
/// # Errors
/// [`Error::Invalid`] (the backend) for a build without the `mpi` feature.
fn check_mpi() -> Result<()> {
    if cfg!(feature = "mpi") {
        Ok(())
    } else {
        Err(ConfigError::unsupported(
            Field::Backend,
            "the collective backend across processes needs MPI: build with the `mpi` feature \
             (cargo build --features mpi; Debian: libopenmpi-dev, openmpi-bin, libclang-dev) \
             or use --backend host (Backend::Host)",
        )
        .into())
    }
}

/// The error of a trainer without a training set.
fn missing_dataset() -> Error {
    ConfigError { field: Field::Dataset, problem: Problem::Missing }.into()
}

//! The run specification: what every process of a run must agree on, as plain serde data.
//!
//! [`crate::Trainer`] keeps its options as a draft [`RunSpec`]; [`crate::Trainer::spec`] resolves
//! it (devices listed, guard chosen, linear scaling applied, watchdog defaulted) and checks it
//! with [`RunSpec::check`], the one place the rules on a run's options are written;
//! [`crate::Trainer::run`] runs exactly that spec. What only one process holds — the replica
//! factory, the datasets, callbacks, the sample audit, the opened checkpoint store, the bundle
//! resumed from — stays out of it. A spec serializes with serde (bincode 2 and JSON round-trip
//! it), so a cluster's processes can exchange and compare it, and hashes from a canonical
//! encoding: [`RunSpec::hash`] covers all of it, [`RunSpec::compat_hash`] what a checkpoint's
//! resume depends on.

use crate::contract::model_size::ModelSize;
use std::path::PathBuf;
use std::time::Duration;

use flodl_data::Dataset;
use flodl_tensor::Device;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Result;
use crate::checkpoint::{Checkpoint, CheckpointError, ConfigHash, SaveInterval, StoredDType};
use crate::config_error::{ConfigError, Field, Problem};
use crate::control::elche::{DEFAULT_OVERHEAD_TARGET, OVERHEAD_TARGETS};
use crate::control::eval_rank::EvalRank;
use crate::control::guard::{Guard, TREND_THRESHOLD, TrendGuard};
use crate::control::outer::{OuterKind, OuterOptimizer, check_easgd_alpha};
use crate::control::policy::{Backend, Policy};
use crate::control::schedule::Schedule;
use crate::control::speed_change::SpeedChange;
use crate::control::standby::Standby;
use crate::runtime::engine::prefetch::Prefetch;
use crate::runtime::engine::staging::Staging;

/// ElChe's knobs (see `ElChe`): the cadence of `Cadence` and `Async`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElCheKnobs {
    /// Batches of the slowest rank per window at the start (default 10).
    pub anchor: usize,
    /// Largest anchor the overhead auto-tune may reach (default 1000, BEHAVIOUR §2.2).
    ///
    /// Not lower: the anchor is what lets a window outgrow a slow link's reduce. A cap of 100
    /// held every window at ~100 batches of the slowest rank (300-400 over three ranks) however
    /// slow the link, so a 60-70 ms reduce over +20 ms and 100 Mbit/s stayed 25-45% of the
    /// wall (`flodl-cli/tests/hosts.rs`). What bounds the window is the overhead target, the
    /// epoch cap (a window is at most one epoch's batches) and the divergence guard, which
    /// stops growth (`SuppressGrowth`) or halves the anchor (`NudgeDown`) when longer windows
    /// start to cost agreement between the replicas.
    pub max_anchor: usize,
    /// Fraction of window time a reduce may cost the ranks before the anchor grows, within
    /// [`OVERHEAD_TARGETS`](crate::OVERHEAD_TARGETS) (default 0.05).
    pub overhead_target: f64,
    /// Largest change of a rank's count from one window to the next (default none).
    pub max_batch_diff: Option<usize>,
    /// `Async`: batches a rank may train past its count while the others catch up, fixed
    /// (at most 15). Default: auto, starting at `clamp(batches per epoch / 100, 2, 5)`, one more
    /// after each `Stable` guard verdict up to `clamp(batches per epoch / 50, 3, 10)`, back to
    /// the start on `NudgeDown` (see [`crate::control::overshoot::Overshoot`]).
    pub max_overshoot: Option<usize>,
    /// Smallest chunk of progressive dispatch, in batches (default 4).
    pub min_chunk: usize,
    /// Initial hint: `(slow rank, speed ratio)` so counts are balanced from the first window.
    pub speed_hint: Option<(usize, f64)>,
}

impl Default for ElCheKnobs {
    fn default() -> Self {
        Self {
            anchor: 10,
            max_anchor: 1000,
            overhead_target: DEFAULT_OVERHEAD_TARGET,
            max_batch_diff: None,
            max_overshoot: None,
            min_chunk: 4,
            speed_hint: None,
        }
    }
}

/// A dataset's identity as every rank must see it: its length and the layout of a sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataSpec {
    /// Number of samples.
    pub samples: usize,
    /// The fields of one sample, in order.
    pub fields: Vec<FieldSpec>,
}

/// One field of a sample: name, per-sample shape and element type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldSpec {
    /// Field name.
    pub name: String,
    /// Per-sample shape (`[]` for a scalar).
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: StoredDType,
}

impl DataSpec {
    /// The identity of `dataset`.
    pub fn of(dataset: &dyn Dataset) -> DataSpec {
        let fields = dataset
            .layout()
            .fields()
            .iter()
            .map(|f| FieldSpec {
                name: f.name.clone(),
                shape: f.shape.clone(),
                dtype: StoredDType::from(f.dtype),
            })
            .collect();
        DataSpec { samples: dataset.len(), fields }
    }
}

/// Where a run's ranks live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Every rank a thread of one process; `devices` lists each rank's device.
    #[default]
    Threads,
    /// Every rank its own process (a cluster run; rank 0's process hosts the controller, or,
    /// with the collective backend, a process outside the ranks' MPI world does);
    /// `devices` names each rank's kind of device only (`cpu`, or `cuda:0` for "a GPU"), since
    /// which GPU of its host a process trains on (`cuda:LOCAL_RANK`) is that process's own
    /// business and must not make the processes' specs differ.
    Processes,
    /// A cluster run whose places meet through in-memory connections
    /// ([`crate::Cluster::in_memory`]): every rank a seat of its own as under `Processes`, but
    /// all of them threads of this one process (tests). Its CPU ranks' collective groups are
    /// host all-reduce groups formed through the controller ([`CollectiveEngine::InMemory`]).
    #[serde(rename = "in-memory")]
    InMemory,
}

impl Placement {
    /// Whether every rank has a seat of its own joined to the controller over a connection (a
    /// cluster run, across processes or in memory).
    pub fn is_cluster(self) -> bool {
        matches!(self, Placement::Processes | Placement::InMemory)
    }
}

/// What carries the collective backend's in-place average (the engine follows the devices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CollectiveEngine {
    /// NCCL: every rank is a GPU of its own (across processes, each group's unique id is made
    /// by its lowest rank and relayed by the controller).
    Nccl,
    /// MPI: CPU ranks in several processes form one MPI world (the `mpi` feature); the
    /// controller stays outside it.
    Mpi,
    /// The host all-reduce (`HostComm`): CPU ranks, or GPU ranks through host copies.
    Host {
        /// The world mixes GPU and CPU ranks (NCCL needs every rank on a GPU of its own).
        mixed: bool,
    },
    /// The host all-reduce for the CPU ranks of an in-memory cluster run
    /// ([`Placement::InMemory`]): each group is formed through the controller as an NCCL group
    /// is (its lowest member makes an id, the controller relays it), the id naming a `HostComm`
    /// group in a registry of this process. It cannot cross a process, so real cluster runs
    /// never use it; it runs the controller's formation and rejoin paths without a GPU.
    InMemory,
}

impl CollectiveEngine {
    /// The one rule: the engine of the collective backend for ranks `placement`d on `devices`
    /// (see [`RunSpec::collective_engine`]); `None` on the host backend.
    pub fn choose(
        backend: Backend,
        placement: Placement,
        devices: &[Device],
    ) -> Option<CollectiveEngine> {
        if backend != Backend::Collective {
            return None;
        }
        let gpus = devices.iter().filter(|d| matches!(d, Device::Cuda(_))).count();
        match placement {
            Placement::Processes if gpus == 0 => return Some(CollectiveEngine::Mpi),
            Placement::InMemory if gpus == 0 => return Some(CollectiveEngine::InMemory),
            _ => {}
        }
        let distinct = placement.is_cluster()
            || devices.iter().collect::<std::collections::HashSet<_>>().len() == devices.len();
        if cfg!(feature = "cuda") && gpus == devices.len() && distinct {
            Some(CollectiveEngine::Nccl)
        } else {
            Some(CollectiveEngine::Host { mixed: gpus > 0 && gpus < devices.len() })
        }
    }

    /// Whether each group's id is made by its lowest member and relayed by the controller
    /// (ranks with seats of their own: NCCL, or the in-memory engine).
    pub(crate) fn relays(self, placement: Placement) -> bool {
        placement.is_cluster()
            && matches!(self, CollectiveEngine::Nccl | CollectiveEngine::InMemory)
    }
}

/// Where and how often a run saves checkpoint bundles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointSpec {
    /// The bundle directory.
    pub dir: PathBuf,
    /// When periodic saves fall due.
    pub every: SaveInterval,
    /// Step bundles kept (at least 1).
    pub keep: usize,
}

/// Everything the processes of one run must agree on, resolved and checked
/// ([`crate::Trainer::spec`] builds it; the fields' meanings are those of the `Trainer` option
/// of the same name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// Samples per batch on every rank.
    pub batch_size: usize,
    /// Passes over the training set.
    pub epochs: usize,
    /// One device per rank, in rank order (serialized as `cpu`, `cuda:N`); under
    /// [`Placement::Processes`] the kind of each rank's device only.
    #[serde(with = "device_names")]
    pub devices: Vec<Device>,
    /// Whether the ranks are threads of one process or processes of their own.
    #[serde(default)]
    pub placement: Placement,
    /// How model states travel between processes (in-process ranks always exchange f32).
    #[serde(default)]
    pub wire: crate::link::frame::WireFormat,
    /// When to average.
    pub policy: Policy,
    /// How to average.
    pub backend: Backend,
    /// Seed of the initial weights and of the epoch permutations.
    pub seed: u64,
    /// The learning-rate schedule in cohort steps (a constant rate is `Schedule::Constant`).
    pub schedule: Schedule,
    /// The linear-scaling factor every rate is multiplied by (`1 + (ranks − 1)·ratio`).
    pub lr_scale: f64,
    /// The linear-scaling ratio the factor was resolved from.
    #[serde(default)]
    pub lr_scale_ratio: f64,
    /// ElChe's knobs.
    pub elche: ElCheKnobs,
    /// Per-rank slowdown factors (missing ranks run at 1).
    pub slowdown: Vec<f64>,
    /// Ranks whose speed changes for part of the run, on top of their slowdown (benches and
    /// tests: a device throttled for a while).
    #[serde(default)]
    pub speed_changes: Vec<SpeedChange>,
    /// How long a wait for a peer lasts before the run fails.
    pub stall_timeout: Duration,
    /// Host backend: how long a round waits for snapshots before it is retried.
    pub snapshot_timeout: Duration,
    /// Host backend: rounds in a row that may miss the snapshot deadline.
    pub max_stalled_rounds: usize,
    /// The liveness deadline of a rank (resolved: at most the stall timeout).
    pub watchdog: Duration,
    /// Work-weighting exponent γ of the average (mass = steps^γ).
    pub gamma: f64,
    /// The divergence guard (resolved: the default when none was given).
    pub guard: Guard,
    /// The outer optimizer applied to each round's consensus.
    pub outer: OuterKind,
    /// Host backend: the EASGD blend factor α, when set.
    pub easgd: Option<f32>,
    /// Host backend: a rank trains on while its snapshot travels and merges the consensus
    /// when it arrives, with this mixing factor μ (see [`crate::Trainer::overlap`]); `None`:
    /// it waits for the consensus at its window's end.
    #[serde(default)]
    pub overlap: Option<f32>,
    /// Host backend: the fragments the parameters are cut into, one synced per reduce in turn
    /// (see [`crate::Trainer::fragments`]); 1 syncs the whole model at every reduce.
    #[serde(default = "one")]
    pub fragments: usize,
    /// Per-rank gradient clipping by global norm, when set.
    pub max_grad_norm: Option<f32>,
    /// Whether ranks prepare batches ahead.
    pub prefetch: Prefetch,
    /// Whether ranks stage their samples in a host cache filled ahead from advisories.
    #[serde(default)]
    pub staging: Staging,
    /// Ranks that may die before the run stops (`usize::MAX`: no limit).
    pub max_failures: usize,
    /// The test set is evaluated after every `eval_every`-th epoch and the last one.
    pub eval_every: usize,
    /// Which rank evaluates.
    pub eval_rank: EvalRank,
    /// Cluster runs (host backend): the rank whose process holds the standby controller.
    #[serde(default)]
    pub standby: Standby,
    /// The controller's term: 0 for the first, one more for each standby that took over. Part
    /// of the hash the ranks prove at the hello, so a rank never joins a controller of another
    /// term.
    #[serde(default)]
    pub term: u64,
    /// Checkpoint saving, when on.
    pub checkpoint: Option<CheckpointSpec>,
    /// The training set.
    pub train: DataSpec,
    /// The test set, when there is one.
    pub test: Option<DataSpec>,
    /// The model's size, when the trainer was told it: checked against the devices' memory.
    #[serde(default)]
    pub model: Option<ModelSize>,
    /// The checksums of the samples this process loaded, in a cluster run: part of the hash
    /// the ranks compare at the hello, so a rank with other data is refused there.
    #[serde(default)]
    pub data: Option<DataChecksums>,
}

/// What the samples a process loaded hash to (SHA-256 of every field's values in sample
/// order, hex): the identity of the data itself, beyond its length and layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataChecksums {
    /// The training set's.
    pub train: String,
    /// The test set's, when there is one.
    pub test: Option<String>,
}

/// Samples hashed per fetch.
const CHECKSUM_BATCH: usize = 1024;

impl DataChecksums {
    /// The checksums of `train` and `test`, read through their fetches (what the ranks will
    /// train and evaluate on), a bounded batch at a time.
    ///
    /// # Errors
    /// What a fetch fails with.
    pub fn of(train: &dyn Dataset, test: Option<&dyn Dataset>) -> Result<DataChecksums> {
        Ok(DataChecksums { train: checksum(train)?, test: test.map(checksum).transpose()? })
    }
}

/// The SHA-256 of `dataset`'s samples, field by field within each batch of samples, in hex.
fn checksum(dataset: &dyn Dataset) -> Result<String> {
    let layout = dataset.layout();
    let mut hasher = Sha256::new();
    let mut batch = flodl_data::HostBatch::new(layout, Device::Cpu);
    let mut start = 0;
    while start < dataset.len() {
        let end = (start + CHECKSUM_BATCH).min(dataset.len());
        let indices: Vec<usize> = (start..end).collect();
        dataset.fetch(&indices, &mut batch)?;
        for field in 0..layout.fields().len() {
            let bytes: Vec<u8> = match batch.f32(field) {
                Ok(values) => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Err(_) => batch.i32(field)?.iter().flat_map(|x| x.to_le_bytes()).collect(),
            };
            hasher.update(&bytes);
        }
        start = end;
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// What a run is checked against: this machine's cores and each device's free memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// Hardware threads available to this process.
    pub cores: usize,
    /// Free bytes of each device found (`0` when unknown: then not checked).
    pub free_memory: Vec<(Device, u64)>,
}

impl Machine {
    /// CPU ranks allowed per core: a rank is one thread that mostly computes, so more than a
    /// few per core only slows every one of them down.
    pub const RANKS_PER_CORE: usize = 16;

    /// This machine, as [`flodl_tensor::devices`] finds it (system memory for the CPU, each
    /// GPU's free memory).
    pub fn this() -> Machine {
        let devices = flodl_tensor::devices();
        let cores = devices
            .iter()
            .find_map(|d| match d.details {
                flodl_tensor::DeviceDetails::Cpu { cores } => Some(cores),
                flodl_tensor::DeviceDetails::Cuda { .. } => None,
            })
            .unwrap_or(1);
        let free_memory = devices
            .iter()
            .map(|d| {
                let free = if d.free_memory > 0 { d.free_memory } else { d.total_memory };
                (d.device, free)
            })
            .collect();
        Machine { cores, free_memory }
    }

    /// The most CPU ranks one process may run here.
    pub fn max_cpu_ranks(&self) -> usize {
        self.cores.max(1).saturating_mul(Self::RANKS_PER_CORE)
    }

    /// Free bytes of `device`, when known.
    fn free(&self, device: Device) -> Option<u64> {
        self.free_memory
            .iter()
            .find(|(d, _)| *d == device)
            .map(|(_, free)| *free)
            .filter(|f| *f > 0)
    }
}

/// The rate a schedule starts from or peaks at (the learning rate it was built around).
pub(crate) fn base_rate(schedule: &Schedule) -> f64 {
    match schedule {
        Schedule::Constant { lr }
        | Schedule::Step { lr, .. }
        | Schedule::MultiStep { lr, .. }
        | Schedule::Exponential { lr, .. }
        | Schedule::Cosine { lr, .. } => *lr,
        Schedule::OneCycle { max_lr, .. } => *max_lr,
        Schedule::Warmup { inner, .. } => base_rate(inner),
    }
}

/// The longest deadline a run takes: a week (longer ones are typos, and deadlines must stay
/// addable to an `Instant`).
pub const MAX_DEADLINE: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a bundle's resume depends on: the settings that change the maths of training, which a
/// run resuming a bundle must share with the run that saved it ([`RunSpec::resume_terms`];
/// [`RunSpec::compat_hash`] is their hash). Bundles record them (so a refusal names the field
/// that differs) and their hash.
///
/// Left out on purpose, so a bundle resumes onto another world (elastic resume): the world size
/// and the devices (per-rank state is mapped by [`crate::checkpoint::RankMap`], ElChe
/// re-calibrates, the open epochs' rest is re-sharded), the placement (in-process or cluster),
/// ElChe's speed hint (it names a rank of one world), the resolved linear-scaling factor (the
/// ratio is kept: the factor follows the new world), the epoch count (a run may be extended; a
/// schedule that spans the epochs still differs), the wire format, slowdown, timeouts, the
/// watchdog and failure limit, prefetching, staging, evaluation, checkpointing, and the guard (restored
/// from the bundle).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResumeTerms {
    /// When to average.
    pub policy: Policy,
    /// How to average.
    pub backend: Backend,
    /// Samples per batch on every rank.
    pub batch_size: usize,
    /// The training set's identity.
    pub train: DataSpec,
    /// Seed of the initial weights and of the epoch permutations.
    pub seed: u64,
    /// The learning-rate schedule in cohort steps.
    pub schedule: Schedule,
    /// The linear-scaling ratio (the factor is `1 + (ranks − 1)·ratio` of each run's world).
    pub lr_scale_ratio: f64,
    /// Work-weighting exponent γ.
    pub gamma: f64,
    /// The outer optimizer.
    pub outer: OuterKind,
    /// Host backend: the EASGD blend factor.
    pub easgd: Option<f32>,
    /// Gradient clipping by global norm.
    pub max_grad_norm: Option<f32>,
    /// ElChe's knobs, without the speed hint.
    pub elche: ElCheKnobs,
}

impl ResumeTerms {
    /// The first field (in declaration order) whose value differs from `other`'s, with both
    /// values as text (`self`'s first).
    pub fn first_difference(&self, other: &ResumeTerms) -> Option<(&'static str, String, String)> {
        fn differs<T: PartialEq + std::fmt::Debug>(
            field: &'static str,
            a: &T,
            b: &T,
        ) -> Option<(&'static str, String, String)> {
            (a != b).then(|| (field, format!("{a:?}"), format!("{b:?}")))
        }
        differs("policy", &self.policy, &other.policy)
            .or_else(|| differs("backend", &self.backend, &other.backend))
            .or_else(|| differs("batch_size", &self.batch_size, &other.batch_size))
            .or_else(|| differs("train", &self.train, &other.train))
            .or_else(|| differs("seed", &self.seed, &other.seed))
            .or_else(|| differs("schedule", &self.schedule, &other.schedule))
            .or_else(|| differs("lr_scale_ratio", &self.lr_scale_ratio, &other.lr_scale_ratio))
            .or_else(|| differs("gamma", &self.gamma, &other.gamma))
            .or_else(|| differs("outer", &self.outer, &other.outer))
            .or_else(|| differs("easgd", &self.easgd, &other.easgd))
            .or_else(|| differs("max_grad_norm", &self.max_grad_norm, &other.max_grad_norm))
            .or_else(|| differs("elche", &self.elche, &other.elche))
    }
}

/// The resume terms of bundles written before elastic resume (tag v2): the world size was one
/// of them, and the resolved linear-scaling factor and the whole of ElChe's knobs. Such a
/// bundle still resumes onto a run whose terms would have hashed alike with the bundle's world.
#[derive(Serialize)]
struct LegacyTerms<'a> {
    world: usize,
    policy: Policy,
    backend: Backend,
    batch_size: usize,
    train: &'a DataSpec,
    seed: u64,
    schedule: &'a Schedule,
    lr_scale: f64,
    gamma: f64,
    outer: OuterKind,
    easgd: Option<f32>,
    max_grad_norm: Option<f32>,
    elche: &'a ElCheKnobs,
}

/// Domain tags of the two hashes: a new layout of either gets a new tag.
const SPEC_TAG: &[u8] = b"flodl-run-spec v1\0";
const COMPAT_TAG: &[u8] = b"flodl-run-compat v3\0";
const LEGACY_COMPAT_TAG: &[u8] = b"flodl-run-compat v2\0";

/// The canonical encoding hashed: bincode 2, little-endian fixed-width integers, pinned here
/// so that a change of bincode's defaults cannot move a hash.
fn canonical<T: Serialize>(
    tag: &[u8],
    value: &T,
) -> std::result::Result<ConfigHash, CheckpointError> {
    let config = bincode::config::standard().with_little_endian().with_fixed_int_encoding();
    let bytes = bincode::serde::encode_to_vec(value, config)
        .map_err(|source| CheckpointError::Encode { what: "run specification", source })?;
    let mut hasher = Sha256::new();
    hasher.update(tag);
    hasher.update(&bytes);
    Ok(ConfigHash(hasher.finalize().into()))
}

/// One: the default of a count that serde may not find (a spec written before the field).
fn one() -> usize {
    1
}

impl Default for RunSpec {
    /// [`crate::Trainer`]'s defaults: batch size 64, 1 epoch, `Cadence` on the `Collective`
    /// backend, seed 42, learning rate 0.01, stall timeout 120 s, snapshot timeout 5 s with 3
    /// retries, watchdog 30 s, the trend guard, no limit on failed ranks — and no device and an
    /// empty training set, which [`crate::Trainer::spec`] fills in.
    fn default() -> Self {
        RunSpec {
            batch_size: 64,
            epochs: 1,
            devices: Vec::new(),
            placement: Placement::Threads,
            wire: crate::link::frame::WireFormat::F32,
            policy: Policy::Cadence,
            backend: Backend::Collective,
            seed: 42,
            schedule: Schedule::Constant { lr: f64::from(0.01f32) },
            lr_scale: 1.0,
            lr_scale_ratio: 0.0,
            elche: ElCheKnobs::default(),
            slowdown: Vec::new(),
            speed_changes: Vec::new(),
            stall_timeout: Duration::from_secs(120),
            snapshot_timeout: Duration::from_secs(5),
            max_stalled_rounds: 3,
            watchdog: Duration::from_secs(30),
            gamma: crate::control::weighting::DEFAULT_GAMMA,
            guard: Guard::Trend(TrendGuard::new(TREND_THRESHOLD)),
            outer: OuterKind::Average,
            easgd: None,
            overlap: None,
            fragments: 1,
            max_grad_norm: None,
            prefetch: Prefetch::Auto,
            staging: Staging::Auto,
            max_failures: usize::MAX,
            eval_every: 1,
            eval_rank: EvalRank::Fastest,
            standby: Standby::default(),
            term: 0,
            checkpoint: None,
            train: DataSpec { samples: 0, fields: Vec::new() },
            test: None,
            model: None,
            data: None,
        }
    }
}

impl RunSpec {
    /// Every rule on a run's options, checked against `machine`: the one place they are
    /// written ([`crate::Trainer::spec`] and every front end go through it).
    ///
    /// # Errors
    /// The first option that cannot run, as a [`ConfigError`] naming its [`Field`].
    pub fn check(&self, machine: &Machine) -> std::result::Result<(), ConfigError> {
        let at_least_one = |field, value: usize| {
            if value >= 1 {
                Ok(())
            } else {
                Err(ConfigError::out_of_range(field, value, "at least 1"))
            }
        };
        at_least_one(Field::BatchSize, self.batch_size)?;
        at_least_one(Field::Epochs, self.epochs)?;
        at_least_one(Field::EvalEvery, self.eval_every)?;
        if self.backend == Backend::Collective && self.wire.quantized().is_some() {
            return Err(ConfigError::unsupported(
                Field::Wire,
                format!(
                    "{} travels as deltas through the controller: the host backend only (the \
                     collective backend averages in place; use f32 or bf16 there)",
                    self.wire
                ),
            ));
        }
        let ranks = self.world();
        if ranks == 0 {
            return Err(ConfigError::unsupported(
                Field::Devices,
                "no rank to run: no device given",
            ));
        }
        let cpu_ranks = self.devices.iter().filter(|d| **d == Device::Cpu).count();
        if !self.placement.is_cluster() && cpu_ranks > machine.max_cpu_ranks() {
            let problem = Problem::TooManyRanks {
                ranks: cpu_ranks,
                cores: machine.cores,
                max: machine.max_cpu_ranks(),
            };
            return Err(ConfigError { field: Field::Devices, problem });
        }
        if self.train.samples / self.batch_size < ranks {
            let problem = Problem::TooFewSamples {
                samples: self.train.samples,
                batch_size: self.batch_size,
                ranks,
            };
            return Err(ConfigError { field: Field::BatchSize, problem });
        }
        if let EvalRank::Fixed(rank) = self.eval_rank
            && rank >= ranks
        {
            return Err(ConfigError::out_of_range(Field::EvalRank, rank, "one of the run's ranks"));
        }
        if let Standby::Rank(rank) = self.standby
            && (rank == 0 || (ranks >= 2 && rank >= ranks))
        {
            return Err(ConfigError::out_of_range(
                Field::Standby,
                rank,
                "a rank other than 0 (whose process hosts the controller), or none",
            ));
        }
        if let Some(bad) = self.slowdown.iter().find(|f| !(f.is_finite() && **f >= 1.0)) {
            return Err(ConfigError::out_of_range(
                Field::Slowdown,
                bad,
                "factors >= 1 (1 = full speed)",
            ));
        }
        if !self.slowdown.is_empty() && self.slowdown.len() != ranks {
            let problem = Problem::PerRank { given: self.slowdown.len(), ranks };
            return Err(ConfigError { field: Field::Slowdown, problem });
        }
        if let Some((change, expected)) =
            self.speed_changes.iter().find_map(|c| Some((c, c.problem(ranks)?)))
        {
            return Err(ConfigError::out_of_range(Field::SpeedChange, change, expected));
        }
        let lr = base_rate(&self.schedule);
        if !(lr.is_finite() && lr > 0.0) {
            return Err(ConfigError::out_of_range(Field::LearningRate, lr, "a positive number"));
        }
        if let Err(e) = self.schedule.validate() {
            return Err(ConfigError::unsupported(Field::Schedule, e.to_string()));
        }
        if !(self.lr_scale_ratio.is_finite() && self.lr_scale_ratio >= 0.0) {
            return Err(ConfigError::out_of_range(
                Field::LrScaleRatio,
                self.lr_scale_ratio,
                "a number >= 0",
            ));
        }
        let target = self.elche.overhead_target;
        if !OVERHEAD_TARGETS.contains(&target) {
            return Err(ConfigError::out_of_range(
                Field::OverheadTarget,
                target.to_string(),
                "from 0.01 to 0.5",
            ));
        }
        if self.elche.anchor == 0 || self.elche.min_chunk == 0 {
            let value = format!("anchor {}, min chunk {}", self.elche.anchor, self.elche.min_chunk);
            return Err(ConfigError::out_of_range(
                Field::Elche,
                value,
                "anchor and min chunk at least 1",
            ));
        }
        let deadlines = [
            (Field::StallTimeout, self.stall_timeout),
            (Field::SnapshotTimeout, self.snapshot_timeout),
            (Field::Watchdog, self.watchdog),
        ];
        for (field, deadline) in deadlines {
            if deadline.is_zero() || deadline > MAX_DEADLINE {
                return Err(ConfigError::out_of_range(
                    field,
                    format!("{deadline:?}"),
                    "more than 0 and at most a week",
                ));
            }
        }
        at_least_one(Field::SnapshotTimeout, self.max_stalled_rounds)?;
        if let Err(e) = OuterOptimizer::new(self.outer) {
            return Err(ConfigError::unsupported(Field::Outer, e.to_string()));
        }
        if let Some(mix) = self.overlap {
            if !(mix.is_finite() && mix > 0.0 && mix <= 1.0) {
                return Err(ConfigError::out_of_range(Field::Overlap, mix, "in (0, 1]"));
            }
            if self.backend != Backend::Host {
                let problem = Problem::Needs { other: Field::Backend, to_be: "host" };
                return Err(ConfigError { field: Field::Overlap, problem });
            }
        }
        if self.fragments == 0 {
            return Err(ConfigError::out_of_range(Field::Fragments, 0.0, "at least 1"));
        }
        if self.fragments > 1 {
            if self.backend != Backend::Host {
                let problem = Problem::Needs { other: Field::Backend, to_be: "host" };
                return Err(ConfigError { field: Field::Fragments, problem });
            }
            if !matches!(self.outer, OuterKind::Average) {
                let problem = Problem::Needs { other: Field::Outer, to_be: "average" };
                return Err(ConfigError { field: Field::Fragments, problem });
            }
        }
        if let Some(bad) = self.max_grad_norm.filter(|m| !(m.is_finite() && *m > 0.0)) {
            return Err(ConfigError::out_of_range(Field::MaxGradNorm, bad, "a positive number"));
        }
        if let Some(alpha) = self.easgd {
            if let Err(e) = check_easgd_alpha(alpha) {
                return Err(ConfigError::unsupported(Field::Easgd, e.to_string()));
            }
            if self.backend != Backend::Host {
                let problem = Problem::Needs { other: Field::Backend, to_be: "host" };
                return Err(ConfigError { field: Field::Easgd, problem });
            }
        }
        if let Err(e) = crate::control::weighting::work_masses(&[1], self.gamma) {
            return Err(ConfigError::unsupported(Field::Gamma, e.to_string()));
        }
        if let Some(c) = &self.checkpoint {
            at_least_one(Field::KeepCheckpoints, c.keep)?;
        }
        if let Some(model) = self.model {
            self.check_memory(model, machine)?;
        }
        Ok(())
    }

    /// Refuses a model whose replicas do not fit a device's free memory: in one process, every
    /// rank on a device holds a replica there; in a cluster run, each process holds one.
    fn check_memory(
        &self,
        model: ModelSize,
        machine: &Machine,
    ) -> std::result::Result<(), ConfigError> {
        let mut seen: Vec<Device> = Vec::new();
        for &device in &self.devices {
            if seen.contains(&device) {
                continue;
            }
            seen.push(device);
            let replicas = if self.placement.is_cluster() {
                1
            } else {
                self.devices.iter().filter(|d| **d == device).count()
            };
            let needs = model.replica_bytes().saturating_mul(replicas as u64);
            if let Some(free) = machine.free(device)
                && needs > free
            {
                let problem = Problem::OutOfMemory { device, replicas, needs, free };
                return Err(ConfigError { field: Field::ModelSize, problem });
            }
        }
        Ok(())
    }

    /// Ranks in the run.
    pub fn world(&self) -> usize {
        self.devices.len()
    }

    /// How model states travel between processes: the wire format, and the fragments each
    /// connection's views are cut into (1 for none).
    pub(crate) fn wire_cut(&self) -> (crate::link::frame::WireFormat, usize) {
        (self.wire, self.fragments.max(1))
    }

    /// Whether the controller runs in a process of its own, outside the ranks' processes: with
    /// the collective backend across CPU rank processes the ranks form an MPI world (the data
    /// plane) that the controller is not part of, so every rank, rank 0 included, joins it over
    /// the cluster link. Otherwise rank 0's process hosts the controller.
    pub fn controller_apart(&self) -> bool {
        self.collective_engine() == Some(CollectiveEngine::Mpi)
    }

    /// The rank whose process holds the standby controller of this run's term: in a cluster
    /// run of processes on the host backend with a [`Standby`], the host of the next term
    /// ([`RunSpec::term_host`]).
    pub fn standby_rank(&self) -> Option<usize> {
        let eligible = self.placement == Placement::Processes && self.backend == Backend::Host;
        self.term_host(self.term.checked_add(1)?).filter(|_| eligible)
    }

    /// The rank whose process hosts the controller of `term`: rank 0's for the first, then the
    /// chain of standbys ([`Standby::host`]).
    pub fn term_host(&self, term: u64) -> Option<usize> {
        self.standby.host(term, self.world())
    }

    /// The engine of the collective backend, `None` on the host backend: MPI for CPU rank
    /// processes (the in-memory engine for the CPU ranks of an in-memory cluster run); NCCL
    /// when every rank is a GPU — distinct GPUs in-process; in a cluster run each process's
    /// own — and the build has the `cuda` feature; the host all-reduce otherwise (`mixed` when
    /// the world has both GPU and CPU ranks). The rule is [`CollectiveEngine::choose`].
    pub fn collective_engine(&self) -> Option<CollectiveEngine> {
        CollectiveEngine::choose(self.backend, self.placement, &self.devices)
    }

    /// Full batches per epoch (the tail smaller than a batch is dropped).
    pub fn batches_per_epoch(&self) -> usize {
        self.train.samples / self.batch_size.max(1)
    }

    /// The hash of the whole spec (sha256 of its canonical encoding): two processes run the
    /// same run exactly when their specs' hashes are equal.
    ///
    /// # Errors
    /// [`CheckpointError::Encode`] (as [`crate::Error::Checkpoint`]) when the spec does not
    /// encode.
    pub fn hash(&self) -> Result<ConfigHash> {
        Ok(canonical(SPEC_TAG, self)?)
    }

    /// The settings a resumed bundle must share with this run (see [`ResumeTerms`]).
    pub fn resume_terms(&self) -> ResumeTerms {
        ResumeTerms {
            policy: self.policy,
            backend: self.backend,
            batch_size: self.batch_size,
            train: self.train.clone(),
            seed: self.seed,
            schedule: self.schedule.clone(),
            lr_scale_ratio: self.lr_scale_ratio,
            gamma: self.gamma,
            outer: self.outer,
            easgd: self.easgd,
            max_grad_norm: self.max_grad_norm,
            elche: ElCheKnobs { speed_hint: None, ..self.elche.clone() },
        }
    }

    /// The hash of [`resume_terms`](Self::resume_terms): policy, backend, batch size,
    /// training-set identity (length and layout), seed, schedule, linear-scaling ratio, γ, outer
    /// optimizer, EASGD, clipping and ElChe's knobs — not the world size or the devices (a
    /// bundle resumes onto another world), nor the epoch count, slowdown, timeouts, failure
    /// limits, prefetching, evaluation, checkpointing or the guard. Bundles record it, and a
    /// bundle resumes only into a run with the same one ([`check_bundle`](Self::check_bundle)).
    ///
    /// # Errors
    /// As [`RunSpec::hash`].
    pub fn compat_hash(&self) -> Result<ConfigHash> {
        Ok(canonical(COMPAT_TAG, &self.resume_terms())?)
    }

    /// Checks that `bundle` may resume into this run: its recorded terms equal this run's
    /// (the world size and devices may differ). A bundle written before elastic resume, which
    /// records only a hash that covered its world size, is checked against that hash with the
    /// bundle's world.
    ///
    /// # Errors
    /// [`CheckpointError::TermMismatch`] naming the first field that differs, when the bundle
    /// records its terms; [`CheckpointError::ConfigMismatch`] when the hashes differ otherwise;
    /// [`CheckpointError::Encode`] or a decode error when the terms do not encode or decode.
    pub fn check_bundle(&self, bundle: &Checkpoint) -> std::result::Result<(), CheckpointError> {
        let terms = self.resume_terms();
        let hash = canonical(COMPAT_TAG, &terms)?;
        if bundle.config_hash == hash {
            return Ok(());
        }
        if let Some(theirs) = bundle.resume_terms()? {
            if let Some((field, expected, found)) = terms.first_difference(&theirs) {
                return Err(CheckpointError::TermMismatch { field, expected, found });
            }
        } else {
            let legacy = LegacyTerms {
                world: bundle.world_size,
                policy: self.policy,
                backend: self.backend,
                batch_size: self.batch_size,
                train: &self.train,
                seed: self.seed,
                schedule: &self.schedule,
                lr_scale: crate::control::schedule::lr_scale(
                    bundle.world_size,
                    self.lr_scale_ratio,
                ),
                gamma: self.gamma,
                outer: self.outer,
                easgd: self.easgd,
                max_grad_norm: self.max_grad_norm,
                elche: &self.elche,
            };
            if bundle.config_hash == canonical(LEGACY_COMPAT_TAG, &legacy)? {
                return Ok(());
            }
        }
        Err(CheckpointError::ConfigMismatch { expected: hash, found: bundle.config_hash })
    }
}

/// Devices as their names (`cpu`, `cuda:0`): flodl-tensor has no serde.
mod device_names {
    use flodl_tensor::Device;
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(devices: &[Device], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(devices.iter().map(ToString::to_string))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Device>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|name| name.parse::<Device>().map_err(D::Error::custom))
            .collect()
    }
}

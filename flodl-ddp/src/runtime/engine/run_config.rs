//! The run's input: the spec every process agrees on plus what only this process holds (the
//! factory, the datasets, the callbacks, the opened checkpoint store), as the face hands it to
//! [`super::start`].

use std::sync::Arc;
use std::time::Duration;

use flodl_data::Dataset;
use flodl_tensor::Device;

use crate::Result;
use crate::checkpoint::{Checkpoint, CheckpointStore, EpochCoverage, RankMap, SaveInterval};
use crate::contract::replica::{Replica, ReplicaContext};
use crate::control::elche::ElCheState;
use crate::control::guard::Guard;
use crate::control::metrics::EpochMetrics;
use crate::control::policy::Policy;
use crate::control::speed_change::SpeedChange;
use crate::link::wire::RankRestore;
use crate::runtime::spec::RunSpec;
use crate::state::HostState;

/// Builds a rank's replica inside the rank's thread.
pub(crate) type Factory = Arc<dyn Fn(&ReplicaContext) -> Result<Box<dyn Replica>> + Send + Sync>;

/// Observes every training batch: `(rank, epoch, sample indices)`, called on the rank's thread
/// before the batch is trained (for data-coverage audits).
pub type SampleAudit = Arc<dyn Fn(usize, usize, &[usize]) + Send + Sync>;

/// Called with every epoch's metrics (its evaluation included), in order, on the thread that
/// aggregates them, before [`DdpHandle`](crate::DdpHandle) sees them. A panic in it ends the
/// run.
pub type EpochCallback = Arc<dyn Fn(&crate::EpochMetrics) + Send + Sync>;

/// A run as [`crate::Trainer::run`] starts it: the spec every process agrees on, plus what only this
/// process holds.
pub(crate) struct RunConfig {
    /// What every process of the run agrees on.
    pub(crate) spec: RunSpec,
    pub(crate) factory: Factory,
    pub(crate) dataset: Arc<dyn Dataset>,
    pub(crate) test: Option<Arc<dyn Dataset>>,
    pub(crate) on_epoch: Option<EpochCallback>,
    pub(crate) audit: Option<SampleAudit>,
    /// Where the coordinator writes the exactly-once ledger.
    pub(crate) ledger: Option<std::path::PathBuf>,
    /// The opened checkpoint store and its interval (from `spec.checkpoint`), when saving.
    pub(crate) checkpoints: Option<CheckpointPlan>,
    /// The checkpoint this run resumes from.
    pub(crate) resume: Option<Arc<Resumed>>,
    /// In a cluster run, this process's rank and the device it trains on (the spec names the
    /// kind only).
    pub(crate) own: Option<(usize, Device)>,
    /// The lane's sending end to a standby controller, when the run has one: the coordinator
    /// streams its state's changes into it (`engine/standby/`).
    pub(crate) standby: Option<flume::Sender<Vec<u8>>>,
    /// In a cluster run's standby rank process: the mirror its rank folds the controller's
    /// state into (`ToWorker::Mirror`).
    pub(crate) mirror: Option<crate::runtime::engine::standby::SharedMirror>,
}

impl RunConfig {
    /// How long a side stays quiet before it says it is alive: well within both the stall
    /// timeout and the watchdog.
    pub(crate) fn heartbeat(&self) -> Duration {
        crate::link::heartbeat(self.spec.stall_timeout.min(self.spec.watchdog))
    }

    /// How long a collective waits for its peers before it fails (and aborts its group): the
    /// watchdog deadline.
    pub(crate) fn comm_timeout(&self) -> Duration {
        self.spec.watchdog
    }

    /// Whether reduces measure the replicas' divergence: a guard is on and the policy has
    /// windows to shrink (not `Sync`).
    pub(crate) fn measures_divergence(&self) -> bool {
        self.spec.policy != Policy::Sync && !matches!(self.spec.guard, Guard::Off)
    }

    /// Ranks in the run.
    pub(crate) fn world(&self) -> usize {
        self.spec.world()
    }

    /// The device `rank` trains on: this process's own device for its rank in a cluster run,
    /// the spec's otherwise.
    pub(crate) fn device(&self, rank: usize) -> Device {
        match self.own {
            Some((own, device)) if own == rank => device,
            _ => self.spec.devices.get(rank).copied().unwrap_or(Device::Cpu),
        }
    }

    /// Full batches per epoch (the tail smaller than a batch is dropped).
    pub(crate) fn batches_per_epoch(&self) -> usize {
        self.spec.batches_per_epoch()
    }

    /// The learning rate of a step taken at cohort step `step` (schedule × linear scaling).
    pub(crate) fn lr(&self, step: u64) -> f32 {
        (self.spec.schedule.lr(step) * self.spec.lr_scale) as f32
    }

    /// The slowdown factor of `rank` at cohort step `step` (1 when none is configured): its
    /// slowdown times the speed changes in force at that point of the run.
    pub(crate) fn slowdown(&self, rank: usize, step: u64) -> f64 {
        let base = self.spec.slowdown.get(rank).copied().unwrap_or(1.0);
        if self.spec.speed_changes.is_empty() {
            return base;
        }
        let total = (self.spec.epochs * self.batches_per_epoch()).max(1);
        let progress = step as f64 / total as f64;
        base * SpeedChange::factor_at(&self.spec.speed_changes, rank, progress)
    }

    /// Whether the end of `epoch` is evaluated.
    pub(crate) fn evaluates(&self, epoch: usize) -> bool {
        self.test.is_some()
            && ((epoch + 1).is_multiple_of(self.spec.eval_every) || epoch + 1 == self.spec.epochs)
    }
}

impl std::fmt::Debug for RunConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunConfig").field("spec", &self.spec).finish_non_exhaustive()
    }
}

/// Where and when a run saves checkpoints.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointPlan {
    /// The bundle directory, opened (created, cleared of interrupted saves) when the run
    /// starts.
    pub(crate) store: CheckpointStore,
    /// Periodic saves.
    pub(crate) interval: SaveInterval,
}

/// A checkpoint decoded for the coordinator of a resumed run.
#[derive(Debug)]
pub(crate) struct Resumed {
    /// The bundle as read (for the model-signature check once the replicas are built).
    pub(crate) bundle: Checkpoint,
    /// The consensus to load on every rank.
    pub(crate) consensus: HostState,
    /// Each rank's optimizer and outer state.
    pub(crate) ranks: Vec<RankRestore>,
    /// ElChe's state, when the run had one.
    pub(crate) elche: Option<ElCheState>,
    /// The divergence guard's state.
    pub(crate) guard: Option<Guard>,
    /// The epochs completed before the save, with their metrics.
    pub(crate) epochs: Vec<EpochMetrics>,
    /// The coverage of the open epochs.
    pub(crate) coverage: Vec<EpochCoverage>,
    /// Whose per-rank state each rank takes (the saving world may differ: elastic resume).
    pub(crate) map: RankMap,
}

//! Local-SGD data parallelism across unequal devices: one model, several ranks (GPUs or
//! single-thread CPU "devices"), none idle.
//!
//! Every rank owns a full replica and its own optimizer ([`Replica`]; the reference replica is
//! [`Mlp`]) and trains the chunks of each epoch's permutation that the coordinator hands it;
//! now and then the replicas' parameters are replaced by their work-weighted average. Two knobs:
//!
//! - [`Policy`], when to average: `Sync` (after every step, static equal shares, bitwise
//!   deterministic on CPU ranks), `Cadence` (ElChe sizes each rank's window so all ranks reach
//!   the reduce together; progressive dispatch), `Async` (ElChe windows plus a bounded overshoot).
//! - [`Backend`], how: `Collective` (in-place weighted all-reduce through flodl-nccl) or `Host`
//!   (snapshots averaged on a coordinator helper thread under a deadline, soft-aborted and
//!   retried when late).
//!
//! Refinements of the average, all on both backends: work weighting with exponent γ
//! ([`Trainer::gamma`], mass = steps^γ), an outer optimizer on the consensus
//! ([`Trainer::outer`]: plain average, SlowMo, DiLoCo Nesterov), the divergence guard whose
//! verdicts ElChe obeys ([`Trainer::guard`], readings in [`DdpHandle::poll_guard_events`]),
//! EASGD blending on the host backend ([`Trainer::easgd`]) and per-rank gradient clipping
//! ([`Trainer::max_grad_norm`]).
//!
//! [`Trainer`] configures a run and [`Trainer::run`] starts it at once; the [`DdpHandle`] streams
//! [`EpochMetrics`] and [`ReduceEvent`]s while it trains, and [`DdpHandle::join`] returns the
//! averaged model as a [`TrainedState`]. A world of one rank runs the same API with no
//! coordinator. Threads: one per rank, one coordinator; messages are closed enums on bounded
//! channels; every wait has a deadline. A rank whose replica fails, panics or hangs past the
//! [watchdog](Trainer::watchdog) is declared dead and the survivors go on without it
//! ([`FaultEvent`]s in [`DdpHandle::poll_fault_events`]); when none can, the run ends with
//! [`Error::Unrecoverable`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use flodl_data::{Dataset, Mnist, Split, Verify};
//! use flodl_ddp::{Backend, Devices, Mlp, MlpConfig, Optimizer, Policy, Trainer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = flodl_data::mnist::vendored_dir();
//! let train: Arc<dyn Dataset> = Arc::new(Mnist::load(&dir, Split::Train, Verify::Skip)?);
//! let test: Arc<dyn Dataset> = Arc::new(Mnist::load(&dir, Split::Test, Verify::Skip)?);
//! let mlp = MlpConfig::new(&[784, 256, 128, 10], Optimizer::sgd(0.9));
//! let mut run = Trainer::new(Mlp::factory(mlp))
//!     .dataset(train)
//!     .test_dataset(test, 1)
//!     .batch_size(64)
//!     .epochs(5)
//!     .devices(Devices::Cpu(2))
//!     .policy(Policy::Cadence)
//!     .backend(Backend::Collective)
//!     .learning_rate(0.05)
//!     .slowdown(vec![1.0, 2.5]) // rank 1 emulates a device 2.5x slower
//!     .run()?;
//! while let Some(epoch) = run.next_metrics(std::time::Duration::from_secs(600)) {
//!     println!("epoch {} loss {:.4} eval {:?}", epoch.epoch, epoch.avg_loss, epoch.eval);
//! }
//! let state = run.join()?;
//! println!("{:.0} samples/s", state.throughput());
//! # Ok(())
//! # }
//! ```
//!
//! # A custom replica
//!
//! Any model trains once it implements [`Replica`]: four required methods
//! ([`train_step`](Replica::train_step), [`step`](Replica::step),
//! [`parameters`](Replica::parameters), [`parameters_mut`](Replica::parameters_mut)) and optional
//! parts with defaults — mutable gradients (needed by [`Trainer::max_grad_norm`], checked when
//! the replicas are built: [`Error::MissingCapability`] otherwise), buffers, optimizer state for
//! checkpoints, and [`evaluate_batch`](Replica::evaluate_batch) for test-set evaluations and
//! [`evaluate`]. The factory given to [`Trainer::new`] builds one replica per rank, inside the
//! rank's thread, from a [`ReplicaContext`] (device, stream, batch size, seed); every rank must
//! build the same initial parameters.
//!
//! # The cooperative tier
//!
//! A stack with its own autograd and optimizer needs no [`Replica`]:
//! [`Trainer::run_cooperative`] hands out one [`Worker`] per rank, driven by the user's own loop
//! on a thread of theirs (`while let Some(step) = worker.next_step(&mut params)? { ..;
//! let lr = step.finish(loss)?; .. }`), while the runtime keeps dispatch, ElChe, the policy and
//! backend, the schedule, metrics, checkpoints and fault handling. The parameters cross through
//! the user's [`Parameters`] only when a reduce needs them. `examples/candle-mnist` in the
//! repository trains a candle LeNet-5 both ways.
//!
//! A [`Batch`] follows the dataset's layout: its fields come in the order of the dataset's
//! [`SampleLayout`](flodl_data::SampleLayout) (MNIST: `image`, then `label`), each with its
//! field's dtype (f32 or i32: MNIST's label is i32); a field whose samples are scalars arrives as
//! `[n]`, any other as `[n, features]` (MNIST's image as `[n, 784]`). Training batches hold
//! exactly [`ReplicaContext::batch_size`] samples; evaluation batches may be shorter.
//!
//! Softmax regression on MNIST, written only against the public API (this is
//! `examples/softmax.rs`; a test trains it past 85% test accuracy on 8192 images):
//!
#![doc = concat!("```no_run\n", include_str!("../examples/softmax.rs"), "```")]

pub mod checkpoint;
mod config_error;
pub mod contract;
pub mod control;
pub mod cooperative;
mod error;
pub mod ledger;
mod link;
mod mlp;
mod runtime;
mod state;

pub use checkpoint::{Checkpoint, CheckpointError, CheckpointStore};
pub use config_error::{ConfigError, Field, Problem};
pub use contract::model_size::ModelSize;
pub use contract::{
    Batch, BatchEval, Capability, FailingReplica, Failure, Replica, ReplicaContext, TrainerOption,
    evaluate,
};
pub use control::breakdown::{Activity, Straggler, TimeBreakdown, straggler};
pub use control::dispatch::{Chunk, Cutting, Dispatcher};
pub use control::elche::{ElChe, ElCheState, Growth, OVERHEAD_TARGETS, WindowReading, clamp_total};
pub use control::eval_rank::EvalRank;
pub use control::logic_error::{LogicError, LogicResult};
pub use control::metrics::{
    CacheTally, EpochMetrics, EpochTally, EvalMetrics, Exchange, GuardEvent, RankEpochMetrics,
    ReduceEvent, Report, WorkTally, record_scalar,
};
pub use control::overshoot::{Overshoot, OvershootMode};
pub use control::policy::{Backend, Policy, Window};
pub use control::schedule_kind::ScheduleKind;
pub use control::speed_change::SpeedChange;
pub use control::standby::Standby;
pub use control::verdict::Verdict;
pub use cooperative::{Parameters, Step, Worker};
pub use error::{Divergence, Error, Internal, Peer, Result};
pub use link::failure::{FailureKind, RankFailure};
pub use link::frame::WireFormat;
#[doc(hidden)]
pub use link::fuzz as fuzz_targets;
#[doc(hidden)]
pub use link::rig as wire_rig;
pub use link::text::WireText;
pub use link::wire::WIRE_VERSION;
pub use mlp::{Mlp, MlpConfig, Optimizer};
pub use runtime::as_text;
#[cfg(feature = "cluster")]
pub use runtime::cluster::DEFAULT_BULK_CAP;
pub use runtime::cluster::{Cluster, DEFAULT_JOIN_TIMEOUT, RankHandle, Seat, Started};
pub use runtime::engine::fault::{FaultCause, FaultEvent, Misconduct, RejoinEvent};
pub use runtime::engine::outlets::TrainedState;
pub use runtime::engine::prefetch::Prefetch;
pub use runtime::engine::run_config::{EpochCallback, SampleAudit};
pub use runtime::engine::staging::Staging;
pub use runtime::handle::{Cooperative, DdpHandle};
pub use runtime::settings::RunSettings;
pub use runtime::spec::{
    CheckpointSpec, CollectiveEngine, DataChecksums, DataSpec, ElCheKnobs, FieldSpec, MAX_DEADLINE,
    Machine, Placement, ResumeTerms, RunSpec,
};
pub use runtime::takeover::{StandbyMirror, Takeover};
pub use runtime::trainer::{Devices, ResumeFrom, Trainer};
pub use state::HostTensor;

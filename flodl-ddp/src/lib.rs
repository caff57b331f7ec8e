//! flodl-ddp (being built; see ARCHITECTURE.md).

pub mod checkpoint;
pub use checkpoint::{Checkpoint, CheckpointError, CheckpointStore};
pub mod elche;
pub mod logic_error;
pub mod verdict;
pub use elche::{ElChe, ElCheState, Growth, Membership, Phase, clamp_total};
pub use logic_error::{LogicError, LogicResult};
pub use verdict::Verdict;

pub mod chunk_pool;
pub mod chunk_size;
pub mod epoch_stream;
pub mod overshoot;
pub mod partition;
pub use chunk_pool::{Chunk, ChunkPool, Coverage, Tail};
pub use chunk_size::{ChunkSizing, Speeds, window_allocation};
pub use epoch_stream::{EpochStream, StreamCoverage};
pub use overshoot::{Overshoot, OvershootMode};

pub mod policy;
pub use policy::{Backend, Policy};

pub mod schedule;

// The runtime: replicas, trainer, workers, coordinator, averaging backends, metrics.
mod comm;
mod coordinator;
mod dispatch;
mod error;
mod handle;
mod host_round;
mod message;
mod metrics;
mod mlp;
mod replica;
mod solo;
mod staging;
mod trainer;
mod worker;
pub use error::{Error, Result};
pub use handle::{DdpHandle, HostTensor, TrainedState};
pub use metrics::{
    EpochMetrics, EvalMetrics, RankEpochMetrics, ReduceEvent, Report, record_scalar,
};
pub use mlp::{Mlp, MlpConfig, Optimizer};
pub use replica::{Batch, BatchEval, Replica, ReplicaContext};
pub use trainer::{Devices, ElCheKnobs, SampleAudit, Trainer};

pub mod guard;

pub mod outer;
pub mod weighting;

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

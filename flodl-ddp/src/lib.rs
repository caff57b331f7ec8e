//! flodl-ddp (being built; see ARCHITECTURE.md).

pub mod checkpoint;
pub use checkpoint::{Checkpoint, CheckpointError, CheckpointStore};
pub mod elche;
pub mod logic_error;
pub mod verdict;
pub use elche::{ElChe, ElCheState, Growth, Membership, Phase, clamp_total};
pub use logic_error::{LogicError, LogicResult};
pub use verdict::Verdict;

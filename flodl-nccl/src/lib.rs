//! flodl-nccl: the collective contract, an in-process host collective and an abortable NCCL binding.

mod abort;
mod error;
mod host;
mod reduction;
mod rendezvous;

pub use abort::AbortHandle;
pub use error::{Error, Result};
pub use host::{DEFAULT_TIMEOUT, HostComm};

//! flodl-nccl: the collective contract, an in-process host collective and an abortable NCCL binding.

mod abort;
mod collective;
mod error;
mod host;
#[cfg(feature = "cuda")]
mod nccl;
mod plan;
mod reduction;
mod rendezvous;

pub use abort::AbortHandle;
pub use collective::Collective;
pub use error::{Error, Result};
pub use host::{DEFAULT_TIMEOUT, HostComm};
#[cfg(feature = "cuda")]
pub use nccl::{
    DeviceBuffer, NCCL_LIB_ENV, NcclComm, NcclDType, NcclVersion, RawStream, Reduction, UniqueId,
    nccl_version,
};

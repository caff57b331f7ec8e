//! The NCCL binding: a thin FFI loaded at run time, the unique id, and the abortable communicator.

mod collective;
mod comm;
mod library;
mod slot;
mod unique_id;
mod watchdog;

pub use comm::{DeviceBuffer, NcclComm, NcclDType, Reduction};
pub use library::{
    NCCL_LIB_ENV, NcclVersion, RawStream, nccl_library, nccl_skip_reason, nccl_version,
};
pub use unique_id::UniqueId;

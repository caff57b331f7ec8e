//! The CUDA backend: contexts, streams, events, memory, NVRTC kernels and cuBLAS gemm.
//!
//! The driver goes through cudarc's safe layer, loaded at run time; cudarc panics when the
//! driver library is missing, so no cudarc function is called before `context::probe` has found
//! it (`is_culib_present`). NVRTC and cuBLAS are loaded by flodl itself (`nvrtc`, `cublas`,
//! from the candidates of [`crate::library_search`]), so CUDA 12 and 13 runtimes both work, and
//! a missing one is an error, never a panic.

mod context;
mod cublas;
mod event;
mod kernels;
mod library_report;
mod nvrtc;
mod pinned;
mod runtime_library;
mod storage;
mod stream;

pub(crate) mod ops;

pub(crate) use context::{device_count, device_infos, unavailable_reason};
pub(crate) use event::CudaEvent;
pub(crate) use library_report::library_reports;
pub(crate) use pinned::PinnedHost;
pub(crate) use storage::CudaStorage;
pub(crate) use stream::CudaStream;

/// Records a stream's queued work as a tensor's latest write when dropped.
pub(crate) type WriteRecord<'a> = cudarc::driver::SyncOnDrop<'a>;

use crate::Error;

/// Wraps a cudarc error as [`Error::Cuda`] for operation `op`.
pub(crate) fn cuda_err<E: std::error::Error + Send + Sync + 'static>(
    op: &'static str,
) -> impl Fn(E) -> Error {
    move |e| Error::Cuda { op, source: Box::new(e) }
}

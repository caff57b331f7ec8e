//! The CUDA backend: contexts, streams, events, memory, NVRTC kernels and cuBLAS gemm.
//!
//! Everything goes through cudarc's safe layer, loaded at run time. cudarc panics when a CUDA
//! library is missing, so no cudarc function is called before [`probe`] has found the driver
//! library (`is_culib_present`), and NVRTC and cuBLAS are probed the same way before first use.

mod context;
mod event;
mod kernels;
mod pinned;
mod storage;
mod stream;

pub(crate) mod ops;

pub(crate) use context::{device_count, device_infos, unavailable_reason};
pub(crate) use event::CudaEvent;
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

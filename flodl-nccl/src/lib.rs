//! flodl-nccl: the collective contract, an in-process host collective and an abortable NCCL binding.
//!
//! - [`Collective`]: what the DDP runtime calls on a rank's communicator (weighted all-reduce,
//!   sum, broadcast, barrier, abort handle, timeout), over tensors.
//! - [`HostComm`]: ranks as threads of one process, reducing `f32` host memory cooperatively and
//!   deterministically; implements [`Collective`] for CPU tensors and offers slice-level entry
//!   points for host buffers. Survivors of a failed group continue with [`HostComm::shrink`].
//! - `NcclComm` (feature `cuda`): one rank of an NCCL communicator, loaded at run time, created
//!   non-blocking, watched by a watchdog thread and abortable from any thread; implements
//!   [`Collective`] for CUDA tensors on its GPU, and offers raw device-pointer entry points.
//! - `MpiComm` (feature `mpi`): one rank per process of an MPI world, for CPU ranks in
//!   separate processes; implements [`Collective`] for CPU tensors. A world cannot shrink: a
//!   collective abandoned in flight ends the MPI job.
//! - [`AbortHandle`]: a cloneable, idempotent way to kill a group and wake every waiting rank.
//!
//! ```
//! use flodl_nccl::HostComm;
//!
//! # fn main() -> flodl_nccl::Result<()> {
//! let counts = [3.0f32, 1.0]; // batches each rank ran since the last average
//! let results = std::thread::scope(|s| {
//!     let ranks: Vec<_> = HostComm::group(2)
//!         .into_iter()
//!         .map(|mut comm| {
//!             s.spawn(move || {
//!                 let mut params = vec![comm.rank() as f32 * 4.0; 3];
//!                 let weight = counts[comm.rank()] / counts.iter().sum::<f32>();
//!                 comm.all_reduce_weighted_f32(&mut [&mut params], weight).map(|()| params)
//!             })
//!         })
//!         .collect();
//!     ranks.into_iter().map(|r| r.join().expect("rank thread")).collect::<Vec<_>>()
//! });
//! for params in results {
//!     assert_eq!(params?, vec![1.0; 3]); // 0.75 · 0 + 0.25 · 4
//! }
//! # Ok(())
//! # }
//! ```

mod abort;
mod collective;
mod error;
mod host;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "cuda")]
mod nccl;
mod plan;
mod reduction;
mod rendezvous;

pub use abort::AbortHandle;
pub use collective::Collective;
pub use error::{Error, Result};
pub use host::{DEFAULT_TIMEOUT, HostComm};
#[cfg(feature = "mpi")]
pub use mpi::MpiComm;
#[cfg(feature = "cuda")]
pub use nccl::{
    DeviceBuffer, NCCL_LIB_ENV, NcclComm, NcclDType, NcclVersion, RawStream, Reduction, UniqueId,
    nccl_library, nccl_skip_reason, nccl_version,
};

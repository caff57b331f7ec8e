//! The crate's error type: every way a collective can fail, as a matchable enum.

use std::time::Duration;

/// Why a collective operation (or building a communicator) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The group was aborted (by an [`AbortHandle`](crate::AbortHandle), a timed-out peer or the
    /// NCCL watchdog); the communicator is dead and must be rebuilt or shrunk.
    #[error("collective aborted")]
    Aborted,
    /// This rank waited longer than the communicator's timeout; the group is aborted as a result.
    #[error("collective `{op}` timed out after {after:?}")]
    TimedOut {
        /// The operation that was waiting.
        op: &'static str,
        /// How long it waited.
        after: Duration,
    },
    /// A peer dropped its communicator (or its thread panicked) while the group was in use.
    #[error("rank {rank} left the group")]
    PeerLost {
        /// The rank that left.
        rank: usize,
    },
    /// The ranks called different operations, or passed buffers that disagree.
    #[error("ranks disagree on {what}: rank {rank} has {found}, rank 0 has {expected}")]
    Mismatch {
        /// What differs (operation, buffer count, buffer length, root).
        what: &'static str,
        /// The first rank that differs from rank 0.
        rank: usize,
        /// Rank 0's value.
        expected: String,
        /// The differing rank's value.
        found: String,
    },
    /// An argument is out of range or unsupported (rank, root, dtype, device, survivor list).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// NCCL returned an error code.
    #[error("NCCL error {code} ({name}): {message}")]
    Nccl {
        /// The raw `ncclResult_t`.
        code: i32,
        /// The symbolic name of the code.
        name: &'static str,
        /// NCCL's own description (from `ncclGetErrorString`/`ncclGetLastError`).
        message: String,
    },
    /// The NCCL library could not be loaded, or lacks a required symbol.
    #[error("NCCL library unavailable: {0}")]
    LibraryMissing(String),
    /// The NCCL library is older than a feature needs.
    #[error("NCCL {found} is too old for {feature} (needs {needed})")]
    Unsupported {
        /// What needs the newer library.
        feature: &'static str,
        /// The library version found, as `major.minor.patch`.
        found: String,
        /// The minimum version, as `major.minor.patch`.
        needed: &'static str,
    },
    /// No usable CUDA GPU (no driver, no device, or the device index is out of range).
    #[error("no GPU: {0}")]
    NoGpu(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver error: {0}")]
    Cuda(String),
    /// MPI cannot be used in this process (already initialized, too weak thread support, a
    /// library that will not say what it is).
    #[error("MPI: {0}")]
    Mpi(String),
    /// A tensor operation failed (e.g. a tensor is not on the device the communicator needs).
    #[error(transparent)]
    Tensor(#[from] flodl_tensor::Error),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

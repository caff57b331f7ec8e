//! The `Collective` contract: what the DDP runtime needs from a communicator.

use std::time::Duration;

use flodl_tensor::{Stream, Tensor};

use crate::abort::AbortHandle;
use crate::error::Result;

/// One rank of a group that reduces tensors in place.
///
/// Every rank calls the same operations in the same order with tensors of the same shapes and
/// dtypes. Each operation waits at most [`timeout`](Self::timeout) for the other ranks. After
/// `Aborted`, `TimedOut`, `PeerLost` or `Nccl` the communicator is dead (shrink or rebuild it).
/// `Mismatch` is seen by every rank and changes nothing. `InvalidArgument` (a tensor on the
/// wrong device, an unsupported dtype, a bad root) is detected locally before the rendezvous:
/// the failing rank does not take part, so its peers time out unless it aborts the group.
pub trait Collective: Send {
    /// This communicator's rank, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world_size(&self) -> usize;

    /// In place, on every rank: `tensors[i] ← Σ_r w_r·tensors_r[i]`, where `w_r` is the `weight`
    /// rank `r` passed (work-weighted averaging: weights that sum to 1).
    ///
    /// # Errors
    /// `InvalidArgument` for tensors on the wrong device or of an unsupported dtype; `Mismatch`
    /// when the ranks' tensors disagree; `Aborted`, `TimedOut`, `PeerLost`, `Nccl` on failure.
    fn all_reduce_weighted(
        &mut self,
        tensors: &mut [&mut Tensor],
        weight: f32,
        stream: &Stream,
    ) -> Result<()>;

    /// In place, on every rank: `tensors[i] ← Σ_r tensors_r[i]`.
    ///
    /// # Errors
    /// As for [`all_reduce_weighted`](Self::all_reduce_weighted).
    fn all_reduce_sum(&mut self, tensors: &mut [&mut Tensor], stream: &Stream) -> Result<()>;

    /// Copies `root`'s tensors into every other rank's tensors.
    ///
    /// # Errors
    /// As for [`all_reduce_weighted`](Self::all_reduce_weighted), and `InvalidArgument` for a
    /// root outside the group.
    fn broadcast(
        &mut self,
        tensors: &mut [&mut Tensor],
        root: usize,
        stream: &Stream,
    ) -> Result<()>;

    /// Waits until every rank has reached the barrier.
    ///
    /// # Errors
    /// `Aborted`, `TimedOut`, `PeerLost`, `Nccl` on failure.
    fn barrier(&mut self) -> Result<()>;

    /// A handle that aborts this communicator (and wakes every waiting rank) from any thread.
    fn abort_handle(&self) -> AbortHandle;

    /// How long one operation may wait for the other ranks.
    fn timeout(&self) -> Duration;

    /// Sets how long one operation may wait for the other ranks (default 30 s).
    fn set_timeout(&mut self, timeout: Duration);
}

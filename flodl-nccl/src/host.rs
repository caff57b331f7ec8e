//! `HostComm`: a collective whose ranks are threads of one process, reducing host memory.

use std::sync::Arc;
use std::time::Duration;

use flodl_tensor::{DType, Device, Stream, Tensor};

use crate::abort::AbortHandle;
use crate::collective::Collective;
use crate::error::{Error, Result};
use crate::plan::{Op, RawBuf};
use crate::rendezvous::Group;

/// The deadline every operation gets unless [`HostComm::set_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// One rank of a group of threads that reduce `f32` host buffers together.
///
/// Build the whole group with [`HostComm::group`] and move each communicator into its rank's
/// thread. Every rank must call the same operations in the same order with buffers of equal
/// lengths. The ranks cooperate: the joint buffers are cut into cache-line-aligned chunks (about
/// eight per rank) that the running ranks take from a shared counter; for its chunk a rank reads
/// every rank's input and writes the result into every rank's buffer, so each element is read
/// once and written once per rank, nothing is copied twice, and a rank that the OS deschedules
/// does not hold the others back.
///
/// Results are deterministic: element `i` is always `((w_0·x_0 + w_1·x_1) + w_2·x_2) + ...` in
/// `f32`, in rank order, whichever thread computes it, so every rank holds bitwise the same
/// result, on every run.
///
/// Failure: dropping a communicator (also during a panic's unwinding) makes every peer's current
/// and future operations fail with [`Error::PeerLost`]; [`AbortHandle::abort`] makes them fail
/// with [`Error::Aborted`]; a rank that waits longer than its timeout fails with
/// [`Error::TimedOut`] and aborts the group. Survivors continue with [`HostComm::shrink`].
#[derive(Debug)]
pub struct HostComm {
    group: Arc<Group>,
    rank: usize,
    timeout: Duration,
    /// Pointer scratch for the reduction (reused across operations).
    scratch: Vec<*mut f32>,
    /// This rank's own buffer list (reused across operations).
    mine: Vec<RawBuf>,
}

// SAFETY: the raw pointers in `scratch` and `mine` are only dereferenced inside an operation, by
// the thread that runs it, under the rendezvous protocol (see `rendezvous`); between operations
// they are stale addresses nobody reads. Everything else is `Send`.
unsafe impl Send for HostComm {}

impl HostComm {
    /// Builds a group of `world` communicators; element `r` is rank `r`.
    pub fn group(world: usize) -> Vec<HostComm> {
        let group = Group::new(world);
        (0..world)
            .map(|rank| {
                // A fresh group has no claimed rank, so joining cannot fail.
                let _ = group.join(rank);
                HostComm::with_group(Arc::clone(&group), rank)
            })
            .collect()
    }

    fn with_group(group: Arc<Group>, rank: usize) -> HostComm {
        HostComm { group, rank, timeout: DEFAULT_TIMEOUT, scratch: Vec::new(), mine: Vec::new() }
    }

    /// This communicator's rank, in `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks in the group.
    pub fn world_size(&self) -> usize {
        self.group.world()
    }

    /// How long an operation waits for the other ranks before it fails with `TimedOut`.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets how long an operation waits for the other ranks (default 30 s).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// A handle that aborts the whole group from any thread.
    pub fn abort_handle(&self) -> AbortHandle {
        self.group.abort_handle()
    }

    /// The ranks currently blocked waiting for their peers (a diagnostic: the ranks *not* listed
    /// are the late ones).
    pub fn waiting_ranks(&self) -> Vec<usize> {
        self.group.waiting_ranks()
    }

    /// The ranks of this group whose communicators have not been dropped, in order: after a
    /// `PeerLost`, the natural survivor list for [`shrink`](Self::shrink). Ranks that drop later
    /// are not foreseen, so survivors should agree on one list (the coordinator's) rather than
    /// each calling this at a different moment.
    pub fn live_ranks(&self) -> Vec<usize> {
        self.group.live_ranks()
    }

    /// Joins the group formed by `survivors` (ranks of this group, strictly increasing, including
    /// this rank): every survivor calls this with the same list and gets a communicator whose
    /// rank is its position in the list. Nothing blocks here; the new group's first operation is
    /// the rendezvous. The old group is typically aborted or has lost a rank, but need not be.
    ///
    /// # Errors
    /// `InvalidArgument` if the list is empty, unsorted, out of range, misses this rank, or this
    /// rank already joined a group with this list.
    pub fn shrink(&self, survivors: &[usize]) -> Result<HostComm> {
        let world = self.world_size();
        if survivors.is_empty()
            || survivors.windows(2).any(|w| w[0] >= w[1])
            || survivors.iter().any(|&r| r >= world)
        {
            return Err(Error::InvalidArgument(format!(
                "survivors {survivors:?} must be strictly increasing ranks below {world}"
            )));
        }
        let Some(rank) = survivors.iter().position(|&r| r == self.rank) else {
            return Err(Error::InvalidArgument(format!(
                "rank {} is not among the survivors {survivors:?}",
                self.rank
            )));
        };
        let group = self.group.successor(survivors);
        group.join(rank)?;
        let mut comm = HostComm::with_group(group, rank);
        comm.timeout = self.timeout;
        Ok(comm)
    }

    /// In-place weighted all-reduce: afterwards every rank's buffers hold `Σ_r w_r·x_r`, where
    /// `w_r` is the `weight` rank `r` passed.
    ///
    /// # Errors
    /// `Mismatch` if the ranks' buffer counts or lengths differ; `Aborted`, `PeerLost`,
    /// `TimedOut` as described on [`HostComm`]. On error the buffers are unchanged.
    pub fn all_reduce_weighted_f32(&mut self, bufs: &mut [&mut [f32]], weight: f32) -> Result<()> {
        self.run(Op::AllReduce, weight, bufs)
    }

    /// In-place sum all-reduce: afterwards every rank's buffers hold `Σ_r x_r`.
    ///
    /// # Errors
    /// As for [`all_reduce_weighted_f32`](Self::all_reduce_weighted_f32).
    pub fn all_reduce_sum_f32(&mut self, bufs: &mut [&mut [f32]]) -> Result<()> {
        self.run(Op::AllReduce, 1.0, bufs)
    }

    /// Copies `root`'s buffers into every other rank's buffers.
    ///
    /// # Errors
    /// `InvalidArgument` if `root` is not a rank; `Mismatch` if the ranks disagree on the root or
    /// the buffers; `Aborted`, `PeerLost`, `TimedOut` as described on [`HostComm`].
    pub fn broadcast_f32(&mut self, bufs: &mut [&mut [f32]], root: usize) -> Result<()> {
        if root >= self.world_size() {
            return Err(Error::InvalidArgument(format!(
                "broadcast root {root} is not a rank of a group of {}",
                self.world_size()
            )));
        }
        self.run(Op::Broadcast { root }, 0.0, bufs)
    }

    /// Waits until every rank has called `barrier`.
    ///
    /// # Errors
    /// `Mismatch` if another rank called a different operation; `Aborted`, `PeerLost`,
    /// `TimedOut` as described on [`HostComm`].
    pub fn barrier(&mut self) -> Result<()> {
        self.run(Op::Barrier, 0.0, &mut [])
    }

    fn run(&mut self, op: Op, weight: f32, bufs: &mut [&mut [f32]]) -> Result<()> {
        self.mine.clear();
        self.mine.extend(bufs.iter_mut().map(|b| RawBuf { ptr: b.as_mut_ptr(), len: b.len() }));
        let plan = self.group.arrive(self.rank, op, weight, &self.mine, self.timeout)?;
        // Every rank has arrived: from here on peers may touch this rank's buffers, so this
        // function must reach `complete` on every path.
        // SAFETY: every rank arrived at this plan, and each stays blocked in its operation (its
        // buffers lent as `&mut [f32]`, touched only through the published pointers) until
        // `complete` sees every chunk done.
        if unsafe { plan.work(&mut self.scratch) } {
            self.group.finished();
        }
        self.group.complete(&plan);
        plan.error().map_or(Ok(()), Err)
    }
}

impl Drop for HostComm {
    fn drop(&mut self) {
        self.group.leave(self.rank);
    }
}

/// The `f32` host slices behind CPU tensors (zero-copy), for the collectives that reduce on the
/// CPU (`HostComm`, `MpiComm`, named `who` in the error).
///
/// # Errors
/// `InvalidArgument` for a tensor that is not `f32` on the CPU.
pub(crate) fn host_slices<'a>(
    tensors: &'a mut [&mut Tensor],
    who: &str,
) -> Result<Vec<&'a mut [f32]>> {
    tensors
        .iter_mut()
        .map(|t| {
            if t.device() != Device::Cpu || t.dtype() != DType::F32 {
                return Err(Error::InvalidArgument(format!(
                    "{who} reduces f32 CPU tensors, got {:?} on {}",
                    t.dtype(),
                    t.device()
                )));
            }
            Ok(t.as_mut_slice::<f32>()?)
        })
        .collect()
}

/// CPU tensors are reduced in place through their host slices; the stream is not used, since
/// CPU work is synchronous.
impl Collective for HostComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.group.world()
    }

    fn all_reduce_weighted(
        &mut self,
        tensors: &mut [&mut Tensor],
        weight: f32,
        _stream: &Stream,
    ) -> Result<()> {
        let mut slices = host_slices(tensors, "HostComm")?;
        self.all_reduce_weighted_f32(&mut slices, weight)
    }

    fn all_reduce_sum(&mut self, tensors: &mut [&mut Tensor], _stream: &Stream) -> Result<()> {
        let mut slices = host_slices(tensors, "HostComm")?;
        self.all_reduce_sum_f32(&mut slices)
    }

    fn broadcast(
        &mut self,
        tensors: &mut [&mut Tensor],
        root: usize,
        _stream: &Stream,
    ) -> Result<()> {
        let mut slices = host_slices(tensors, "HostComm")?;
        self.broadcast_f32(&mut slices, root)
    }

    fn barrier(&mut self) -> Result<()> {
        HostComm::barrier(self)
    }

    fn abort_handle(&self) -> AbortHandle {
        HostComm::abort_handle(self)
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set_timeout(&mut self, timeout: Duration) {
        HostComm::set_timeout(self, timeout);
    }
}

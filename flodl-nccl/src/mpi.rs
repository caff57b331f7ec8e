//! `MpiComm`: the collective across processes on CPU ranks, one rank per process of an MPI
//! world (feature `mpi`, through rsmpi).
//!
//! A weighted all-reduce pre-weights each buffer into a reusable send buffer (`w·x`, one pass,
//! the pass an in-place pre-weighting would make, done before waiting for the peers) and then
//! runs a plain sum all-reduce from it into the caller's buffer, so the caller's buffer ends
//! reduced in place. (rsmpi's safe API
//! has no `MPI_IN_PLACE`, and its value differs between MPI libraries.)
//!
//! Every operation is non-blocking underneath (`MPI_Iallreduce`, `MPI_Ibcast`,
//! `MPI_Ibarrier`) and polled against the communicator's deadline and its abort flag. An MPI
//! world cannot shrink (no ULFM in Debian's Open MPI 4.1), and a started collective cannot be
//! taken back from MPI: a deadline that passes, or an abort that arrives, while a collective
//! is in flight ends the whole MPI job with `MPI_Abort` (the launcher restarts it from the
//! last checkpoint). An abort seen before an operation starts fails it with
//! [`Error::Aborted`] and ends nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::environment::{Threading, Universe};
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, SimpleCommunicator};

use flodl_tensor::{Stream, Tensor};

use crate::abort::AbortHandle;
use crate::collective::Collective;
use crate::error::{Error, Result};
use crate::host::{DEFAULT_TIMEOUT, host_slices};

/// The exit code `MPI_Abort` gives the job when a collective is abandoned.
const ABORT_CODE: i32 = 70;

/// What an operation is, as the ranks compare it before they start (so a mismatch is an error
/// on every rank instead of a hang).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    AllReduce,
    Broadcast { root: usize },
    Barrier,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::Broadcast { .. } => "broadcast",
            Op::Barrier => "barrier",
        }
    }

    fn code(self) -> i64 {
        match self {
            Op::AllReduce => 1,
            Op::Broadcast { root } => 2 + i64::try_from(root).unwrap_or(i64::MAX - 2),
            Op::Barrier => 0,
        }
    }
}

/// One rank of an MPI world, reducing `f32` host buffers with the other processes.
///
/// Build it once per process with [`MpiComm::world`] (it initializes MPI and finalizes it when
/// dropped). Every rank must call the same operations in the same order with buffers of equal
/// lengths; before each operation the ranks compare the operation and the buffer lengths, so a
/// disagreement is [`Error::Mismatch`] on every rank.
pub struct MpiComm {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    timeout: Duration,
    aborted: Arc<AtomicBool>,
    abort: AbortHandle,
    /// The pre-weighted send buffers (reused across operations).
    send: Vec<f32>,
    /// Finalizes MPI when the communicator is dropped (declared last: dropped last).
    universe: Universe,
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

// SAFETY: MPI is initialized with `MPI_THREAD_SERIALIZED` (checked in `world`), which allows
// MPI calls from any thread as long as no two run at once; the communicator and universe are
// owned by this value, whose `&mut self` methods are the only callers, so calls never overlap.
// The abort handle only flips an atomic flag and makes no MPI call.
unsafe impl Send for MpiComm {}

impl MpiComm {
    /// Initializes MPI (thread level `MPI_THREAD_SERIALIZED`) and returns this process's rank of
    /// `MPI_COMM_WORLD`. Call it once per process, under `mpirun`/`mpiexec` (a process started
    /// alone is a world of one).
    ///
    /// # Errors
    /// [`Error::Mpi`] when MPI was initialized already in this process, or the library cannot
    /// give serialized multithreading.
    pub fn world() -> Result<MpiComm> {
        let Some((universe, provided)) = mpi::initialize_with_threading(Threading::Serialized)
        else {
            return Err(Error::Mpi("MPI is already initialized in this process".into()));
        };
        if provided < Threading::Serialized {
            return Err(Error::Mpi(format!(
                "the MPI library gives thread level {provided:?}; flodl needs Serialized"
            )));
        }
        let world = universe.world();
        let rank = usize::try_from(world.rank())
            .map_err(|_| Error::Mpi(format!("negative MPI rank {}", world.rank())))?;
        let size = usize::try_from(world.size())
            .map_err(|_| Error::Mpi(format!("negative MPI world size {}", world.size())))?;
        let aborted = Arc::new(AtomicBool::new(false));
        let flag = aborted.clone();
        let abort = AbortHandle::new(move || flag.store(true, Ordering::Release));
        Ok(MpiComm {
            world,
            rank,
            size,
            timeout: DEFAULT_TIMEOUT,
            aborted,
            abort,
            send: Vec::new(),
            universe,
        })
    }

    /// This process's rank in the MPI world.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes in the MPI world.
    pub fn world_size(&self) -> usize {
        self.size
    }

    /// How long an operation waits for the other ranks before the job is aborted.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets how long an operation waits for the other ranks (default 30 s).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// A handle that aborts this communicator from any thread (see the module documentation
    /// for what an abort during an operation does).
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }

    /// The MPI library's version line (`MPI_Get_library_version`).
    ///
    /// # Errors
    /// [`Error::Mpi`] when the library does not say.
    pub fn library_version(&self) -> Result<String> {
        let _ = &self.universe;
        mpi::environment::library_version().map_err(|e| Error::Mpi(e.to_string()))
    }

    /// In-place weighted all-reduce: afterwards every rank's buffers hold `Σ_r w_r·x_r`, where
    /// `w_r` is the `weight` rank `r` passed.
    ///
    /// # Errors
    /// `Mismatch` if the ranks' buffer counts or lengths differ; `Aborted` when aborted before
    /// the operation started; `InvalidArgument` for a buffer longer than MPI counts.
    pub fn all_reduce_weighted_f32(&mut self, bufs: &mut [&mut [f32]], weight: f32) -> Result<()> {
        self.all_reduce(bufs, Some(weight))
    }

    /// In-place sum all-reduce: afterwards every rank's buffers hold `Σ_r x_r`.
    ///
    /// # Errors
    /// As for [`all_reduce_weighted_f32`](Self::all_reduce_weighted_f32).
    pub fn all_reduce_sum_f32(&mut self, bufs: &mut [&mut [f32]]) -> Result<()> {
        self.all_reduce(bufs, None)
    }

    /// Copies `root`'s buffers into every other rank's buffers.
    ///
    /// # Errors
    /// `InvalidArgument` if `root` is not a rank; otherwise as for
    /// [`all_reduce_weighted_f32`](Self::all_reduce_weighted_f32).
    pub fn broadcast_f32(&mut self, bufs: &mut [&mut [f32]], root: usize) -> Result<()> {
        if root >= self.size {
            return Err(Error::InvalidArgument(format!(
                "broadcast root {root} is not a rank of a world of {}",
                self.size
            )));
        }
        let lens: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
        self.agree(Op::Broadcast { root }, &lens)?;
        let rank = mpi_rank(root)?;
        let (world, deadline, aborted) = (&self.world, self.deadline(), &self.aborted);
        mpi::request::scope(|scope| {
            let requests = bufs
                .iter_mut()
                .map(|buf| world.process_at_rank(rank).immediate_broadcast_into(scope, &mut **buf))
                .collect();
            settle(world, requests, Wait::Data, deadline, aborted, "broadcast");
        });
        Ok(())
    }

    /// Waits until every rank has called `barrier`.
    ///
    /// # Errors
    /// `Mismatch` if another rank called a different operation; `Aborted` when aborted before.
    pub fn barrier(&mut self) -> Result<()> {
        self.agree(Op::Barrier, &[])
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    fn all_reduce(&mut self, bufs: &mut [&mut [f32]], weight: Option<f32>) -> Result<()> {
        let lens: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
        // Weighted first: the pass overlaps the wait for the peers.
        self.send.clear();
        self.send.reserve(lens.iter().sum());
        for buf in bufs.iter() {
            match weight {
                Some(w) => self.send.extend(buf.iter().map(|x| w * x)),
                None => self.send.extend_from_slice(buf),
            }
        }
        self.agree(Op::AllReduce, &lens)?;
        let (world, deadline, aborted) = (&self.world, self.deadline(), &self.aborted);
        let send = &self.send[..];
        mpi::request::scope(|scope| {
            let mut from = 0;
            let mut requests = Vec::with_capacity(bufs.len());
            for buf in bufs.iter_mut() {
                let part = &send[from..from + buf.len()];
                from += buf.len();
                requests.push(world.immediate_all_reduce_into(
                    scope,
                    part,
                    &mut **buf,
                    SystemOperation::sum(),
                ));
            }
            settle(world, requests, Wait::Data, deadline, aborted, "all_reduce");
        });
        Ok(())
    }

    /// The ranks compare `op` and the buffer lengths (a small all-reduce of maxima and minima,
    /// which is also the operation's rendezvous); `Mismatch` on every rank when they differ.
    fn agree(&mut self, op: Op, lens: &[usize]) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(Error::Aborted);
        }
        if let Some(long) = lens.iter().find(|&&n| i32::try_from(n).is_err()) {
            return Err(Error::InvalidArgument(format!(
                "a buffer of {long} elements is longer than an MPI count"
            )));
        }
        let total: usize = lens.iter().sum();
        let digest = lens.iter().fold(0i64, |h, &n| {
            h.wrapping_mul(1_000_003).wrapping_add(i64::try_from(n).unwrap_or(i64::MAX))
        });
        let facts = [op.code(), i64::try_from(lens.len()).unwrap_or(i64::MAX), digest];
        // Maxima of (x, −x): every rank agrees iff max(x) = −max(−x) = min(x).
        let mine: Vec<i64> = facts.iter().flat_map(|&x| [x, x.wrapping_neg()]).collect();
        let mut all = vec![0i64; mine.len()];
        let (world, deadline, aborted) = (&self.world, self.deadline(), &self.aborted);
        mpi::request::scope(|scope| {
            let request = world.immediate_all_reduce_into(
                scope,
                &mine[..],
                &mut all[..],
                SystemOperation::max(),
            );
            settle(world, vec![request], Wait::Rendezvous, deadline, aborted, op.name());
        });
        let what = ["operation", "buffer count", "buffer lengths"];
        for (i, name) in what.iter().enumerate() {
            let (max, neg_min) = (all[2 * i], all[2 * i + 1]);
            if max != neg_min.wrapping_neg() {
                return Err(Error::Mismatch {
                    what: name,
                    rank: self.rank,
                    expected: format!("{} (the largest)", max),
                    found: format!(
                        "{} (this rank: {} buffers, {total} elements)",
                        facts[i],
                        lens.len()
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The MPI rank of `rank`.
fn mpi_rank(rank: usize) -> Result<mpi::Rank> {
    mpi::Rank::try_from(rank)
        .map_err(|_| Error::InvalidArgument(format!("rank {rank} is beyond MPI's ranks")))
}

/// How [`settle`] waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// The rendezvous (peers may still be computing): spin for [`SPIN`], then poll every
    /// [`NAP`], leaving the core to them.
    Rendezvous,
    /// The data (every rank is in the operation): spin, yielding now and then.
    Data,
}

/// Waits until every request has completed, polling; past `deadline`, or once `aborted` is set,
/// the collective cannot be taken back from MPI, so the job is aborted (`MPI_Abort` does not
/// return).
fn settle<'a, D: ?Sized, S: Scope<'a>>(
    world: &SimpleCommunicator,
    mut requests: Vec<Request<'a, D, S>>,
    wait: Wait,
    deadline: Instant,
    aborted: &AtomicBool,
    op: &'static str,
) {
    let mut spins = 0u32;
    let started = Instant::now();
    while !requests.is_empty() {
        let mut pending = Vec::with_capacity(requests.len());
        for request in requests {
            if let Err(request) = request.test() {
                pending.push(request);
            }
        }
        requests = pending;
        if requests.is_empty() {
            break;
        }
        if aborted.load(Ordering::Acquire) {
            tracing::error!(op, "collective aborted while in flight: ending the MPI job");
            world.abort(ABORT_CODE);
        }
        if Instant::now() > deadline {
            tracing::error!(op, "collective timed out while in flight: ending the MPI job");
            world.abort(ABORT_CODE);
        }
        // MPI progresses inside `test`: spin, yielding the core now and then.
        spins = spins.wrapping_add(1);
        if wait == Wait::Rendezvous && started.elapsed() > SPIN {
            std::thread::sleep(NAP);
        } else if wait == Wait::Rendezvous && spins.is_multiple_of(64) {
            std::thread::yield_now();
        }
    }
}

/// How long a rendezvous polls without sleeping.
const SPIN: Duration = Duration::from_millis(2);
/// The pause between polls after that.
const NAP: Duration = Duration::from_micros(50);

impl Collective for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce_weighted(
        &mut self,
        tensors: &mut [&mut Tensor],
        weight: f32,
        _stream: &Stream,
    ) -> Result<()> {
        let mut slices = host_slices(tensors, "MpiComm")?;
        self.all_reduce_weighted_f32(&mut slices, weight)
    }

    fn all_reduce_sum(&mut self, tensors: &mut [&mut Tensor], _stream: &Stream) -> Result<()> {
        let mut slices = host_slices(tensors, "MpiComm")?;
        self.all_reduce_sum_f32(&mut slices)
    }

    fn broadcast(
        &mut self,
        tensors: &mut [&mut Tensor],
        root: usize,
        _stream: &Stream,
    ) -> Result<()> {
        let mut slices = host_slices(tensors, "MpiComm")?;
        self.broadcast_f32(&mut slices, root)
    }

    fn barrier(&mut self) -> Result<()> {
        MpiComm::barrier(self)
    }

    fn abort_handle(&self) -> AbortHandle {
        MpiComm::abort_handle(self)
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }
}

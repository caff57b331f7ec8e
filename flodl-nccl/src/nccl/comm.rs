//! `NcclComm`: one rank of an NCCL communicator, non-blocking, watched and abortable.

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;

use super::collective::BarrierBuffer;
use super::library::{
    BFLOAT16, FLOAT32, IN_PROGRESS, INT32, Library, NcclVersion, RawComm, RawConfig, RawStream,
    SCALAR_HOST_IMMEDIATE, SUCCESS, SUM,
};
use super::slot::{Fault, Slot};
use super::unique_id::UniqueId;
use super::watchdog::Watchdog;
use crate::abort::AbortHandle;
use crate::error::{Error, Result};
use crate::host::DEFAULT_TIMEOUT;

/// The element type of a device buffer handed to NCCL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclDType {
    /// `ncclFloat32`.
    F32,
    /// `ncclBfloat16`.
    Bf16,
    /// `ncclInt32`.
    I32,
}

impl NcclDType {
    fn code(self) -> c_int {
        match self {
            NcclDType::F32 => FLOAT32,
            NcclDType::Bf16 => BFLOAT16,
            NcclDType::I32 => INT32,
        }
    }
}

/// A raw device buffer: a `CUdeviceptr` and its element count and type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBuffer {
    /// The device address (`CUdeviceptr`) of the first element.
    pub ptr: u64,
    /// The number of elements.
    pub len: usize,
    /// The element type.
    pub dtype: NcclDType,
}

/// How an all-reduce combines the ranks' buffers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reduction {
    /// `Σ_r x_r`.
    Sum,
    /// `Σ_r w_r·x_r`, each rank passing its own `w_r` (`ncclRedOpCreatePreMulSum`).
    WeightedSum(f32),
}

/// One rank of an NCCL communicator on one GPU.
///
/// Created non-blocking (`ncclCommInitRankConfig` with `blocking = 0`) and polled against the
/// timeout, so a rank that never joins cannot hang the others. A watchdog thread polls
/// `ncclCommGetAsyncError` every 10 ms and aborts the communicator when NCCL reports an error or
/// an operation runs past its deadline; [`AbortHandle::abort`] does the same from any thread.
/// After an abort every operation returns the fault; build a new communicator from a new
/// [`UniqueId`]. Operations wait (host-side) until the collective has finished on the stream.
///
/// Dropping the communicator stops the watchdog and aborts it (`ncclCommAbort` never waits for
/// peers); use [`NcclComm::destroy`] for an orderly `ncclCommDestroy`.
#[derive(Debug)]
pub struct NcclComm {
    slot: Arc<Slot>,
    abort: AbortHandle,
    watchdog: Option<Watchdog>,
    rank: usize,
    world: usize,
    device: usize,
    timeout: Duration,
    /// The buffer [`Collective::barrier`](crate::Collective::barrier) reduces, made on first use.
    pub(super) barrier: Option<BarrierBuffer>,
}

impl NcclComm {
    /// Joins the communicator identified by `id` as `rank` of `world_size`, on GPU `device`,
    /// waiting at most `timeout` for every rank to join.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad rank or world size; `LibraryMissing` without NCCL; `NoGpu`
    /// without a driver or with `device` out of range; `TimedOut { op: "init" }` if the ranks did
    /// not all join in time; `Nccl` if NCCL fails.
    pub fn new(
        id: &UniqueId,
        rank: usize,
        world_size: usize,
        device: usize,
        timeout: Duration,
    ) -> Result<NcclComm> {
        if world_size == 0 || rank >= world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is not in a world of {world_size}"
            )));
        }
        let (Ok(nranks), Ok(rank_c)) = (c_int::try_from(world_size), c_int::try_from(rank)) else {
            return Err(Error::InvalidArgument(format!("world size {world_size} is too large")));
        };
        let lib = Library::get()?;
        let ctx = cuda_context(device)?;
        ctx.bind_to_thread().map_err(|e| Error::Cuda(e.to_string()))?;
        let started = Instant::now();
        let deadline = started + timeout;
        let mut comm: RawComm = std::ptr::null_mut();
        let mut config = RawConfig::non_blocking();
        // SAFETY: `comm` and `config` are valid for the call; the id is passed by value; the
        // device's context is current on this thread, which NCCL uses as the comm's device.
        let code = unsafe {
            (lib.comm_init_rank_config)(&mut comm, nranks, id.raw(), rank_c, &mut config)
        };
        if code != SUCCESS && code != IN_PROGRESS {
            if !comm.is_null() {
                // SAFETY: NCCL returned a (partially initialised) comm that nothing else holds.
                unsafe { (lib.comm_abort)(comm) };
            }
            return Err(lib.error(code, None));
        }
        let slot = Arc::new(Slot::new(lib, ctx, comm));
        slot.wait_ready("init", started, deadline)?;
        let watchdog = Watchdog::start(Arc::clone(&slot), rank)?;
        let abort_slot = Arc::downgrade(&slot);
        let abort = AbortHandle::new(move || {
            if let Some(slot) = abort_slot.upgrade() {
                slot.abort(Fault::Aborted);
            }
        });
        tracing::info!(rank, world_size, device, version = %lib.version, "NCCL communicator ready");
        Ok(NcclComm {
            slot,
            abort,
            watchdog: Some(watchdog),
            rank,
            world: world_size,
            device,
            timeout,
            barrier: None,
        })
    }

    /// Joins with the default 30 s timeout; see [`NcclComm::new`].
    ///
    /// # Errors
    /// As for [`NcclComm::new`].
    pub fn with_default_timeout(
        id: &UniqueId,
        rank: usize,
        world_size: usize,
        device: usize,
    ) -> Result<NcclComm> {
        NcclComm::new(id, rank, world_size, device, DEFAULT_TIMEOUT)
    }

    /// This communicator's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The CUDA device ordinal this rank runs on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The loaded NCCL library's version.
    pub fn version(&self) -> NcclVersion {
        self.slot.lib.version
    }

    /// Whether the library has `ncclRedOpCreatePreMulSum` (NCCL 2.11+), which
    /// [`Reduction::WeightedSum`] needs; without it a caller scales its buffers on the same
    /// stream and sums.
    pub fn has_pre_mul_sum(&self) -> bool {
        self.slot.lib.pre_mul_sum.is_some()
    }

    /// How long an operation may take before the watchdog aborts the communicator.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets how long an operation may take (default 30 s).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// A handle that aborts this communicator from any thread.
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }

    /// Destroys the communicator in order (`ncclCommDestroy`), or aborts it if it faulted.
    ///
    /// # Errors
    /// `Nccl` or `Cuda` if the teardown fails.
    pub fn destroy(mut self) -> Result<()> {
        drop(self.watchdog.take());
        self.slot.destroy()
    }

    /// In-place all-reduce of raw device buffers, enqueued on `stream` as one NCCL group; waits
    /// until it has finished on the stream.
    ///
    /// # Errors
    /// `Unsupported` for a weighted sum on NCCL older than 2.11 or a non-f32 weighted buffer;
    /// `Aborted`, `TimedOut` or `Nccl` if the communicator fails (it is then dead).
    ///
    /// # Safety
    /// Every buffer must be a live device allocation of `len` elements of its type on this
    /// communicator's device, not accessed by anything else until this returns, and `stream` a
    /// live `CUstream` of that device (or null for the legacy default stream).
    pub unsafe fn all_reduce_raw(
        &mut self,
        bufs: &[DeviceBuffer],
        reduction: Reduction,
        stream: RawStream,
    ) -> Result<()> {
        let lib = self.slot.lib;
        let op_name = "all_reduce";
        let weight = match reduction {
            Reduction::Sum => None,
            Reduction::WeightedSum(w) => {
                if let Some(b) = bufs.iter().find(|b| b.dtype != NcclDType::F32) {
                    return Err(Error::InvalidArgument(format!(
                        "weighted all-reduce needs f32 buffers, got {:?}",
                        b.dtype
                    )));
                }
                Some(w)
            }
        };
        let create_destroy = match (weight, lib.pre_mul_sum) {
            (None, _) => None,
            (Some(w), Some(fns)) => Some((w, fns)),
            (Some(_), None) => {
                return Err(Error::Unsupported {
                    feature: "ncclRedOpCreatePreMulSum",
                    found: lib.version.to_string(),
                    needed: "2.11",
                });
            }
        };
        self.run(op_name, stream, |comm| {
            let mut op = SUM;
            if let Some((mut w, (create, _))) = create_destroy {
                // SAFETY: `op` and the host scalar are valid for the call; with
                // `ncclScalarHostImmediate` NCCL reads the scalar before returning.
                let code = unsafe {
                    create(
                        &mut op,
                        (&mut w as *mut f32).cast::<c_void>(),
                        FLOAT32,
                        SCALAR_HOST_IMMEDIATE,
                        comm,
                    )
                };
                lib.check(code, Some(comm))?;
            }
            let enqueued = group(lib, comm, bufs, |buf| {
                // SAFETY: the caller guarantees the buffer and stream (in-place: same send and
                // receive pointer, which NCCL allows).
                unsafe {
                    (lib.all_reduce)(
                        buf.ptr as *const c_void,
                        buf.ptr as *mut c_void,
                        buf.len,
                        buf.dtype.code(),
                        op,
                        comm,
                        stream,
                    )
                }
            });
            Ok((enqueued, create_destroy.map(|(_, (_, destroy))| (destroy, op))))
        })
    }

    /// In-place broadcast of raw device buffers from `root`, as one NCCL group; waits until it
    /// has finished on the stream.
    ///
    /// # Errors
    /// `InvalidArgument` for a root outside the world; `Aborted`, `TimedOut` or `Nccl` if the
    /// communicator fails.
    ///
    /// # Safety
    /// As for [`all_reduce_raw`](Self::all_reduce_raw).
    pub unsafe fn broadcast_raw(
        &mut self,
        bufs: &[DeviceBuffer],
        root: usize,
        stream: RawStream,
    ) -> Result<()> {
        let Some(root) = c_int::try_from(root).ok().filter(|&r| (r as usize) < self.world) else {
            return Err(Error::InvalidArgument(format!(
                "broadcast root {root} is not in a world of {}",
                self.world
            )));
        };
        let lib = self.slot.lib;
        self.run("broadcast", stream, |comm| {
            let enqueued = group(lib, comm, bufs, |buf| {
                // SAFETY: the caller guarantees the buffer and stream; in-place broadcast.
                unsafe {
                    (lib.broadcast)(
                        buf.ptr as *const c_void,
                        buf.ptr as *mut c_void,
                        buf.len,
                        buf.dtype.code(),
                        root,
                        comm,
                        stream,
                    )
                }
            });
            Ok((enqueued, None))
        })
    }

    /// Enqueues with `enqueue` (under the slot's read lock), waits for NCCL to finish
    /// enqueueing, destroys the custom op if one was made, then waits for the stream.
    fn run(
        &mut self,
        op: &'static str,
        stream: RawStream,
        enqueue: impl FnOnce(RawComm) -> Result<(Result<()>, Option<(RedOpDestroy, c_int)>)>,
    ) -> Result<()> {
        self.slot.ctx.bind_to_thread().map_err(|e| Error::Cuda(e.to_string()))?;
        let (started, deadline) = self.slot.begin(op, self.timeout);
        let result = self.enqueue_and_wait(op, stream, started, deadline, enqueue);
        self.slot.end();
        result
    }

    fn enqueue_and_wait(
        &mut self,
        op: &'static str,
        stream: RawStream,
        started: Instant,
        deadline: Instant,
        enqueue: impl FnOnce(RawComm) -> Result<(Result<()>, Option<(RedOpDestroy, c_int)>)>,
    ) -> Result<()> {
        let (enqueued, custom_op) = self.slot.with_comm(enqueue)?;
        let ready = enqueued.and_then(|()| self.slot.wait_ready(op, started, deadline));
        if let Some((destroy, red_op)) = custom_op {
            let _ = self.slot.with_comm(|comm| {
                // SAFETY: the last call using `red_op` has returned and its enqueue completed.
                let code = unsafe { destroy(red_op, comm) };
                self.slot.lib.check(code, Some(comm))
            });
        }
        ready?;
        wait_stream(&self.slot, stream)
    }
}

type RedOpDestroy = unsafe extern "C" fn(c_int, RawComm) -> c_int;

/// Enqueues `call` for every buffer between `ncclGroupStart` and `ncclGroupEnd`.
fn group(
    lib: &Library,
    comm: RawComm,
    bufs: &[DeviceBuffer],
    mut call: impl FnMut(&DeviceBuffer) -> c_int,
) -> Result<()> {
    // SAFETY: group calls take no arguments; every group start is matched by the end below.
    lib.check(unsafe { (lib.group_start)() }, Some(comm))?;
    let mut first_error = Ok(());
    for buf in bufs.iter().filter(|b| b.len > 0) {
        let code = call(buf);
        if code != SUCCESS && code != IN_PROGRESS {
            first_error = lib.check(code, Some(comm));
            break;
        }
    }
    // SAFETY: matches the group start above.
    let end = unsafe { (lib.group_end)() };
    first_error?;
    if end == IN_PROGRESS { Ok(()) } else { lib.check(end, Some(comm)) }
}

/// Waits until `stream` has drained, giving up (with the fault) once the slot is aborted.
fn wait_stream(slot: &Slot, stream: RawStream) -> Result<()> {
    use cudarc::driver::sys::{CUresult, cuStreamQuery};
    let mut pause = Duration::from_micros(5);
    loop {
        // SAFETY: the caller guarantees `stream` is a live stream of the current context.
        match unsafe { cuStreamQuery(stream.cast()) } {
            CUresult::CUDA_SUCCESS => {
                return if slot.is_faulted() { Err(slot.fault_error()) } else { Ok(()) };
            }
            CUresult::CUDA_ERROR_NOT_READY => {
                if slot.is_faulted() {
                    return Err(slot.fault_error());
                }
            }
            other => {
                if slot.is_faulted() {
                    return Err(slot.fault_error());
                }
                return Err(Error::Cuda(format!("waiting for the NCCL stream: {other:?}")));
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_micros(500));
    }
}

/// The primary context of `device`, after checking that a driver and the device exist (cudarc
/// panics when the driver library is missing, so that is probed first).
fn cuda_context(device: usize) -> Result<Arc<CudaContext>> {
    // SAFETY: probing only tries to load the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::NoGpu("the CUDA driver library is not installed".into()));
    }
    let count = CudaContext::device_count().map_err(|e| Error::NoGpu(e.to_string()))?;
    if device >= usize::try_from(count).unwrap_or(0) {
        return Err(Error::NoGpu(format!("device {device} requested, {count} present")));
    }
    CudaContext::new(device).map_err(|e| Error::Cuda(e.to_string()))
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        drop(self.watchdog.take());
        if !self.slot.is_faulted() {
            self.slot.abort(Fault::Aborted);
        }
    }
}

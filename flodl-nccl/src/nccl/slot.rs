//! The communicator slot shared by an `NcclComm`, its abort handle and its watchdog.
//!
//! The raw `ncclComm_t` lives behind a read-write lock: NCCL calls that use it (enqueueing a
//! collective, polling the async error) hold a read lock for the length of one non-blocking call;
//! aborting takes the write lock, calls `ncclCommAbort` and leaves a null pointer behind, so no
//! call can ever reach a freed communicator.

use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;

use super::library::{IN_PROGRESS, Library, RawComm, SUCCESS};
use crate::error::{Error, Result};

/// Why a communicator died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// An abort handle (or the owner dropping the comm) killed it.
    Aborted,
    /// An operation ran past its deadline; the watchdog aborted it.
    TimedOut { op: &'static str, after: Duration },
    /// NCCL reported an asynchronous error (e.g. a peer failed); the watchdog aborted it.
    Nccl { code: c_int },
}

/// An operation in flight, as the watchdog sees it.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    op: &'static str,
    started: Instant,
    deadline: Instant,
}

#[derive(Debug)]
struct Status {
    fault: Option<Fault>,
    in_flight: Option<InFlight>,
}

/// A raw communicator pointer; null once aborted or destroyed.
#[derive(Debug)]
struct CommPtr(RawComm);

// SAFETY: an `ncclComm_t` may be used from any thread (NCCL forbids concurrent *collective*
// calls on one comm, which the owner's `&mut self` methods rule out; `ncclCommGetAsyncError` and
// `ncclCommAbort` are designed to be called from a watchdog thread). The pointer is only used
// under the slot's lock.
unsafe impl Send for CommPtr {}
// SAFETY: see above; shared access only reads the pointer value.
unsafe impl Sync for CommPtr {}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) lib: &'static Library,
    pub(crate) ctx: Arc<CudaContext>,
    comm: RwLock<CommPtr>,
    status: Mutex<Status>,
}

impl Slot {
    pub(crate) fn new(lib: &'static Library, ctx: Arc<CudaContext>, comm: RawComm) -> Slot {
        Slot {
            lib,
            ctx,
            comm: RwLock::new(CommPtr(comm)),
            status: Mutex::new(Status { fault: None, in_flight: None }),
        }
    }

    fn status(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` with the live communicator, holding the read lock for the call's duration.
    ///
    /// # Errors
    /// The recorded fault if the communicator is gone; otherwise whatever `f` returns.
    pub(crate) fn with_comm<T>(&self, f: impl FnOnce(RawComm) -> Result<T>) -> Result<T> {
        let comm = self.comm.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        if comm.0.is_null() {
            return Err(self.fault_error());
        }
        f(comm.0)
    }

    /// `ncclCommGetAsyncError`: `SUCCESS`, `IN_PROGRESS` or an error code.
    pub(crate) fn async_state(&self) -> Result<c_int> {
        self.with_comm(|comm| {
            let mut state: c_int = SUCCESS;
            // SAFETY: `comm` is live (read lock held, non-null) and `state` is a valid out-pointer.
            let code = unsafe { (self.lib.comm_get_async_error)(comm, &mut state) };
            self.lib.check(code, Some(comm))?;
            Ok(state)
        })
    }

    /// Polls the async state until it leaves `IN_PROGRESS`, failing at `deadline` (which aborts).
    pub(crate) fn wait_ready(
        &self,
        op: &'static str,
        started: Instant,
        deadline: Instant,
    ) -> Result<()> {
        let mut pause = Duration::from_micros(20);
        loop {
            match self.async_state()? {
                SUCCESS => return Ok(()),
                IN_PROGRESS => {}
                code => {
                    self.abort(Fault::Nccl { code });
                    return Err(self.lib.error(code, None));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                let fault = Fault::TimedOut { op, after: now - started };
                self.abort(fault);
                return Err(self.fault_error());
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }

    /// Records `fault` (the first one wins) and aborts the communicator. Idempotent, callable
    /// from any thread; never panics.
    pub(crate) fn abort(&self, fault: Fault) {
        {
            let mut status = self.status();
            status.fault.get_or_insert(fault);
        }
        let mut comm = self.comm.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if comm.0.is_null() {
            return;
        }
        // NCCL's teardown uses the communicator's device; a failure to bind is not fatal here.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the pointer is live (non-null under the write lock, so no other call uses it),
        // and it is nulled right after, so it is never used again.
        let code = unsafe { (self.lib.comm_abort)(comm.0) };
        comm.0 = std::ptr::null_mut();
        if code != SUCCESS {
            tracing::warn!(code, "ncclCommAbort failed");
        }
        tracing::warn!(?fault, "NCCL communicator aborted");
    }

    /// Destroys a healthy communicator (`ncclCommDestroy`), or aborts a faulted one.
    pub(crate) fn destroy(&self) -> Result<()> {
        let mut comm = self.comm.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if comm.0.is_null() {
            return Ok(());
        }
        let ptr = std::mem::replace(&mut comm.0, std::ptr::null_mut());
        self.ctx.bind_to_thread().map_err(|e| Error::Cuda(e.to_string()))?;
        // SAFETY: `ptr` was live and has been removed from the slot, so nothing else uses it.
        let code = unsafe { (self.lib.comm_destroy)(ptr) };
        self.lib.check(code, None)
    }

    /// The error the recorded fault maps to (`Aborted` if none was recorded).
    pub(crate) fn fault_error(&self) -> Error {
        match self.status().fault {
            Some(Fault::TimedOut { op, after }) => Error::TimedOut { op, after },
            Some(Fault::Nccl { code }) => self.lib.error(code, None),
            Some(Fault::Aborted) | None => Error::Aborted,
        }
    }

    /// Whether the communicator has died.
    pub(crate) fn is_faulted(&self) -> bool {
        self.status().fault.is_some()
    }

    /// Marks an operation as in flight until `deadline` (the watchdog aborts past it).
    pub(crate) fn begin(&self, op: &'static str, timeout: Duration) -> (Instant, Instant) {
        let started = Instant::now();
        let deadline = started + timeout;
        self.status().in_flight = Some(InFlight { op, started, deadline });
        (started, deadline)
    }

    /// Marks the operation in flight as finished.
    pub(crate) fn end(&self) {
        self.status().in_flight = None;
    }

    /// One watchdog check: aborts on an overdue operation or an asynchronous NCCL error.
    /// Returns `false` once the communicator is dead (nothing left to watch).
    pub(crate) fn watch(&self) -> bool {
        let overdue = {
            let status = self.status();
            if status.fault.is_some() {
                return false;
            }
            status.in_flight.filter(|op| Instant::now() >= op.deadline)
        };
        if let Some(op) = overdue {
            self.abort(Fault::TimedOut { op: op.op, after: op.started.elapsed() });
            return false;
        }
        match self.async_state() {
            Ok(SUCCESS | IN_PROGRESS) => true,
            Ok(code) => {
                self.abort(Fault::Nccl { code });
                false
            }
            Err(_) => !self.is_faulted(),
        }
    }
}

impl Drop for Slot {
    /// A communicator nobody destroyed or aborted (e.g. a failed construction) is aborted, which
    /// never waits for peers and never panics.
    fn drop(&mut self) {
        let comm = self.comm.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        if comm.0.is_null() {
            return;
        }
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the slot is being dropped, so nothing else holds the pointer; it is live
        // (non-null) and is never used again.
        let _ = unsafe { (self.lib.comm_abort)(comm.0) };
        comm.0 = std::ptr::null_mut();
    }
}

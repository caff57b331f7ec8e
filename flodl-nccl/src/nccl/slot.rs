//! The communicator slot shared by an `NcclComm`, its abort handle and its watchdog.
//!
//! The raw `ncclComm_t` lives in a [`CommCell`]: every NCCL call on it — enqueueing a
//! collective, polling `ncclCommGetAsyncError`, destroying, aborting — runs under one mutex, so
//! no two threads are ever inside NCCL with the same communicator. That is required, not
//! cautious: from NCCL 2.26 `ncclCommGetAsyncError` completes the communicator's non-blocking
//! group job (joins its thread and frees it) without locking, so the watchdog polling while the
//! owner polls or enqueues could join twice or use the freed job. Every call made under the
//! mutex is non-blocking, so it is held for microseconds; the watchdog only *tries* it and skips
//! a poll while the owner is inside NCCL. Aborting leaves a null pointer behind, so no call can
//! ever reach a freed communicator.

use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
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

// SAFETY: an `ncclComm_t` may be used from any thread as long as calls on it do not overlap;
// the pointer only lives inside `CommCell`'s mutex, so every call using it is serialised.
unsafe impl Send for CommPtr {}

/// The communicator pointer behind the one mutex that every NCCL call on it holds.
#[derive(Debug)]
pub(crate) struct CommCell(Mutex<CommPtr>);

impl CommCell {
    pub(crate) fn new(comm: RawComm) -> CommCell {
        CommCell(Mutex::new(CommPtr(comm)))
    }

    fn lock(&self) -> MutexGuard<'_, CommPtr> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` with the pointer (null once taken), waiting for any other call to finish.
    pub(crate) fn with<T>(&self, f: impl FnOnce(RawComm) -> T) -> T {
        f(self.lock().0)
    }

    /// Runs `f` with the pointer unless another call holds it right now (`None` then).
    pub(crate) fn try_with<T>(&self, f: impl FnOnce(RawComm) -> T) -> Option<T> {
        let guard = match self.0.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(f(guard.0))
    }

    /// Runs `f` with the pointer and leaves null behind (`f` sees null if it was already taken).
    pub(crate) fn take_with<T>(&self, f: impl FnOnce(RawComm) -> T) -> T {
        let mut guard = self.lock();
        let comm = std::mem::replace(&mut guard.0, std::ptr::null_mut());
        f(comm)
    }

    /// The pointer, with no call in progress possible (`&mut self`), left null.
    fn take_mut(&mut self) -> RawComm {
        let comm = self.0.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        std::mem::replace(&mut comm.0, std::ptr::null_mut())
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) lib: &'static Library,
    pub(crate) ctx: Arc<CudaContext>,
    comm: CommCell,
    status: Mutex<Status>,
}

impl Slot {
    pub(crate) fn new(lib: &'static Library, ctx: Arc<CudaContext>, comm: RawComm) -> Slot {
        Slot {
            lib,
            ctx,
            comm: CommCell::new(comm),
            status: Mutex::new(Status { fault: None, in_flight: None }),
        }
    }

    fn status(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` with the live communicator, holding the communicator's mutex for the call.
    ///
    /// # Errors
    /// The recorded fault if the communicator is gone; otherwise whatever `f` returns.
    pub(crate) fn with_comm<T>(&self, f: impl FnOnce(RawComm) -> Result<T>) -> Result<T> {
        self.comm.with(|comm| if comm.is_null() { Err(self.fault_error()) } else { f(comm) })
    }

    /// `ncclCommGetAsyncError` on a live communicator whose mutex is held.
    fn async_state_of(&self, comm: RawComm) -> Result<c_int> {
        if comm.is_null() {
            return Err(self.fault_error());
        }
        let mut state: c_int = SUCCESS;
        // SAFETY: `comm` is live (non-null, and the mutex the caller holds keeps it so and keeps
        // every other NCCL call on it out), and `state` is a valid out-pointer.
        let code = unsafe { (self.lib.comm_get_async_error)(comm, &mut state) };
        self.lib.check(code, Some(comm))?;
        Ok(state)
    }

    /// `ncclCommGetAsyncError`: `SUCCESS`, `IN_PROGRESS` or an error code.
    pub(crate) fn async_state(&self) -> Result<c_int> {
        self.comm.with(|comm| self.async_state_of(comm))
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
        self.comm.take_with(|comm| {
            if comm.is_null() {
                return;
            }
            // NCCL's teardown uses the communicator's device; a failure to bind is not fatal.
            let _ = self.ctx.bind_to_thread();
            // SAFETY: the pointer is live (non-null, taken out under the mutex, so no other call
            // uses it now or later).
            let code = unsafe { (self.lib.comm_abort)(comm) };
            if code != SUCCESS {
                tracing::warn!(code, "ncclCommAbort failed");
            }
            tracing::warn!(?fault, "NCCL communicator aborted");
        });
    }

    /// Destroys a healthy communicator (`ncclCommDestroy`), or aborts a faulted one.
    pub(crate) fn destroy(&self) -> Result<()> {
        self.comm.take_with(|ptr| {
            if ptr.is_null() {
                return Ok(());
            }
            if let Err(e) = self.ctx.bind_to_thread() {
                // Without the device bound NCCL cannot tear down in order; abort instead.
                // SAFETY: `ptr` was live and has been taken out under the mutex.
                let _ = unsafe { (self.lib.comm_abort)(ptr) };
                return Err(Error::Cuda(e.to_string()));
            }
            // SAFETY: `ptr` was live and has been taken out under the mutex, so nothing else
            // uses it now or later.
            let code = unsafe { (self.lib.comm_destroy)(ptr) };
            self.lib.check(code, None)
        })
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
        // The owner inside NCCL (enqueueing or polling) holds the mutex: skip this poll rather
        // than queue behind it; the owner's own poll sees the same state.
        match self.comm.try_with(|comm| self.async_state_of(comm)) {
            None | Some(Ok(SUCCESS | IN_PROGRESS)) => true,
            Some(Ok(code)) => {
                self.abort(Fault::Nccl { code });
                false
            }
            Some(Err(_)) => !self.is_faulted(),
        }
    }
}

impl Drop for Slot {
    /// A communicator nobody destroyed or aborted (e.g. a failed construction) is aborted, which
    /// never waits for peers and never panics.
    fn drop(&mut self) {
        let comm = self.comm.take_mut();
        if comm.is_null() {
            return;
        }
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the slot is being dropped, so nothing else holds the pointer; it is live
        // (non-null) and is never used again.
        let _ = unsafe { (self.lib.comm_abort)(comm) };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use super::CommCell;

    /// Every way into the cell excludes every other: an "owner" thread calling, a "watchdog"
    /// thread trying, and an "abort" taking, never overlap inside the cell (a read-write lock
    /// shared between the owner and the watchdog would fail this).
    #[test]
    fn calls_on_one_communicator_never_overlap() {
        let mut marker = 0u8;
        let cell = CommCell::new((&mut marker as *mut u8).cast());
        let inside = AtomicUsize::new(0);
        let overlaps = AtomicUsize::new(0);
        let tried = AtomicUsize::new(0);
        let call = |_comm| {
            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_micros(200));
            inside.fetch_sub(1, Ordering::SeqCst);
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let taken = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    for _ in 0..50 {
                        if Instant::now() < deadline {
                            cell.with(call);
                        }
                    }
                });
            }
            scope.spawn(|| {
                for _ in 0..200 {
                    if Instant::now() < deadline && cell.try_with(call).is_some() {
                        tried.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(5));
                cell.take_with(|comm| {
                    call(comm);
                    taken.store(!comm.is_null(), Ordering::SeqCst);
                });
            });
        });
        assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two calls were inside at once");
        assert!(taken.load(Ordering::SeqCst), "the abort saw a live pointer");
        assert!(cell.with(|comm| comm.is_null()), "the pointer is null after the abort");
        assert!(cell.try_with(|comm| comm.is_null()).unwrap_or(false));
    }
}

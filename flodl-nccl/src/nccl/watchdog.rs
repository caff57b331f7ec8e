//! The watchdog: a thread per NCCL communicator that aborts it on an async error or a deadline.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::Duration;

use super::slot::Slot;
use crate::error::{Error, Result};

/// How often the watchdog polls `ncclCommGetAsyncError` and the deadline.
const POLL: Duration = Duration::from_millis(10);

/// The running watchdog; dropping it stops and joins the thread (structural shutdown).
#[derive(Debug)]
pub(crate) struct Watchdog {
    stop: Option<mpsc::SyncSender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching `slot`.
    ///
    /// # Errors
    /// `Cuda` if the thread cannot be spawned.
    pub(crate) fn start(slot: Arc<Slot>, rank: usize) -> Result<Watchdog> {
        let (stop, stopped) = mpsc::sync_channel::<()>(1);
        let thread = thread::Builder::new()
            .name(format!("nccl-watchdog-{rank}"))
            .spawn(move || {
                let _ = slot.ctx.bind_to_thread();
                // Wakes every POLL until the owner drops the sender.
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(POLL) {
                    if !slot.watch() {
                        break;
                    }
                }
            })
            .map_err(|e| Error::Cuda(format!("cannot start the NCCL watchdog: {e}")))?;
        Ok(Watchdog { stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

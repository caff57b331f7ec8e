//! The running run: `DdpHandle` (metrics, abort, join), and a cooperative run's `Cooperative`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::control::deadline::DeadlineRule;
use crate::control::metrics::{EpochMetrics, GuardEvent, ReduceEvent};
use crate::link::frames::Admitted;
use crate::runtime::engine::capture::SaveRequest;
use crate::runtime::engine::fault::{DeadFlags, FaultEvent, RankThread, RejoinEvent};
use crate::runtime::engine::outlets::{Outlets, TrainedState, panic_message};
use crate::runtime::engine::run_config::RunConfig;
use crate::{Error, Result};

/// Capacity of the reduce-event queue.
const REDUCE_QUEUE: usize = 1 << 16;
/// Capacity of the death and rejoin queues (a rank may die and join again many times).
const MEMBERSHIP_QUEUE: usize = 1 << 12;

/// A run in progress: read its metrics while it trains, then [`join`](DdpHandle::join) it.
///
/// Dropping the handle without joining aborts the run and waits for its threads.
#[derive(Debug)]
pub struct DdpHandle {
    epochs: flume::Receiver<EpochMetrics>,
    reduces: flume::Receiver<ReduceEvent>,
    guards: flume::Receiver<GuardEvent>,
    cancel: Arc<AtomicBool>,
    save_now: Arc<SaveRequest>,
    checkpointing: bool,
    main: Option<JoinHandle<Result<TrainedState>>>,
    workers: Vec<RankThread>,
    faults: flume::Receiver<FaultEvent>,
    rejoins: flume::Receiver<RejoinEvent>,
    dead: DeadFlags,
    /// How long a failed run's `join` waits for a live rank's thread to end.
    grace: Duration,
}

impl DdpHandle {
    /// Spawns the run's threads and waits until every replica is built and checked (so a
    /// replica that cannot be built, or does not fit the run or its checkpoint, fails here).
    /// `remote` holds the connections of the ranks in other processes (a cluster run's
    /// controller), by rank.
    pub(crate) fn start(config: Arc<RunConfig>, remote: Admitted) -> Result<DdpHandle> {
        let (epochs_tx, epochs) = flume::bounded(config.spec.epochs + 1);
        let (reduces_tx, reduces) = flume::bounded(REDUCE_QUEUE);
        let (guards_tx, guards) = flume::bounded(REDUCE_QUEUE);
        let (faults_tx, faults) = flume::bounded(MEMBERSHIP_QUEUE);
        let (rejoins_tx, rejoins) = flume::bounded(MEMBERSHIP_QUEUE);
        let dead = DeadFlags::new(config.world());
        let grace = config.spec.stall_timeout;
        let cancel = Arc::new(AtomicBool::new(false));
        let save_now = Arc::new(SaveRequest::default());
        let checkpointing = config.checkpoints.is_some();
        let (started_tx, started) = flume::bounded(1);
        let outlets = Outlets {
            epochs: epochs_tx,
            reduces: reduces_tx,
            guards: guards_tx,
            cancel: cancel.clone(),
            save_now: save_now.clone(),
            faults: faults_tx,
            rejoins: rejoins_tx,
            dead: dead.clone(),
            started: started_tx,
        };
        let wait = config.spec.stall_timeout.saturating_mul(2);
        let (main, workers) = crate::runtime::engine::start(config, outlets, remote)?;
        let mut handle = DdpHandle {
            epochs,
            reduces,
            guards,
            cancel,
            save_now,
            checkpointing,
            main: Some(main),
            workers,
            faults,
            rejoins,
            dead,
            grace,
        };
        match started.recv_timeout(wait) {
            Ok(()) => Ok(handle),
            // The run ended before it started training: its error is the answer.
            Err(flume::RecvTimeoutError::Disconnected) => handle.wait().and(Err(Error::Aborted)),
            Err(flume::RecvTimeoutError::Timeout) => {
                handle.abort();
                handle.wait().and(Err(Error::Timeout { what: "the ranks' replicas", after: wait }))
            }
        }
    }

    /// The epoch metrics emitted since the last call, without waiting.
    pub fn poll_metrics(&mut self) -> Vec<EpochMetrics> {
        self.epochs.try_iter().collect()
    }

    /// The next epoch's metrics, waiting up to `timeout`; `None` on timeout or when the run has
    /// ended and every epoch was read.
    pub fn next_metrics(&mut self, timeout: Duration) -> Option<EpochMetrics> {
        self.epochs.recv_timeout(timeout).ok()
    }

    /// The reduce events emitted since the last call, without waiting (events are dropped
    /// when more than 65536 wait unread).
    pub fn poll_reduce_events(&mut self) -> Vec<ReduceEvent> {
        self.reduces.try_iter().collect()
    }

    /// The divergence guard's readings since the last call, without waiting (one per reduce
    /// when the guard is on and the policy is not `Sync`; dropped when more than 65536 wait
    /// unread).
    pub fn poll_guard_events(&mut self) -> Vec<GuardEvent> {
        self.guards.try_iter().collect()
    }

    /// Asks for a checkpoint at the next reduce (when the run has a checkpoint directory;
    /// ignored otherwise).
    pub fn checkpoint_now(&self) {
        self.save_now.ask(false);
    }

    /// Stops the run at its next reduce after saving a checkpoint there; `join` then returns
    /// [`Error::Stopped`] with the bundle's path (resume from it with
    /// [`crate::Trainer::resume`]). Without a checkpoint directory this is [`abort`](Self::abort).
    /// A run with no reduce left finishes normally (its end is saved anyway).
    pub fn stop_with_checkpoint(&self) {
        if self.checkpointing {
            self.save_now.ask(true);
        } else {
            self.abort();
        }
    }

    /// The ranks declared dead since the last call, without waiting (a rank that joined again
    /// may die again; events are dropped when more than 4096 wait unread).
    pub fn poll_fault_events(&mut self) -> Vec<FaultEvent> {
        self.faults.try_iter().collect()
    }

    /// The ranks that joined the run again since the last call, without waiting.
    pub fn poll_rejoin_events(&mut self) -> Vec<RejoinEvent> {
        self.rejoins.try_iter().collect()
    }

    /// Whether the run has ended (successfully or not); `join` then returns at once.
    pub fn is_finished(&self) -> bool {
        self.main.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stops the run as soon as possible; `join` then returns [`Error::Aborted`] unless the
    /// run had already finished.
    pub fn abort(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    /// Waits for the run to end and returns the averaged model (the final state of the lowest
    /// live rank).
    ///
    /// The threads of live ranks are joined. The thread of a rank declared dead is joined when
    /// it has already ended, and detached otherwise: a rank stuck forever inside its replica
    /// cannot be joined, and it exits on its own once its replica returns (its channels are
    /// closed by then). When the run failed, a live rank's thread (told to stop) is waited for
    /// at most the stall timeout — after [`abort`](Self::abort), at most the least silence
    /// deadline (2 s) — then detached the same way.
    ///
    /// # Errors
    /// [`Error::Unrecoverable`] when the ranks' failures leave nothing to go on with; the error
    /// of the rank that died past [`Trainer::max_failures`](crate::Trainer::max_failures)
    /// (wrapped in [`Error::Rank`]); a failure while replicas are built; a timeout; or
    /// [`Error::Aborted`].
    pub fn join(mut self) -> Result<TrainedState> {
        self.wait()
    }

    fn wait(&mut self) -> Result<TrainedState> {
        let result = match self.main.take() {
            Some(main) => match main.join() {
                Ok(r) => r,
                Err(p) => Err(Error::CoordinatorPanicked { message: panic_message(p.as_ref()) }),
            },
            None => Err(Error::Aborted),
        };
        // Aborted by its user: a live rank stuck inside a step is waited for no longer than a
        // rank's least silence deadline, then detached (it ends when its step returns).
        let grace = if self.cancel.load(Ordering::Acquire) {
            self.grace.min(DeadlineRule::default().floor)
        } else {
            self.grace
        };
        if result.is_err() {
            self.abort();
        }
        let deadline = Instant::now() + grace;
        for w in self.workers.drain(..) {
            let rank = w.rank;
            let dead = self.dead.is_dead(rank);
            let ends = w.handle.is_finished()
                || (!dead && result.is_ok())
                || (!dead
                    && matches!(
                        w.ended.recv_deadline(deadline),
                        Err(flume::RecvTimeoutError::Disconnected)
                    ));
            if !ends {
                tracing::warn!(rank, dead, "detaching the thread of a rank that has not ended");
                continue;
            }
            // A worker catches its own panics; a join error here has nothing left to report.
            let _ = w.handle.join();
        }
        result
    }
}

impl Drop for DdpHandle {
    fn drop(&mut self) {
        if self.main.is_some() {
            self.abort();
            let _ = self.wait();
        }
    }
}

/// A cooperative run: the handle of the run and one [`Worker`](crate::Worker) per rank, in rank
/// order.
#[derive(Debug)]
pub struct Cooperative {
    /// The run's handle: metrics, reduce, guard and fault events, checkpoints, `join`.
    pub handle: DdpHandle,
    /// One worker per rank, `workers[r]` for rank `r`: move each to a thread of its own.
    pub workers: Vec<crate::cooperative::Worker>,
}

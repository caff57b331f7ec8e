//! In-memory connections, for cluster runs within one process: frame queues in place of
//! sessions, and a rendezvous that pairs them (the in-memory flavor of
//! [`Frames`](super::frames::Frames), [`Arrivals`](super::frames::Arrivals) and
//! [`Rendezvous`](super::rendezvous::Rendezvous)).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config_error::{ConfigError, Field};
use crate::link::frame::Lane;
use crate::link::link_error::LinkError;
use crate::link::roll_call::RollCall;
use crate::{Error, Result};

/// Frames queued per direction of a connection.
const DEPTH: usize = 64;

/// One end of an in-memory connection (one queue per direction, so lanes keep one order).
#[derive(Debug)]
pub(crate) struct MemFrames {
    tx: Mutex<Option<flume::Sender<Vec<u8>>>>,
    rx: flume::Receiver<Vec<u8>>,
    closed: AtomicBool,
}

/// Two connected ends.
pub(crate) fn pair() -> (MemFrames, MemFrames) {
    let (a_tx, b_rx) = flume::bounded(DEPTH);
    let (b_tx, a_rx) = flume::bounded(DEPTH);
    let end = |tx, rx| MemFrames { tx: Mutex::new(Some(tx)), rx, closed: AtomicBool::new(false) };
    (end(a_tx, a_rx), end(b_tx, b_rx))
}

impl MemFrames {
    fn sender(&self) -> std::result::Result<flume::Sender<Vec<u8>>, LinkError> {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        tx.clone().ok_or(LinkError::Gone)
    }

    /// As [`Frames::send`](super::frames::Frames::send) (one queue: the lane keeps no order of
    /// its own).
    pub(crate) fn send(
        &self,
        _: Lane,
        frame: Vec<u8>,
        wait: Duration,
    ) -> std::result::Result<(), LinkError> {
        self.sender()?.send_timeout(frame, wait).map_err(|e| match e {
            flume::SendTimeoutError::Timeout(_) => LinkError::Timeout(wait),
            flume::SendTimeoutError::Disconnected(_) => LinkError::Gone,
        })
    }

    /// As [`Frames::try_send`](super::frames::Frames::try_send).
    pub(crate) fn try_send(&self, _: Lane, frame: Vec<u8>) -> std::result::Result<(), LinkError> {
        self.sender()?.try_send(frame).map_err(|e| match e {
            flume::TrySendError::Full(_) => LinkError::Full,
            flume::TrySendError::Disconnected(_) => LinkError::Gone,
        })
    }

    /// As [`Frames::recv`](super::frames::Frames::recv).
    pub(crate) fn recv(&self, wait: Duration) -> std::result::Result<Vec<u8>, LinkError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(LinkError::Gone);
        }
        self.rx.recv_timeout(wait).map_err(|e| match e {
            flume::RecvTimeoutError::Timeout => LinkError::Timeout(wait),
            flume::RecvTimeoutError::Disconnected => LinkError::Gone,
        })
    }

    /// As [`Frames::close`](super::frames::Frames::close).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// The controller's ends, posted by joining ranks, with the run each claimed.
#[derive(Debug, Default)]
struct Posted {
    ends: Vec<Option<([u8; 32], MemFrames)>>,
}

/// The posted ends and the signal that one arrived.
#[derive(Debug)]
struct Board {
    posted: Mutex<Posted>,
    arrived: std::sync::Condvar,
}

/// An in-memory meeting place of `world` ranks.
#[derive(Debug)]
pub(crate) struct Memory {
    board: Arc<Board>,
}

impl Memory {
    pub(crate) fn new(world: usize) -> Memory {
        let posted = Posted { ends: (0..world).map(|_| None).collect() };
        let board = Board { posted: Mutex::new(posted), arrived: std::sync::Condvar::new() };
        Memory { board: Arc::new(board) }
    }
}

/// Ranks that post their end after the start: joins of a running run.
#[derive(Debug)]
pub(crate) struct Later {
    board: Arc<Board>,
    run: [u8; 32],
}

impl Later {
    /// As [`Arrivals::next`](super::frames::Arrivals::next).
    pub(crate) fn next(&self, wait: Duration) -> Option<(usize, MemFrames)> {
        let board = &self.board;
        let mut posted = board.posted.lock().unwrap_or_else(|p| p.into_inner());
        if posted.ends.iter().all(Option::is_none) {
            posted = board.arrived.wait_timeout(posted, wait).unwrap_or_else(|p| p.into_inner()).0;
        }
        let rank = posted.ends.iter().position(Option::is_some)?;
        let (theirs, end) = posted.ends.get_mut(rank)?.take()?;
        if theirs != self.run {
            tracing::warn!(rank, "a join of another run was closed");
            end.close();
            return None;
        }
        Some((rank, end))
    }
}

impl Memory {
    /// As [`super::rendezvous::Rendezvous::accept`].
    pub(crate) fn accept(
        &self,
        run: [u8; 32],
        world: usize,
        ranks: &[usize],
        quorum: usize,
        wait: Duration,
        _silence: Duration,
    ) -> Result<(Vec<(usize, MemFrames)>, Later)> {
        let roll = RollCall::start(world, ranks, quorum, wait);
        let board = &self.board;
        let mut posted = board.posted.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(left) = roll.left(|r| posted.ends.get(r).is_some_and(Option::is_some))? {
            posted = board.arrived.wait_timeout(posted, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        let mut out = Vec::new();
        for (rank, slot) in posted.ends.iter_mut().enumerate() {
            if !ranks.contains(&rank) {
                continue;
            }
            if let Some((theirs, end)) = slot.take() {
                if theirs != run {
                    end.close();
                    return Err(Error::RunMismatch { rank });
                }
                out.push((rank, end));
            }
        }
        Ok((out, Later { board: self.board.clone(), run }))
    }

    /// As [`super::rendezvous::Rendezvous::join`].
    pub(crate) fn join(
        &self,
        run: [u8; 32],
        rank: usize,
        _world: usize,
        _wait: Duration,
        _silence: Duration,
    ) -> Result<MemFrames> {
        let (controller, own) = pair();
        let mut posted = self.board.posted.lock().unwrap_or_else(|p| p.into_inner());
        let slot = posted.ends.get_mut(rank).ok_or_else(|| {
            ConfigError::out_of_range(Field::Cluster, rank, "a rank below the world's size")
        })?;
        *slot = Some((run, controller));
        self.board.arrived.notify_all();
        Ok(own)
    }
}

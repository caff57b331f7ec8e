//! The user's side of a session: a sender and a receiver, usable from two threads.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::arrival::Arrival;
use super::config::Caps;
use super::lane::Lane;
use super::runtime::Reactor;
use crate::error::NetError;

/// One lane's way in: frames with their sequence numbers, and the credits that bound its queue.
#[derive(Debug)]
pub(crate) struct LaneTx {
    pub(crate) frames: flume::Sender<(u64, Vec<u8>)>,
    pub(crate) credits: flume::Receiver<()>,
}

/// What both halves share: the session's rank and what keeps its tasks running.
pub(crate) struct Core {
    pub(crate) rank: usize,
    /// Closed (all senders dropped) when every task of the session has finished.
    pub(crate) done: flume::Receiver<()>,
    /// Ends every task of the session.
    pub(crate) cancel: CancellationToken,
    /// How long closing waits for queued frames to leave before cutting the lanes.
    pub(crate) drain: Duration,
    /// The runtime the tasks run on, when the session owns a share of it.
    pub(crate) reactor: Mutex<Option<Arc<Reactor>>>,
    /// Where a bounded close is scheduled when no runtime is owned.
    pub(crate) handle: tokio::runtime::Handle,
    /// When bytes of a frame still on its way last came.
    pub(crate) arrival: Arc<Arrival>,
}

impl Drop for Core {
    fn drop(&mut self) {
        let reactor = self.reactor.lock().unwrap_or_else(|p| p.into_inner()).take();
        match reactor {
            // The runtime would stop with the last share: let queued frames leave first (bounded).
            Some(reactor) => {
                let _ = self.done.recv_timeout(self.drain);
                self.cancel.cancel();
                drop(reactor);
            }
            // Someone else's runtime: close in the background, cut after the drain.
            None => {
                let (done, cancel, drain) = (self.done.clone(), self.cancel.clone(), self.drain);
                self.handle.spawn(async move {
                    let _ = tokio::time::timeout(drain, done.recv_async()).await;
                    cancel.cancel();
                });
            }
        }
    }
}

/// The sending half of a session.
pub struct SessionSender {
    // Field order matters: the lanes close before the core waits for them to drain.
    lanes: Arc<SendLanes>,
    core: Arc<Core>,
}

/// Both lanes' ways in, and the sequence numbering that orders frames across them.
pub(crate) struct SendLanes {
    pub(crate) lanes: [LaneTx; 2],
    pub(crate) next_seq: Mutex<u64>,
    pub(crate) caps: Caps,
}

/// The receiving half of a session.
pub struct SessionReceiver {
    frames: flume::Receiver<Bytes>,
    core: Arc<Core>,
}

/// An ordered, bidirectional stream of frames with one peer, on two lanes. Dropping it (or
/// [`close`](Session::close)) closes both lanes after queued frames have left (bounded by the
/// silence); the peer then receives what was sent and [`NetError::Gone`].
pub struct Session {
    sender: SessionSender,
    receiver: SessionReceiver,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session").field("rank", &self.rank()).finish_non_exhaustive()
    }
}

impl fmt::Debug for SessionSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionSender").field("rank", &self.core.rank).finish_non_exhaustive()
    }
}

impl fmt::Debug for SessionReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionReceiver").field("rank", &self.core.rank).finish_non_exhaustive()
    }
}

impl Session {
    pub(crate) fn assemble(
        lanes: SendLanes,
        frames: flume::Receiver<Bytes>,
        core: Core,
    ) -> Session {
        let core = Arc::new(core);
        Session {
            sender: SessionSender { lanes: Arc::new(lanes), core: core.clone() },
            receiver: SessionReceiver { frames, core },
        }
    }

    /// Makes this session keep `reactor` running until both halves are dropped.
    pub(crate) fn keep(&self, reactor: Arc<Reactor>) {
        *self.sender.core.reactor.lock().unwrap_or_else(|p| p.into_inner()) = Some(reactor);
    }

    /// The peer's rank (on a rank's side, its own).
    pub fn rank(&self) -> usize {
        self.sender.core.rank
    }

    /// Queues `frame` on `lane`, waiting up to `wait` for room. Errors: [`NetError::TooLarge`],
    /// [`NetError::Timeout`], [`NetError::Gone`].
    pub fn send(&self, lane: Lane, frame: Vec<u8>, wait: Duration) -> Result<(), NetError> {
        self.sender.send(lane, frame, wait)
    }

    /// Queues `frame` on `lane` if there is room now ([`NetError::Full`] if not).
    pub fn try_send(&self, lane: Lane, frame: Vec<u8>) -> Result<(), NetError> {
        self.sender.try_send(lane, frame)
    }

    /// [`send`](Session::send) for code running on tokio.
    pub async fn send_async(
        &self,
        lane: Lane,
        frame: Vec<u8>,
        wait: Duration,
    ) -> Result<(), NetError> {
        self.sender.send_async(lane, frame, wait).await
    }

    /// The next frame in send order, waiting up to `wait`; [`NetError::Gone`] once the session has
    /// ended and every frame that arrived has been received. A large frame is copied into the
    /// `Vec`: take large frames with [`recv_bytes`](Session::recv_bytes).
    pub fn recv(&self, wait: Duration) -> Result<Vec<u8>, NetError> {
        self.receiver.recv(wait)
    }

    /// The next frame if one is ready.
    pub fn try_recv(&self) -> Result<Option<Vec<u8>>, NetError> {
        self.receiver.try_recv()
    }

    /// [`recv`](Session::recv) without the conversion to a `Vec`: no copy at all, the frame is the
    /// lane reader's own buffer. Drop it before the next large frame arrives and the lane reads
    /// that one into the same pages (no allocation, no page faults); hold it and the lane grows
    /// a buffer of its own meanwhile. A frame kept for long keeps its whole buffer (the size of
    /// the largest frame read into it): copy out what you keep.
    pub fn recv_bytes(&self, wait: Duration) -> Result<Bytes, NetError> {
        self.receiver.recv_bytes(wait)
    }

    /// [`recv`](Session::recv) for code running on tokio.
    pub async fn recv_async(&self, wait: Duration) -> Result<Vec<u8>, NetError> {
        self.receiver.recv_async(wait).await
    }

    /// See [`SessionReceiver::arrival`].
    pub fn arrival(&self) -> Arc<Arrival> {
        self.receiver.arrival()
    }

    /// The two halves, for a thread that sends and another that receives.
    pub fn split(self) -> (SessionSender, SessionReceiver) {
        (self.sender, self.receiver)
    }

    /// Closes both lanes (as dropping does).
    pub fn close(self) {}
}

impl SessionSender {
    /// The peer's rank (on a rank's side, its own).
    pub fn rank(&self) -> usize {
        self.core.rank
    }

    /// See [`Session::send`].
    pub fn send(&self, lane: Lane, frame: Vec<u8>, wait: Duration) -> Result<(), NetError> {
        self.lanes.fits(lane, &frame)?;
        match self.lanes.lanes[lane.index()].credits.recv_timeout(wait) {
            Ok(()) => self.lanes.enqueue(lane, frame),
            Err(flume::RecvTimeoutError::Timeout) => Err(NetError::Timeout(wait)),
            Err(flume::RecvTimeoutError::Disconnected) => Err(NetError::Gone),
        }
    }

    /// See [`Session::try_send`].
    pub fn try_send(&self, lane: Lane, frame: Vec<u8>) -> Result<(), NetError> {
        self.lanes.fits(lane, &frame)?;
        match self.lanes.lanes[lane.index()].credits.try_recv() {
            Ok(()) => self.lanes.enqueue(lane, frame),
            Err(flume::TryRecvError::Empty) => Err(NetError::Full),
            Err(flume::TryRecvError::Disconnected) => Err(NetError::Gone),
        }
    }

    /// See [`Session::send_async`].
    pub async fn send_async(
        &self,
        lane: Lane,
        frame: Vec<u8>,
        wait: Duration,
    ) -> Result<(), NetError> {
        self.lanes.fits(lane, &frame)?;
        match tokio::time::timeout(wait, self.lanes.lanes[lane.index()].credits.recv_async()).await
        {
            Ok(Ok(())) => self.lanes.enqueue(lane, frame),
            Ok(Err(_)) => Err(NetError::Gone),
            Err(_) => Err(NetError::Timeout(wait)),
        }
    }
}

impl SendLanes {
    /// Refuses a frame above the lane's cap.
    fn fits(&self, lane: Lane, frame: &[u8]) -> Result<(), NetError> {
        let cap = self.caps.of(lane);
        if frame.len() > cap {
            return Err(NetError::TooLarge { lane, len: frame.len(), cap });
        }
        Ok(())
    }

    /// Numbers the frame and queues it (a credit is already taken, so this never waits): the
    /// number and the queue position are taken together, so each lane carries increasing numbers.
    fn enqueue(&self, lane: Lane, frame: Vec<u8>) -> Result<(), NetError> {
        let mut next = self.next_seq.lock().unwrap_or_else(|p| p.into_inner());
        self.lanes[lane.index()].frames.send((*next, frame)).map_err(|_| NetError::Gone)?;
        *next += 1;
        Ok(())
    }
}

impl SessionReceiver {
    /// The peer's rank (on a rank's side, its own).
    pub fn rank(&self) -> usize {
        self.core.rank
    }

    /// See [`Session::recv`].
    pub fn recv(&self, wait: Duration) -> Result<Vec<u8>, NetError> {
        self.recv_bytes(wait).map(Vec::from)
    }

    /// When bytes of a data frame not yet whole last came ([`Arrival::last`]): the peer's sign
    /// of life while a large frame crosses a slow link, before [`recv`](Self::recv) can hand it
    /// over. A handle to keep: it reads the session's clock without taking the receiver.
    pub fn arrival(&self) -> Arc<Arrival> {
        self.core.arrival.clone()
    }

    /// See [`Session::recv_bytes`].
    pub fn recv_bytes(&self, wait: Duration) -> Result<Bytes, NetError> {
        match self.frames.recv_timeout(wait) {
            Ok(frame) => Ok(frame),
            Err(flume::RecvTimeoutError::Timeout) => Err(NetError::Timeout(wait)),
            Err(flume::RecvTimeoutError::Disconnected) => Err(NetError::Gone),
        }
    }

    /// See [`Session::try_recv`].
    pub fn try_recv(&self) -> Result<Option<Vec<u8>>, NetError> {
        match self.frames.try_recv() {
            Ok(frame) => Ok(Some(Vec::from(frame))),
            Err(flume::TryRecvError::Empty) => Ok(None),
            Err(flume::TryRecvError::Disconnected) => Err(NetError::Gone),
        }
    }

    /// See [`Session::recv_async`].
    pub async fn recv_async(&self, wait: Duration) -> Result<Vec<u8>, NetError> {
        match tokio::time::timeout(wait, self.frames.recv_async()).await {
            Ok(Ok(frame)) => Ok(Vec::from(frame)),
            Ok(Err(_)) => Err(NetError::Gone),
            Err(_) => Err(NetError::Timeout(wait)),
        }
    }
}

//! The rendezvous over mutual TLS: flodl-cluster's controller and sessions, each session the
//! [`Frames`](super::frames::Frames) of one rank's connection (the TLS flavor of
//! [`Frames`](super::frames::Frames), [`Arrivals`](super::frames::Arrivals) and
//! [`Rendezvous`](super::rendezvous::Rendezvous)).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;

use flodl_cluster::{
    Arrival, Caps, Controller, ControllerAddr, Hello, Lane as NetLane, NetError, SessionConfig,
    SessionReceiver, SessionSender, Tls,
};

use crate::link::frame::Lane;
use crate::link::link_error::LinkError;
use crate::link::roll_call::RollCall;
use crate::{Error, Result};

/// The control lane's frame cap: orders and reports are small.
pub(crate) const CONTROL_CAP: usize = 1 << 20;

/// One rank's session as the network link's frames: its two halves, each dropped on close
/// (the session ends once both are gone).
pub(crate) struct SessionFrames {
    sender: Mutex<Option<SessionSender>>,
    receiver: Mutex<Option<SessionReceiver>>,
    closed: AtomicBool,
    /// When bytes of a frame still on its way last came (read without taking the receiver).
    arrival: Arc<Arrival>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a link makes of a session's error.
fn link_error(e: NetError) -> LinkError {
    match e {
        NetError::Timeout(after) => LinkError::Timeout(after),
        NetError::Full => LinkError::Full,
        NetError::TooLarge { lane, len, cap } => {
            tracing::error!(%lane, len, cap, "a frame is above its lane's cap; ending the session");
            LinkError::Gone
        }
        _ => LinkError::Gone,
    }
}

impl SessionFrames {
    fn new(session: flodl_cluster::Session) -> SessionFrames {
        let arrival = session.arrival();
        let (sender, receiver) = session.split();
        SessionFrames {
            sender: Mutex::new(Some(sender)),
            receiver: Mutex::new(Some(receiver)),
            closed: AtomicBool::new(false),
            arrival,
        }
    }

    fn with_sender(
        &self,
        f: impl FnOnce(&SessionSender) -> std::result::Result<(), NetError>,
    ) -> std::result::Result<(), LinkError> {
        let mut sender = lock(&self.sender);
        let result = match sender.as_ref() {
            Some(s) => f(s).map_err(link_error),
            None => Err(LinkError::Gone),
        };
        if self.closed.load(Ordering::Acquire) {
            sender.take();
        }
        result
    }
}

fn net_lane(lane: Lane) -> NetLane {
    match lane {
        Lane::Control => NetLane::Control,
        Lane::Bulk => NetLane::Bulk,
    }
}

impl SessionFrames {
    /// As [`Frames::send`](super::frames::Frames::send).
    pub(crate) fn send(
        &self,
        lane: Lane,
        frame: Vec<u8>,
        wait: Duration,
    ) -> std::result::Result<(), LinkError> {
        self.with_sender(|s| s.send(net_lane(lane), frame, wait))
    }

    /// As [`Frames::try_send`](super::frames::Frames::try_send).
    pub(crate) fn try_send(
        &self,
        lane: Lane,
        frame: Vec<u8>,
    ) -> std::result::Result<(), LinkError> {
        self.with_sender(|s| s.try_send(net_lane(lane), frame))
    }

    /// As [`Frames::recv`](super::frames::Frames::recv).
    pub(crate) fn recv(&self, wait: Duration) -> std::result::Result<Bytes, LinkError> {
        match lock(&self.receiver).as_ref() {
            Some(r) => r.recv_bytes(wait).map_err(link_error),
            None => Err(LinkError::Gone),
        }
    }

    /// As [`Frames::arriving`](super::frames::Frames::arriving).
    pub(crate) fn arriving(&self) -> Option<std::time::Instant> {
        self.arrival.last()
    }

    /// As [`Frames::close`](super::frames::Frames::close).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        lock(&self.receiver).take();
        // A sender busy in a send drops its half when the send returns.
        if let Ok(mut sender) = self.sender.try_lock() {
            sender.take();
        }
    }
}

/// The controller after the start: the sessions of ranks joining again.
pub(crate) struct Later {
    controller: Controller,
}

impl Later {
    /// As [`Arrivals::next`](super::frames::Arrivals::next).
    pub(crate) fn next(&self, wait: Duration) -> Option<(usize, SessionFrames)> {
        match self.controller.accept(wait) {
            Ok(session) => Some((session.rank(), SessionFrames::new(session))),
            Err(NetError::Timeout(_)) => None,
            Err(e) => {
                tracing::warn!(error = %e, "the controller stopped admitting ranks");
                std::thread::sleep(wait);
                None
            }
        }
    }
}

/// Meeting over mutual TLS: the controller binds `bind` and admits the other ranks; a rank
/// joins `controller`.
pub(crate) struct TlsRendezvous {
    pub(crate) tls: Tls,
    pub(crate) controller: ControllerAddr,
    pub(crate) bind: SocketAddr,
    /// A listening socket the launcher bound and handed down, used instead of binding `bind`.
    pub(crate) inherited: Arc<Mutex<Option<std::net::TcpListener>>>,
    pub(crate) bulk_cap: usize,
    /// The controller a rank joins (whose name it verifies): the first one, or the standby of
    /// the rank whose process took over.
    pub(crate) serving: flodl_cluster::Role,
}

impl TlsRendezvous {
    fn config(&self, silence: Duration) -> SessionConfig {
        let mut cfg = SessionConfig::new(
            self.tls.clone(),
            Caps { control: CONTROL_CAP, bulk: self.bulk_cap },
        );
        cfg.silence = silence;
        cfg.heartbeat = (silence / 5).min(SessionConfig::HEARTBEAT);
        cfg.serving = self.serving;
        cfg.app = super::wire::WIRE_VERSION;
        cfg
    }
}

fn net(what: &'static str) -> impl FnOnce(NetError) -> Error {
    move |source| Error::Net { what, source }
}

impl TlsRendezvous {
    /// As [`super::rendezvous::Rendezvous::accept`].
    pub(crate) fn accept(
        &self,
        run: [u8; 32],
        world: usize,
        ranks: &[usize],
        quorum: usize,
        wait: Duration,
        silence: Duration,
    ) -> Result<(Vec<(usize, SessionFrames)>, Later)> {
        let inherited = lock(&self.inherited).take();
        let controller = match inherited {
            Some(listener) => Controller::serve(listener, run, world, self.config(silence)),
            None => Controller::bind(self.bind, run, world, self.config(silence)),
        }
        .map_err(net("binding the controller"))?;
        tracing::info!(addr = %controller.local_addr(), world, "controller waiting for ranks");
        let roll = RollCall::start(world, ranks, quorum, wait);
        let mut joined: Vec<Option<SessionFrames>> = (0..world).map(|_| None).collect();
        while let Some(left) = roll.left(|r| joined.get(r).is_some_and(Option::is_some))? {
            match controller.accept(left) {
                Ok(session) => {
                    let rank = session.rank();
                    match joined.get_mut(rank) {
                        Some(slot @ None) if ranks.contains(&rank) => {
                            *slot = Some(SessionFrames::new(session))
                        }
                        // The controller admits each rank once; anything else is dropped.
                        _ => tracing::warn!(rank, "an unexpected session was dropped"),
                    }
                }
                Err(NetError::Timeout(_)) => {}
                Err(e) => return Err(net("admitting ranks")(e)),
            }
        }
        let now = joined.into_iter().enumerate().filter_map(|(r, f)| f.map(|f| (r, f))).collect();
        // The controller keeps admitting for the whole run: a rank process restarted after its
        // death joins again (same CA, same run, its seat free once its old session ended).
        Ok((now, Later { controller }))
    }

    /// As [`super::rendezvous::Rendezvous::join`].
    pub(crate) fn join(
        &self,
        run: [u8; 32],
        rank: usize,
        world: usize,
        wait: Duration,
        silence: Duration,
    ) -> Result<SessionFrames> {
        let hello = Hello::new(run, rank, world);
        let session = flodl_cluster::join(&self.controller, hello, self.config(silence), wait)
            .map_err(net("joining the controller"))?;
        Ok(SessionFrames::new(session))
    }
}

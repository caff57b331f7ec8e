//! The link's two ends as the runtime sees them: the coordinator's and a rank's, each one of a
//! closed set of flavors (in-process queues [`super::local`], a connection per rank
//! [`super::net`], or both, routed by rank [`super::route`]), and how often a quiet end says it
//! is alive.

use std::sync::Arc;
use std::time::Duration;

use flodl_nccl::AbortHandle;

use super::frame::WireFormat;
use super::frames::{Admitted, Frames};
use super::inbound::Inbound;
use super::link_error::LinkError;
use super::local::{self, LocalCoordinator, LocalRank};
use super::net::{NetCoordinator, NetRank};
use super::route::{Route, Routed};
use super::wire::{ToCoordinator, ToWorker};
use crate::Result;
use crate::state::HostState;

/// The coordinator's end of the link: one send queue per rank.
#[derive(Debug)]
pub(crate) struct CoordinatorLink {
    flavor: CoordinatorFlavor,
}

/// The flavors of the coordinator's end.
#[derive(Debug)]
enum CoordinatorFlavor {
    /// Every rank in-process.
    Local(LocalCoordinator),
    /// Some ranks in-process, the others over connections (or joining again over one).
    Routed(Routed),
}

impl CoordinatorLink {
    /// The coordinator's end for a world of `world` ranks, and the ends of the ranks `here`
    /// (this process's, on in-process queues of `capacity` messages): the ranks `admitted`
    /// are reached through their connections in `format` (with the model cut into `fragments`,
    /// 1 for none), and so are those admitted later.
    /// What the ranks send goes to `inbox`.
    ///
    /// # Errors
    /// [`crate::Error::Spawn`] when a link thread cannot start; a protocol error for a
    /// connection of a rank outside the world.
    pub(crate) fn start(
        world: usize,
        here: &[usize],
        admitted: Admitted,
        capacity: usize,
        format: (WireFormat, usize),
        inbox: &flume::Sender<Inbound>,
    ) -> Result<(CoordinatorLink, Vec<RankLink>)> {
        let (remote, arrivals) = admitted;
        let (local, ends) = local::link_ranks(here, capacity, inbox);
        let ends = ends.into_iter().map(|end| RankLink { flavor: RankFlavor::Local(end) });
        let flavor = if remote.is_empty() && arrivals.is_none() {
            CoordinatorFlavor::Local(local)
        } else {
            let routes = (0..world)
                .map(|r| here.iter().position(|x| *x == r).map_or(Route::Remote, Route::Local))
                .collect();
            let net = NetCoordinator::new((world, here), remote, format, inbox, arrivals)?;
            CoordinatorFlavor::Routed(Routed::new(routes, local, net))
        };
        Ok((CoordinatorLink { flavor }, ends.collect()))
    }

    /// Sends `msg` to `rank`, waiting at most `wait` for room.
    ///
    /// # Errors
    /// [`LinkError::Gone`] when the rank's end is gone, [`LinkError::Timeout`] when there was
    /// no room in time.
    pub(crate) fn send(
        &self,
        rank: usize,
        msg: ToWorker,
        wait: Duration,
    ) -> std::result::Result<(), LinkError> {
        match &self.flavor {
            CoordinatorFlavor::Local(l) => l.send(rank, msg, wait),
            CoordinatorFlavor::Routed(r) => r.send(rank, msg, wait),
        }
    }

    /// Sends `msg` to `rank` only if there is room now.
    ///
    /// # Errors
    /// [`LinkError::Gone`], or [`LinkError::Full`] (the message is dropped).
    pub(crate) fn try_send(
        &self,
        rank: usize,
        msg: ToWorker,
    ) -> std::result::Result<(), LinkError> {
        match &self.flavor {
            CoordinatorFlavor::Local(l) => l.try_send(rank, msg),
            CoordinatorFlavor::Routed(r) => r.try_send(rank, msg),
        }
    }

    /// Ends `rank`'s connection, when it has one: nothing more it sends is read, and its
    /// process finds the controller gone. A rank in this process is left as it is.
    pub(crate) fn sever(&self, rank: usize) {
        match &self.flavor {
            CoordinatorFlavor::Local(_) => {}
            CoordinatorFlavor::Routed(r) => r.sever(rank),
        }
    }

    /// Turns away a process that connected (a barred seat, a run that takes no joiner now):
    /// tells it to stop, then ends the connection, so its rank exits instead of taking the
    /// closed connection for a dead controller and following a standby.
    pub(crate) fn turn_away(&self, frames: &Frames) {
        if let Ok((lane, bytes)) = super::frame::encode(ToWorker::Stop, WireFormat::F32) {
            let _ = frames.try_send(lane, bytes);
        }
        frames.close();
    }

    /// Watches the whole state `rank` (the standby's, in another process) holds: from now on
    /// each whole update it is sent is read as the rank reads it, for a standby's cut to name
    /// by digest ([`CoordinatorLink::watched`]). Nothing for a rank in this process.
    pub(crate) fn watch(&self, rank: usize) {
        if let CoordinatorFlavor::Routed(r) = &self.flavor {
            r.watch(rank);
        }
    }

    /// The digest of the whole state the watched rank holds from its last whole update: the
    /// update's state over an f32 wire, the connection's views (the consensus within the
    /// controller's error feedback) under a quantized one; `None` under bf16, before any, or
    /// after an `Init`.
    pub(crate) fn watched(&self) -> Option<[u8; 32]> {
        match &self.flavor {
            CoordinatorFlavor::Local(_) => None,
            CoordinatorFlavor::Routed(r) => r.watched(),
        }
    }

    /// When bytes of a frame from `rank` not yet whole last came (`None`: never, or a rank in
    /// this process): a rank whose large snapshot is still crossing a slow link is alive.
    pub(crate) fn arriving(&self, rank: usize) -> Option<std::time::Instant> {
        match &self.flavor {
            CoordinatorFlavor::Local(_) => None,
            CoordinatorFlavor::Routed(r) => r.arriving(rank),
        }
    }

    /// Reaches `rank` through `frames` from now on (a rank that joined again), closing its
    /// old connection; false when `rank` is not reached over connections.
    pub(crate) fn attach(&self, rank: usize, frames: Arc<Frames>) -> bool {
        match &self.flavor {
            CoordinatorFlavor::Local(_) => false,
            CoordinatorFlavor::Routed(r) => r.attach(rank, frames),
        }
    }
}

/// A rank's end of the link.
#[derive(Debug)]
pub(crate) struct RankLink {
    flavor: RankFlavor,
}

/// The flavors of a rank's end.
#[derive(Debug)]
enum RankFlavor {
    /// A rank in the coordinator's process.
    Local(LocalRank),
    /// A rank in a process of its own, over its connection to the controller.
    Net(NetRank),
}

impl RankLink {
    /// A rank's end over `frames`, its connection to the controller, in `format` (with the model
    /// cut into `fragments`, 1 for none).
    ///
    /// # Errors
    /// [`crate::Error::Spawn`] when the reader thread cannot start.
    pub(crate) fn over(frames: Arc<Frames>, format: (WireFormat, usize)) -> Result<RankLink> {
        Ok(RankLink { flavor: RankFlavor::Net(NetRank::new(frames, format)?) })
    }

    /// Sends `msg` to the coordinator, waiting at most `wait` for room.
    ///
    /// # Errors
    /// [`LinkError::Gone`] or [`LinkError::Timeout`].
    pub(crate) fn send(
        &self,
        msg: ToCoordinator,
        wait: Duration,
    ) -> std::result::Result<(), LinkError> {
        match &self.flavor {
            RankFlavor::Local(l) => l.send(msg, wait),
            RankFlavor::Net(n) => n.send(msg, wait),
        }
    }

    /// The next message, waiting at most `wait`.
    ///
    /// # Errors
    /// [`LinkError::Timeout`] when nothing came, [`LinkError::Gone`] when the coordinator's end
    /// is gone and nothing is left to read.
    pub(crate) fn recv(&self, wait: Duration) -> std::result::Result<ToWorker, LinkError> {
        match &self.flavor {
            RankFlavor::Local(l) => l.recv(wait),
            RankFlavor::Net(n) => n.recv(wait),
        }
    }

    /// The next message if one is waiting.
    ///
    /// # Errors
    /// [`LinkError::Gone`] when the coordinator's end is gone and nothing is left to read.
    pub(crate) fn try_recv(&self) -> std::result::Result<Option<ToWorker>, LinkError> {
        match &self.flavor {
            RankFlavor::Local(l) => l.try_recv(),
            RankFlavor::Net(n) => n.try_recv(),
        }
    }

    /// Offers the starting state this rank built (made by `state`, only when it can serve) to
    /// its end of a connection, so that an `Init` of the same state names it instead of
    /// carrying it ([`super::held`]); returns its digest for `Ready`. `None` in the
    /// coordinator's process, where nothing is carried.
    ///
    /// # Errors
    /// What `state` returns.
    pub(crate) fn offer(
        &self,
        state: impl FnOnce() -> Result<HostState>,
    ) -> Result<Option<[u8; 32]>> {
        match &self.flavor {
            RankFlavor::Local(_) => Ok(None),
            RankFlavor::Net(n) => Ok(Some(n.offer(state()?))),
        }
    }

    /// When bytes of a frame from the coordinator not yet whole last came (`None`: never, or a
    /// rank in the coordinator's process): a large update crossing a slow link.
    pub(crate) fn arriving(&self) -> Option<std::time::Instant> {
        match &self.flavor {
            RankFlavor::Local(_) => None,
            RankFlavor::Net(n) => n.arriving(),
        }
    }

    /// Arms the abort of the rank's collective group number `generation`: an
    /// [`AbortGroup`](ToWorker::AbortGroup) order for it (or a later group) fires `handle` as
    /// it arrives, while the rank may be blocked inside the group.
    pub(crate) fn arm_abort(&self, generation: u64, handle: AbortHandle) {
        match &self.flavor {
            RankFlavor::Local(l) => l.arm_abort(generation, handle),
            RankFlavor::Net(n) => n.arm_abort(generation, handle),
        }
    }
}

/// How long a side of a link stays quiet before it says it is alive: a quarter of the
/// deadline the other side judges it by, at most a second.
pub(crate) fn heartbeat(deadline: Duration) -> Duration {
    (deadline / 4).min(Duration::from_secs(1))
}

//! The link between the coordinator and the ranks: the only way they talk.
//!
//! The runtime's logic sees two narrow ends, [`CoordinatorLink`] and [`RankLink`], that carry
//! the plain-data [`wire`] messages with a deadline on every wait and a clear [`LinkError::Gone`]
//! when the other end is gone. What reaches the coordinator arrives in one inbox as [`Inbound`]
//! events, in order per rank: a rank's messages, then its `Gone` once its end is dropped. The
//! in-process link ([`local`]) is a pair of bounded flume queues per rank; the network link
//! ([`net`]) carries the same messages as [`frame`]s over a connection per rank and delivers
//! into the same inbox; [`route`] sends each rank's orders through whichever of the two
//! reaches it (a controller's own rank stays in-process).
//!
//! **Architecture Invariant:** nothing crosses a link but [`wire`] messages; the one
//! process-local act, aborting a rank's collective group while the rank is blocked inside it, is
//! the link's own response to [`wire::ToWorker::AbortGroup`] (the rank arms it with
//! [`RankLink::arm_abort`]).

use std::time::Duration;

use flodl_nccl::AbortHandle;

pub(crate) mod failure;
pub(crate) mod frame;
#[doc(hidden)]
pub mod fuzz;
pub(crate) mod local;
pub(crate) mod net;
pub(crate) mod route;
pub(crate) mod samples;
pub(crate) mod text;
pub(crate) mod wire;

use wire::{ToCoordinator, ToWorker};

/// Why a link operation did not go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LinkError {
    /// The other end is gone: its thread or process ended, or its connection closed.
    #[error("the peer is gone")]
    Gone,
    /// Nothing arrived, or there was no room, within the deadline.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// No room right now (from `try_send`).
    #[error("the queue is full")]
    Full,
}

/// What arrives in the coordinator's inbox: a rank's message or the end of its link, stamped
/// with the rank of the link it came through (not the rank the message claims), or an event
/// of the coordinator's own process (`L`).
#[derive(Debug)]
pub(crate) enum Inbound<L> {
    /// A message from `rank`.
    Wire {
        /// The rank at the other end of the link.
        rank: usize,
        /// What it sent.
        msg: ToCoordinator,
    },
    /// `rank`'s end of the link is gone; nothing more comes from it.
    Gone {
        /// The rank whose link ended.
        rank: usize,
    },
    /// `rank`, whose link was gone, connected again (a restarted rank process): its new
    /// connection, for [`CoordinatorLink::attach`]. What follows from `rank` comes through it.
    Joined {
        /// The rank that joined again.
        rank: usize,
        /// Its new connection.
        frames: net::Attached,
    },
    /// An event from within the coordinator's process.
    Local(L),
}

/// The coordinator's end of the link: one send queue per rank.
pub(crate) trait CoordinatorLink: Send {
    /// Sends `msg` to `rank`, waiting at most `wait` for room.
    ///
    /// # Errors
    /// [`LinkError::Gone`] when the rank's end is gone, [`LinkError::Timeout`] when there was
    /// no room in time.
    fn send(&self, rank: usize, msg: ToWorker, wait: Duration) -> Result<(), LinkError>;

    /// Sends `msg` to `rank` only if there is room now.
    ///
    /// # Errors
    /// [`LinkError::Gone`], or [`LinkError::Full`] (the message is dropped).
    fn try_send(&self, rank: usize, msg: ToWorker) -> Result<(), LinkError>;

    /// Reaches `rank` through `frames` from now on (a rank that joined again), closing its
    /// old connection; false when `rank` is not reached over connections.
    fn attach(&self, _rank: usize, _frames: std::sync::Arc<dyn net::Frames>) -> bool {
        false
    }
}

/// A rank's end of the link.
pub(crate) trait RankLink: Send {
    /// Sends `msg` to the coordinator, waiting at most `wait` for room.
    ///
    /// # Errors
    /// [`LinkError::Gone`] or [`LinkError::Timeout`].
    fn send(&self, msg: ToCoordinator, wait: Duration) -> Result<(), LinkError>;

    /// The next message, waiting at most `wait`.
    ///
    /// # Errors
    /// [`LinkError::Timeout`] when nothing came, [`LinkError::Gone`] when the coordinator's end
    /// is gone and nothing is left to read.
    fn recv(&self, wait: Duration) -> Result<ToWorker, LinkError>;

    /// The next message if one is waiting.
    ///
    /// # Errors
    /// [`LinkError::Gone`] when the coordinator's end is gone and nothing is left to read.
    fn try_recv(&self) -> Result<Option<ToWorker>, LinkError>;

    /// Arms the abort of the rank's collective group number `generation`: an
    /// [`AbortGroup`](ToWorker::AbortGroup) order for it (or a later group) fires `handle` as
    /// it arrives, while the rank may be blocked inside the group.
    fn arm_abort(&self, generation: u64, handle: AbortHandle);
}

/// How long a side of a link stays quiet before it says it is alive: a quarter of the
/// deadline the other side judges it by, at most a second.
pub(crate) fn heartbeat(deadline: Duration) -> Duration {
    (deadline / 4).min(Duration::from_secs(1))
}

//! What arrives in the coordinator's inbox.

use super::frames::Attached;
use super::wire::ToCoordinator;

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
    /// connection, for [`super::CoordinatorLink::attach`]. What follows from `rank` comes through it.
    Joined {
        /// The rank that joined again.
        rank: usize,
        /// Its new connection.
        frames: Attached,
    },
    /// An event from within the coordinator's process.
    Local(L),
}

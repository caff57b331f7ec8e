//! The link's two ends as the runtime sees them: the coordinator's and a rank's, and how
//! often a quiet end says it is alive.

use std::sync::Arc;
use std::time::Duration;

use flodl_nccl::AbortHandle;

use super::frames::Frames;
use super::link_error::LinkError;
use super::wire::{ToCoordinator, ToWorker};

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
    fn attach(&self, _rank: usize, _frames: Arc<dyn Frames>) -> bool {
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

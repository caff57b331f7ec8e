//! A change of who is in the run: what the engine's roster emits when a seat enters or leaves
//! the live set, and what every book that keeps membership (the dispatcher, ElChe, ...) applies.

use std::time::Instant;

/// One seat entering or leaving the run's live set, with what the books need to follow it.
///
/// Only the roster makes one, and only when the live set changes: a seat's other moves (a
/// process claiming a dead seat, building its replica, going away again) change no book.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// No process took `rank`'s seat at the start (a cluster run started on a quorum): it is
    /// out of the run from the first window, without having died.
    Vacated {
        /// The seat left empty.
        rank: usize,
        /// When the run started without it.
        at: Instant,
    },
    /// `rank` was declared dead at `at`. The reduce in progress already holds `held` of its
    /// steps (its collective returned, or its snapshot is being averaged): those count as done.
    Died {
        /// The rank declared dead.
        rank: usize,
        /// When it was declared dead.
        at: Instant,
        /// Its steps the reduce in progress holds.
        held: usize,
    },
    /// `rank`, a process that joined the run again, was admitted: it takes part from now on.
    Joined {
        /// The rank admitted again.
        rank: usize,
    },
}

impl Change {
    /// The seat the change is about.
    pub(crate) fn rank(&self) -> usize {
        match *self {
            Change::Vacated { rank, .. } | Change::Died { rank, .. } | Change::Joined { rank } => {
                rank
            }
        }
    }
}

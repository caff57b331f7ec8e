//! Fault tolerance: why a rank died, the flags that tell the run's handle, and a rank's side
//! of its collective group.
//!
//! The coordinator is the one authority on membership. A rank is declared dead when its replica
//! (or its runtime) returns an error or panics, when its link is gone, when it has been silent past the watchdog
//! deadline while not inside a collective, when a reduce it never entered has been pending
//! past that deadline, or when it is still inside a reduce its peers gave up on (their
//! collectives fail after the deadline). On a death the roster (`roster.rs`) emits the change
//! every book follows (dispatch and ElChe retire the rank), and the coordinator
//! orders the collective group aborted and tells the
//! survivors the new membership (`ToWorker::Regroup`); each survivor then builds its new
//! communicator and redoes an interrupted reduce from its pre-reduce state. The host backend's
//! rounds simply stop waiting for the dead rank (a rank that misses its snapshot deadline on
//! every retry is declared dead too).
//!
//! Membership grows back on the host backend: a dead rank's id may be claimed again by a new
//! process (a restarted one: `fdl launch --max-restarts`), which joins at the end of the next
//! reduce from its consensus ([`RejoinEvent`]; the states a rank's seat goes through are
//! `roster::Standing`). A rank id is one seat: a second live process claiming it is refused by
//! the controller (`NetError::RankTaken` on its side), and the world never grows.
//!
//! Known limit (NCCL, not exercised without GPUs): NCCL collectives are not all-or-nothing
//! across ranks, so a group aborted at the very end of a reduce could leave some survivors
//! finished and others not; the redo assumes they all failed, as host collectives guarantee.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Why a rank was declared dead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum FaultCause {
    /// The rank's replica or runtime returned an error.
    Failed {
        /// The error, as text.
        error: String,
    },
    /// The rank's thread panicked.
    Panicked {
        /// The panic message.
        message: String,
    },
    /// The rank's end of the link went away without a word (its thread or process ended).
    Gone,
    /// Nothing was heard from the rank for this long while it was not inside a collective.
    Silent {
        /// How long it had been silent.
        after: Duration,
    },
    /// A reduce was pending this long and the rank never entered it (the watchdog).
    MissedReduce {
        /// The reduce's round.
        round: u64,
        /// How long the reduce had been pending.
        after: Duration,
    },
    /// The rank entered a reduce and never came out of it, while its peers' collectives failed
    /// (they timed out waiting for it) this long ago.
    StuckInReduce {
        /// The reduce's round.
        round: u64,
        /// How long the rank had been inside.
        after: Duration,
    },
    /// The rank sent what no honest rank sends (see [`Misconduct`]): it is evicted, the run
    /// goes on with the others.
    Misconduct {
        /// What it sent.
        misconduct: Misconduct,
    },
}

/// What a rank sent that the controller refused, evicting it: the controller believes nothing
/// a rank reports without checking it against what it knows (what it handed out, what it
/// asked, the replica's shapes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Misconduct {
    /// A starting state from a rank other than rank 0 (whose replica is the start).
    StartState,
    /// More steps than the batches the dispatcher handed the rank.
    StepsBeyondDispatch {
        /// Steps the rank claimed in all, this report included.
        claimed: u64,
        /// Batches it was handed in all.
        handed: u64,
    },
    /// A report of a chunk it does not hold, or of more work than the chunk holds.
    ForgedWork {
        /// What was wrong, in words.
        detail: String,
    },
    /// A state whose tensors are not the replica's shapes.
    Misshaped {
        /// What was sent (a snapshot, a final state...).
        what: String,
        /// What was wrong, in words.
        detail: String,
    },
    /// A state or a measure holding a value that is not finite.
    NonFinite {
        /// What was sent, and where in it.
        what: String,
        /// The value (NaN, inf, -inf).
        value: String,
    },
    /// An answer to a question the controller did not ask it (an evaluation, a group id).
    Unsolicited {
        /// What was sent.
        what: String,
    },
    /// A snapshot for a round that was already collected or is not open.
    Replayed {
        /// The round it named.
        round: u64,
        /// The attempt it named.
        attempt: u32,
    },
    /// A snapshot without its checkpoint part, for a round that captures one: the bundle
    /// would miss the rank's place in its chunk (its samples trained again after a resume).
    PartMissing {
        /// The round whose checkpoint asked for it.
        round: u64,
    },
    /// More control frames than the rate limit allows.
    Flooded {
        /// The frames allowed in a burst.
        burst: u32,
        /// The frames allowed per second afterwards.
        per_second: u32,
    },
}

impl std::fmt::Display for Misconduct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Misconduct::StartState => write!(f, "sent a starting state, which only rank 0 sends"),
            Misconduct::StepsBeyondDispatch { claimed, handed } => {
                write!(f, "claimed {claimed} steps in all, but was handed {handed} batches")
            }
            Misconduct::ForgedWork { detail } => write!(f, "reported forged work: {detail}"),
            Misconduct::Misshaped { what, detail } => {
                write!(f, "sent a mis-shaped {what}: {detail}")
            }
            Misconduct::NonFinite { what, value } => write!(f, "sent {value} in its {what}"),
            Misconduct::Unsolicited { what } => write!(f, "sent {what} it was not asked for"),
            Misconduct::Replayed { round, attempt } => {
                write!(
                    f,
                    "sent a snapshot for round {round} attempt {attempt}, which is not open (a replay)"
                )
            }
            Misconduct::PartMissing { round } => {
                write!(f, "sent its snapshot for round {round} without the checkpoint part asked")
            }
            Misconduct::Flooded { burst, per_second } => write!(
                f,
                "sent control frames past the limit ({burst} in a burst, {per_second} per second)"
            ),
        }
    }
}

impl std::fmt::Display for FaultCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultCause::Failed { error } => write!(f, "failed: {error}"),
            FaultCause::Panicked { message } => write!(f, "panicked: {message}"),
            FaultCause::Gone => write!(f, "its link closed"),
            FaultCause::Silent { after } => write!(f, "silent for {after:?}"),
            FaultCause::MissedReduce { round, after } => {
                write!(f, "never entered reduce {round}, pending for {after:?}")
            }
            FaultCause::StuckInReduce { round, after } => {
                write!(f, "stuck inside reduce {round} for {after:?} after its peers gave up")
            }
            FaultCause::Misconduct { misconduct } => write!(f, "evicted: it {misconduct}"),
        }
    }
}

/// A rank's death, as reported while the run goes on.
///
/// Recovery time is the `at_ms` of the first [`ReduceEvent`](crate::ReduceEvent) after the
/// death minus this event's `at_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultEvent {
    /// The rank that died.
    pub rank: usize,
    /// Milliseconds since the run started, when the coordinator declared the death.
    pub at_ms: f64,
    /// Why it was declared dead.
    pub cause: FaultCause,
    /// The ranks still alive afterwards, in order.
    pub survivors: Vec<usize>,
    /// Samples of its chunks that the consensus did not hold, handed back to the living: an
    /// upper bound on the samples trained twice because of this death (the rank may not have
    /// reached all of them).
    #[serde(default)]
    pub requeued_samples: usize,
}

/// A rank process that joined the run again after its rank's death (restarted, or a new process
/// for that rank), as reported while the run goes on: it was admitted at the end of a reduce,
/// starting from that reduce's consensus with a fresh optimizer, a fresh ElChe estimate and
/// work from the dispatcher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RejoinEvent {
    /// The rank that joined again.
    pub rank: usize,
    /// Milliseconds since the run started, when it was admitted.
    pub at_ms: f64,
    /// Reduces completed when it was admitted: it starts from the consensus of this one.
    pub reduce: u64,
    /// The ranks alive afterwards, in order.
    pub members: Vec<usize>,
}

/// A rank's thread, and a channel that disconnects when the thread ends (so the run's handle
/// can wait for it with a deadline, and leave behind one stuck in its replica).
#[derive(Debug)]
pub(crate) struct RankThread {
    /// The rank it runs.
    pub(crate) rank: usize,
    /// The thread.
    pub(crate) handle: std::thread::JoinHandle<()>,
    /// Disconnects when the thread ends (nothing is ever sent).
    pub(crate) ended: flume::Receiver<()>,
}

/// Which ranks have been declared dead, shared with the run's handle (so `join` does not wait
/// for a dead rank's thread).
#[derive(Debug, Clone)]
pub(crate) struct DeadFlags(Arc<[AtomicBool]>);

impl DeadFlags {
    /// Flags for `world` ranks, all alive.
    pub(crate) fn new(world: usize) -> DeadFlags {
        DeadFlags((0..world).map(|_| AtomicBool::new(false)).collect())
    }

    /// Whether `rank` has been declared dead.
    pub(crate) fn is_dead(&self, rank: usize) -> bool {
        self.0.get(rank).is_some_and(|f| f.load(Ordering::Acquire))
    }

    pub(crate) fn mark(&self, rank: usize) {
        if let Some(f) = self.0.get(rank) {
            f.store(true, Ordering::Release);
        }
    }

    /// `rank` takes part again (it joined again after its death).
    pub(crate) fn revive(&self, rank: usize) {
        if let Some(f) = self.0.get(rank) {
            f.store(false, Ordering::Release);
        }
    }
}

/// Whether a collective error means the group broke (a peer died, the group was aborted or
/// timed out) rather than a misuse: the rank then waits for the coordinator's new membership
/// instead of failing.
pub(crate) fn is_group_fault(error: &crate::Error) -> bool {
    matches!(
        error,
        crate::Error::Collective(
            flodl_nccl::Error::Aborted
                | flodl_nccl::Error::PeerLost { .. }
                | flodl_nccl::Error::TimedOut { .. }
                | flodl_nccl::Error::Nccl { .. }
        )
    )
}

/// A reduce a rank could not finish because its group broke: redone after the regroup.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Interrupted {
    /// The window to start after the reduce.
    pub(crate) next: crate::link::wire::Window,
    /// The evaluation to run after it, if any.
    pub(crate) eval: Option<usize>,
    /// The cohort step the next window starts at.
    pub(crate) global_step: u64,
    /// The checkpoint part to capture after it, if one is asked for.
    pub(crate) capture: Option<crate::link::wire::CaptureRequest>,
}

/// A rank's collective group: the global ranks in it and its number.
#[derive(Debug)]
pub(crate) struct Group {
    /// Global ranks of the group, increasing (this rank's group rank is its position).
    pub(crate) members: Vec<usize>,
    /// The group's number.
    pub(crate) generation: u64,
}

impl Group {
    /// The group built at start, of `world` ranks.
    pub(crate) fn new(world: usize) -> Group {
        Group { members: (0..world).collect(), generation: 0 }
    }

    /// The positions in this group of `members` (global ranks), or `None` when one is not in
    /// it.
    pub(crate) fn positions(&self, members: &[usize]) -> Option<Vec<usize>> {
        members.iter().map(|m| self.members.iter().position(|x| x == m)).collect()
    }
}

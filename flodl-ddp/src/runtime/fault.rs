//! Fault tolerance: which ranks are alive (the coordinator decides), why a rank died, and the
//! abort handles of the collective groups in use.
//!
//! The coordinator is the one authority on membership. A rank is declared dead when its replica
//! (or its runtime) returns an error or panics, when it has been silent past the watchdog
//! deadline while not inside a collective, when a reduce it never entered has been pending
//! past that deadline, or when it is still inside a reduce its peers gave up on (their
//! collectives fail after the deadline). Membership only shrinks. On a death the coordinator
//! aborts the collective group, retires the rank from dispatch and ElChe, and tells the
//! survivors the new membership (`ToWorker::Regroup`); each survivor then builds its new
//! communicator and redoes an interrupted reduce from its pre-reduce state. The host backend's
//! rounds simply stop waiting for the dead rank (a rank that misses its snapshot deadline on
//! every retry is declared dead too).
//!
//! Known limit (NCCL, not exercised without GPUs): NCCL collectives are not all-or-nothing
//! across ranks, so a group aborted at the very end of a reduce could leave some survivors
//! finished and others not; the redo assumes they all failed, as host collectives guarantee.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flodl_nccl::AbortHandle;
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
}

impl std::fmt::Display for FaultCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultCause::Failed { error } => write!(f, "failed: {error}"),
            FaultCause::Panicked { message } => write!(f, "panicked: {message}"),
            FaultCause::Silent { after } => write!(f, "silent for {after:?}"),
            FaultCause::MissedReduce { round, after } => {
                write!(f, "never entered reduce {round}, pending for {after:?}")
            }
            FaultCause::StuckInReduce { round, after } => {
                write!(f, "stuck inside reduce {round} for {after:?} after its peers gave up")
            }
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
}

/// The abort handles of the collective groups in use, one slot per rank (the latest group each
/// rank joined), shared by the coordinator and the run's handle.
#[derive(Debug, Clone, Default)]
pub(crate) struct Aborts(Arc<Mutex<Vec<Option<AbortHandle>>>>);

impl Aborts {
    /// A set holding the given handles, rank by rank.
    pub(crate) fn new(handles: Vec<Option<AbortHandle>>) -> Aborts {
        Aborts(Arc::new(Mutex::new(handles)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<AbortHandle>>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the handle of the group `rank` has just joined.
    pub(crate) fn set(&self, rank: usize, handle: AbortHandle) {
        let mut handles = self.lock();
        if handles.len() <= rank {
            handles.resize(rank + 1, None);
        }
        handles[rank] = Some(handle);
    }

    /// Aborts every group in the set (idempotent).
    pub(crate) fn abort_all(&self) {
        let handles: Vec<AbortHandle> = self.lock().iter().flatten().cloned().collect();
        for h in handles {
            h.abort();
        }
    }
}

/// A rank's thread, and a channel that disconnects when the thread ends (so the run's handle
/// can wait for it with a deadline, and leave behind one stuck in its replica).
#[derive(Debug)]
pub(crate) struct RankThread {
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

    fn mark(&self, rank: usize) {
        if let Some(f) = self.0.get(rank) {
            f.store(true, Ordering::Release);
        }
    }
}

/// The coordinator's book of membership.
#[derive(Debug)]
pub(crate) struct Roster {
    live: Vec<bool>,
    dead: DeadFlags,
    /// The number of the current collective group (0: the group built at start).
    generation: u64,
    /// When each rank said it entered the pending reduce's collective (cleared when it
    /// reports the outcome).
    entered: Vec<Option<Instant>>,
    /// Ranks that reported the pending reduce's collective as failed since the last regroup.
    failed: Vec<bool>,
    /// When the first of them did.
    first_failure: Option<Instant>,
    /// Attempts of the pending reduce that failed with nobody dead.
    futile: usize,
    /// The rank asked for the pending evaluation, if any.
    evaluator: Option<usize>,
    /// Since when the pending collective reduce (its current attempt) has waited.
    pending_since: Option<Instant>,
    /// Whether the collective groups are NCCL groups (rebuilt from a new id; not shrunk to
    /// one rank).
    pub(crate) nccl: bool,
}

impl Roster {
    /// Every rank of `world` alive, reporting deaths into `dead`.
    pub(crate) fn new(world: usize, dead: DeadFlags) -> Roster {
        Roster {
            live: vec![true; world],
            dead,
            generation: 0,
            entered: vec![None; world],
            failed: vec![false; world],
            first_failure: None,
            futile: 0,
            evaluator: None,
            pending_since: None,
            nccl: false,
        }
    }

    /// Whether `rank` is alive.
    pub(crate) fn is_live(&self, rank: usize) -> bool {
        self.live.get(rank).copied().unwrap_or(false)
    }

    /// The live ranks, in order.
    pub(crate) fn live_ranks(&self) -> Vec<usize> {
        (0..self.live.len()).filter(|&r| self.live[r]).collect()
    }

    /// The lowest live rank (the one that evaluates and returns the final state).
    pub(crate) fn lowest(&self) -> Option<usize> {
        self.live.iter().position(|&l| l)
    }

    /// Ranks declared dead so far.
    pub(crate) fn deaths(&self) -> usize {
        self.live.iter().filter(|&&l| !l).count()
    }

    /// Marks `rank` dead; false when it already was (or is no rank).
    pub(crate) fn bury(&mut self, rank: usize) -> bool {
        match self.live.get_mut(rank) {
            Some(l) if *l => {
                *l = false;
                self.dead.mark(rank);
                self.entered[rank] = None;
                self.failed[rank] = false;
                true
            }
            _ => false,
        }
    }

    /// Starts a new collective group generation; returns its number. A pending reduce's
    /// attempt restarts with it.
    pub(crate) fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.failed.iter_mut().for_each(|f| *f = false);
        self.first_failure = None;
        if self.pending_since.is_some() {
            self.pending_since = Some(Instant::now());
        }
        self.generation
    }

    /// The current collective group's number.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// A collective reduce was called now.
    pub(crate) fn reduce_called(&mut self) {
        self.pending_since = Some(Instant::now());
    }

    /// How long the pending collective reduce's current attempt has waited.
    pub(crate) fn reduce_pending_for(&self) -> Option<Duration> {
        self.pending_since.map(|t| t.elapsed())
    }

    /// Records that `rank` entered the pending reduce's collective.
    pub(crate) fn entered(&mut self, rank: usize) {
        if let Some(e) = self.entered.get_mut(rank) {
            *e = Some(Instant::now());
        }
    }

    /// Records that `rank` left the collective of group `generation`: it finished the reduce
    /// (`failed` false) or its collective failed (counted only for the current group).
    pub(crate) fn left(&mut self, rank: usize, generation: u64, failed: bool) {
        if let Some(e) = self.entered.get_mut(rank) {
            *e = None;
        }
        if let Some(f) = self.failed.get_mut(rank) {
            *f = failed && generation == self.generation;
            if *f && self.first_failure.is_none() {
                self.first_failure = Some(Instant::now());
            }
        }
    }

    /// How long ago the first rank reported the current attempt of the pending reduce as
    /// failed, if one did.
    pub(crate) fn failing_for(&self) -> Option<Duration> {
        self.first_failure.map(|t| t.elapsed())
    }

    /// Whether `rank` reported the current attempt of the pending reduce as failed.
    pub(crate) fn has_failed(&self, rank: usize) -> bool {
        self.failed.get(rank).copied().unwrap_or(false)
    }

    /// Whether `rank` is inside a collective, and since when.
    pub(crate) fn in_collective(&self, rank: usize) -> Option<Instant> {
        self.entered.get(rank).copied().flatten()
    }

    /// Whether every live rank reported the pending reduce's collective as failed (nobody is
    /// left inside it, nobody finished it).
    pub(crate) fn all_failed(&self) -> bool {
        self.live_ranks().into_iter().all(|r| self.failed[r])
    }

    /// Counts a reduce attempt that failed with nobody dead; returns the count so far.
    pub(crate) fn futile_attempt(&mut self) -> usize {
        self.futile += 1;
        self.futile
    }

    /// The pending reduce completed: clears the collective bookkeeping.
    pub(crate) fn reduce_done(&mut self) {
        self.futile = 0;
        self.pending_since = None;
        self.first_failure = None;
        self.entered.iter_mut().for_each(|e| *e = None);
        self.failed.iter_mut().for_each(|f| *f = false);
    }

    /// Records which rank was asked for an evaluation (`None`: nobody is being asked).
    pub(crate) fn set_evaluator(&mut self, rank: Option<usize>) {
        self.evaluator = rank;
    }

    /// The rank evaluating now, if any.
    pub(crate) fn evaluator(&self) -> Option<usize> {
        self.evaluator
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
    pub(crate) capture: Option<crate::runtime::capture::CaptureRequest>,
}

/// A rank's side of membership: the global ranks of its current collective group, and the
/// reduce its group's fault interrupted.
#[derive(Debug)]
pub(crate) struct Standing {
    /// Global ranks of the current group, increasing (this rank's group rank is its position).
    pub(crate) members: Vec<usize>,
    /// The current group's number.
    pub(crate) generation: u64,
    /// The interrupted reduce, if any (the rank trains no further until it is redone).
    pub(crate) interrupted: Option<Interrupted>,
}

impl Standing {
    /// The standing of a rank in the group built at start, of `world` ranks.
    pub(crate) fn new(world: usize) -> Standing {
        Standing { members: (0..world).collect(), generation: 0, interrupted: None }
    }

    /// The positions in the current group of `members` (global ranks), or `None` when one is
    /// not in the current group.
    pub(crate) fn positions(&self, members: &[usize]) -> Option<Vec<usize>> {
        members.iter().map(|m| self.members.iter().position(|x| x == m)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    /// Random deaths: the roster's live ranks, lowest rank and death count follow a plain
    /// vector of flags, the shared flags agree, a rank dies once; a collective failure counts
    /// only in the generation it happened in, and "all failed" means every live rank failed.
    #[test]
    fn roster_follows_deaths_and_generations() -> Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
        for case in 0..300 {
            let world = rng.random_range(1..8);
            let flags = DeadFlags::new(world);
            let mut roster = Roster::new(world, flags.clone());
            let mut alive = vec![true; world];
            for _ in 0..20 {
                let rank = rng.random_range(0..world + 1);
                let was = alive.get(rank).copied().unwrap_or(false);
                if roster.bury(rank) != was {
                    return Err(format!("case {case}: bury({rank}) when alive = {was}"));
                }
                if let Some(a) = alive.get_mut(rank) {
                    *a = false;
                }
                let live: Vec<usize> = (0..world).filter(|&r| alive[r]).collect();
                if roster.live_ranks() != live
                    || roster.lowest() != live.first().copied()
                    || roster.deaths() != world - live.len()
                    || (0..world).any(|r| flags.is_dead(r) == alive[r])
                {
                    return Err(format!("case {case}: roster out of step with {alive:?}"));
                }
                let generation = roster.generation();
                let stale = generation.wrapping_sub(1);
                for &r in &live {
                    // A failure reported for an older group does not count.
                    roster.left(r, stale, true);
                }
                if !live.is_empty() && roster.all_failed() {
                    return Err(format!("case {case}: stale failures counted"));
                }
                for &r in &live {
                    roster.left(r, generation, true);
                }
                if !roster.all_failed() || roster.failing_for().is_none() && !live.is_empty() {
                    return Err(format!("case {case}: current failures not counted"));
                }
                roster.next_generation();
                if live.iter().any(|&r| roster.has_failed(r)) || roster.failing_for().is_some() {
                    return Err(format!("case {case}: a new group starts with failures"));
                }
            }
        }
        Ok(())
    }
}

//! What the coordinator knows about each rank — one slot per rank — and about the collective
//! group they form.

use std::time::{Duration, Instant};

use crate::link::wire::{Readiness, Window};
use crate::runtime::engine::fault::DeadFlags;

/// Batches a rank's measured pace spans (without ElChe) before older ones weigh half.
const PACE_BATCHES: usize = 512;

/// Whether a rank takes part in the run: a rank's seat goes `Starting → Alive → Dead`, and on
/// the host backend back from `Dead` through `Rejoining → Waiting → Alive` when a new process
/// claims it (a `Rejoining` or `Waiting` seat whose connection ends is `Dead` again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Building its replica, not yet reported ready.
    Starting,
    /// Ready and taking part.
    Alive,
    /// Declared dead by the coordinator; later words from it change nothing.
    Dead,
    /// A new process claimed the dead rank's seat: it builds its replica.
    Rejoining,
    /// Its replica is built: it is admitted at the end of the next reduce, from its consensus.
    Waiting,
    /// No process has taken this seat yet (a cluster run started on a quorum); one that does
    /// goes `Rejoining → Waiting → Alive`.
    Vacant,
}

/// Where a rank is with respect to the pending collective reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InCollective {
    /// Not inside a collective.
    Outside,
    /// Inside the pending reduce's collective (or forming a group) since then.
    Inside(Instant),
    /// Its collective of the current group failed; it waits for a regroup.
    Failed,
}

/// A rank's readiness for the reduce of the current window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ready {
    /// Steps trained in the window.
    pub(crate) steps: usize,
    /// Their compute time, ms.
    pub(crate) wall_ms: f64,
    /// Why it said it is ready.
    pub(crate) why: Readiness,
}

/// A rank's compute pace over its recent windows: a pace one preempted batch does not swing.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Pace {
    ms: f64,
    batches: usize,
}

impl Pace {
    /// Adds a window of `batches` taking `ms`; past [`PACE_BATCHES`] older windows weigh half.
    pub(crate) fn add(&mut self, ms: f64, batches: usize) {
        self.ms += ms;
        self.batches += batches;
        if self.batches > PACE_BATCHES {
            self.ms /= 2.0;
            self.batches /= 2;
        }
    }

    /// Milliseconds per batch (0 before any batch).
    pub(crate) fn ms_per_batch(&self) -> f64 {
        if self.batches > 0 { self.ms / self.batches as f64 } else { 0.0 }
    }
}

/// What the coordinator knows about one rank.
#[derive(Debug, Clone)]
pub(crate) struct RankSlot {
    pub(crate) standing: Standing,
    /// Chunks sent and not yet reported done.
    pub(crate) in_flight: usize,
    /// Chunks sent so far.
    pub(crate) works_sent: u64,
    /// Its readiness for the current window's reduce.
    pub(crate) ready: Option<Ready>,
    pub(crate) pace: Pace,
    /// The window it trains now.
    pub(crate) window: Window,
    /// When it was last heard from, and last sent anything.
    pub(crate) heard: Instant,
    pub(crate) sent: Instant,
    pub(crate) collective: InCollective,
}

impl RankSlot {
    fn new(window: Window) -> RankSlot {
        let now = Instant::now();
        RankSlot {
            standing: Standing::Starting,
            in_flight: 0,
            works_sent: 0,
            ready: None,
            pace: Pace::default(),
            window,
            heard: now,
            sent: now,
            collective: InCollective::Outside,
        }
    }
}

/// Every rank's slot, and the flags that tell the run's handle which ranks died.
#[derive(Debug)]
pub(crate) struct Slots {
    slots: Vec<RankSlot>,
    dead: DeadFlags,
}

impl Slots {
    /// One starting slot per rank, each in its `windows` entry; deaths are reported into `dead`.
    pub(crate) fn new(windows: Vec<Window>, dead: DeadFlags) -> Slots {
        Slots { slots: windows.into_iter().map(RankSlot::new).collect(), dead }
    }

    /// Ranks in the run, dead ones included.
    pub(crate) fn world(&self) -> usize {
        self.slots.len()
    }

    /// `rank`'s slot.
    pub(crate) fn get(&self, rank: usize) -> Option<&RankSlot> {
        self.slots.get(rank)
    }

    /// `rank`'s slot, to change.
    pub(crate) fn get_mut(&mut self, rank: usize) -> Option<&mut RankSlot> {
        self.slots.get_mut(rank)
    }

    /// Every slot, in rank order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &RankSlot> {
        self.slots.iter()
    }

    /// Every slot, to change.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut RankSlot> {
        self.slots.iter_mut()
    }

    /// Whether `rank` takes part (starting or alive: not dead, not yet admitted again).
    pub(crate) fn is_live(&self, rank: usize) -> bool {
        self.slots
            .get(rank)
            .is_some_and(|s| matches!(s.standing, Standing::Starting | Standing::Alive))
    }

    /// `rank`'s standing.
    pub(crate) fn standing(&self, rank: usize) -> Option<Standing> {
        self.slots.get(rank).map(|s| s.standing)
    }

    /// The ranks joining again (connected after their death, not yet admitted).
    pub(crate) fn joining(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&r| {
                self.slots
                    .get(r)
                    .is_some_and(|s| matches!(s.standing, Standing::Rejoining | Standing::Waiting))
            })
            .collect()
    }

    /// Moves `rank`'s seat to `standing` (a join again: `Rejoining`, `Waiting`, or `Dead`
    /// when the joining process went away); false for no rank.
    pub(crate) fn set_joining(&mut self, rank: usize, standing: Standing) -> bool {
        match self.slots.get_mut(rank) {
            Some(slot) => {
                slot.standing = standing;
                slot.heard = Instant::now();
                true
            }
            None => false,
        }
    }

    /// Admits `rank` again, alive in `window` with a fresh slot; false unless it was waiting.
    pub(crate) fn admit(&mut self, rank: usize, window: Window) -> bool {
        match self.slots.get_mut(rank) {
            Some(slot) if slot.standing == Standing::Waiting => {
                *slot = RankSlot { standing: Standing::Alive, ..RankSlot::new(window) };
                self.dead.revive(rank);
                true
            }
            _ => false,
        }
    }

    /// The ranks not declared dead, in order.
    pub(crate) fn live_ranks(&self) -> Vec<usize> {
        (0..self.slots.len()).filter(|&r| self.is_live(r)).collect()
    }

    /// The lowest live rank (the one that returns the final state).
    pub(crate) fn lowest(&self) -> Option<usize> {
        (0..self.slots.len()).find(|&r| self.is_live(r))
    }

    /// Ranks dead now (declared dead, and not admitted again).
    pub(crate) fn deaths(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| {
                matches!(s.standing, Standing::Dead | Standing::Rejoining | Standing::Waiting)
            })
            .count()
    }

    /// Declares `rank` dead; false when it was not live (or is no rank).
    pub(crate) fn bury(&mut self, rank: usize) -> bool {
        match self.slots.get_mut(rank) {
            Some(slot) if matches!(slot.standing, Standing::Starting | Standing::Alive) => {
                *slot = RankSlot { standing: Standing::Dead, ..RankSlot::new(slot.window) };
                self.dead.mark(rank);
                true
            }
            _ => false,
        }
    }

    /// Whether every live rank reported the pending reduce's collective as failed (nobody is
    /// left inside it, nobody finished it).
    pub(crate) fn all_failed(&self) -> bool {
        self.slots
            .iter()
            .filter(|s| matches!(s.standing, Standing::Starting | Standing::Alive))
            .all(|s| s.collective == InCollective::Failed)
    }
}

/// The collective group the live ranks form, and the pending reduce's attempts in it.
#[derive(Debug, Default)]
pub(crate) struct GroupBook {
    /// The group's number (0: the group built at start).
    pub(crate) generation: u64,
    /// Since when the pending collective reduce (its current attempt) has waited.
    pending_since: Option<Instant>,
    /// When the first rank reported the current attempt as failed.
    first_failure: Option<Instant>,
    /// Attempts of the pending reduce that failed with nobody dead.
    futile: usize,
    /// What the groups are made of, which decides how they survive a death.
    pub(crate) engine: Engine,
    /// Whether each group's id is made by its lowest member and relayed by the coordinator
    /// (NCCL ranks in several processes).
    pub(crate) relay: bool,
}

/// The engine of a run's collective groups.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// The in-process host collective: shrunk to the survivors.
    #[default]
    Host,
    /// NCCL: rebuilt from a new id; never shrunk to one rank.
    Nccl,
    /// MPI across processes: a world cannot shrink, so a death ends the run (the launcher
    /// restarts the job from the last bundle).
    Mpi,
}

impl GroupBook {
    /// Starts the next group; a pending reduce's attempt restarts with it. Clears the failures
    /// ranks reported in the old group.
    pub(crate) fn next_generation(&mut self, slots: &mut Slots) -> u64 {
        self.generation += 1;
        for slot in slots.iter_mut() {
            if slot.collective == InCollective::Failed {
                slot.collective = InCollective::Outside;
            }
        }
        self.first_failure = None;
        if self.pending_since.is_some() {
            self.pending_since = Some(Instant::now());
        }
        self.generation
    }

    /// A collective reduce was called now.
    pub(crate) fn reduce_called(&mut self) {
        self.pending_since = Some(Instant::now());
    }

    /// How long the pending collective reduce's current attempt has waited.
    pub(crate) fn pending_for(&self) -> Option<Duration> {
        self.pending_since.map(|t| t.elapsed())
    }

    /// Records that `rank` left the collective of group `generation`: it finished the reduce
    /// (`failed` false) or its collective failed (counted only for the current group).
    pub(crate) fn left(&mut self, slots: &mut Slots, rank: usize, generation: u64, failed: bool) {
        let Some(slot) = slots.get_mut(rank) else { return };
        slot.collective = if failed && generation == self.generation {
            self.first_failure.get_or_insert_with(Instant::now);
            InCollective::Failed
        } else {
            InCollective::Outside
        };
    }

    /// How long ago the first rank reported the current attempt as failed, if one did.
    pub(crate) fn failing_for(&self) -> Option<Duration> {
        self.first_failure.map(|t| t.elapsed())
    }

    /// Counts a reduce attempt that failed with nobody dead; returns the count so far.
    pub(crate) fn futile_attempt(&mut self) -> usize {
        self.futile += 1;
        self.futile
    }

    /// The pending reduce completed: clears the collective bookkeeping.
    pub(crate) fn reduce_done(&mut self, slots: &mut Slots) {
        self.futile = 0;
        self.pending_since = None;
        self.first_failure = None;
        for slot in slots.iter_mut() {
            slot.collective = InCollective::Outside;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    fn window() -> Window {
        Window { round: 1, target: 1, limit: 1, wall: None }
    }

    /// A seat's life, step by step: dead, a process joining (not live, pinged, counted dead),
    /// waiting, admitted (live again, its dead flag cleared); a joiner that goes away leaves the
    /// seat dead; a vacant seat is not a death; only a waiting seat can be admitted.
    #[test]
    fn a_seat_dies_and_is_taken_again() -> Result<(), String> {
        #[derive(Debug, Clone, Copy)]
        enum Step {
            Bury,
            Join(Standing),
            Admit(bool),
        }
        use Standing::*;
        /// A step on rank 1, then: live ranks, joining ranks, deaths, rank 1 flagged dead.
        type Case = (Step, &'static [usize], &'static [usize], usize, bool);
        let steps: [Case; 9] = [
            (Step::Admit(false), &[0, 1, 2], &[], 0, false),
            (Step::Bury, &[0, 2], &[], 1, true),
            (Step::Admit(false), &[0, 2], &[], 1, true),
            (Step::Join(Rejoining), &[0, 2], &[1], 1, true),
            (Step::Join(Dead), &[0, 2], &[], 1, true),
            (Step::Join(Rejoining), &[0, 2], &[1], 1, true),
            (Step::Join(Waiting), &[0, 2], &[1], 1, true),
            (Step::Admit(true), &[0, 1, 2], &[], 0, false),
            (Step::Join(Vacant), &[0, 2], &[], 0, false),
        ];
        let flags = DeadFlags::new(3);
        let mut slots = Slots::new(vec![window(); 3], flags.clone());
        for (i, (step, live, joining, deaths, flagged)) in steps.into_iter().enumerate() {
            match step {
                Step::Bury => {
                    slots.bury(1);
                }
                Step::Join(standing) => {
                    slots.set_joining(1, standing);
                }
                Step::Admit(expected) => {
                    if slots.admit(1, window()) != expected {
                        return Err(format!("step {i}: admit should be {expected}"));
                    }
                }
            }
            let got = (slots.live_ranks(), slots.joining(), slots.deaths(), flags.is_dead(1));
            if got != (live.to_vec(), joining.to_vec(), deaths, flagged) {
                return Err(format!("step {i} ({step:?}): got {got:?}"));
            }
        }
        Ok(())
    }

    /// Random deaths: the slots' live ranks, lowest rank and death count follow a plain vector
    /// of flags, the shared flags agree, a rank dies once; a collective failure counts only in
    /// the generation it happened in, and "all failed" means every live rank failed.
    #[test]
    fn slots_follow_deaths_and_generations() -> Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
        for case in 0..300 {
            let world = rng.random_range(1..8);
            let flags = DeadFlags::new(world);
            let mut slots = Slots::new(vec![window(); world], flags.clone());
            let mut group = GroupBook::default();
            let mut alive = vec![true; world];
            for _ in 0..20 {
                let rank = rng.random_range(0..world + 1);
                let was = alive.get(rank).copied().unwrap_or(false);
                if slots.bury(rank) != was {
                    return Err(format!("case {case}: bury({rank}) when alive = {was}"));
                }
                if let Some(a) = alive.get_mut(rank) {
                    *a = false;
                }
                let live: Vec<usize> = (0..world).filter(|&r| alive[r]).collect();
                if slots.live_ranks() != live
                    || slots.lowest() != live.first().copied()
                    || slots.deaths() != world - live.len()
                    || (0..world).any(|r| flags.is_dead(r) == alive[r])
                {
                    return Err(format!("case {case}: slots out of step with {alive:?}"));
                }
                let generation = group.generation;
                let stale = generation.wrapping_sub(1);
                for &r in &live {
                    // A failure reported for an older group does not count.
                    group.left(&mut slots, r, stale, true);
                }
                if !live.is_empty() && slots.all_failed() {
                    return Err(format!("case {case}: stale failures counted"));
                }
                for &r in &live {
                    group.left(&mut slots, r, generation, true);
                }
                if !slots.all_failed() || group.failing_for().is_none() && !live.is_empty() {
                    return Err(format!("case {case}: current failures not counted"));
                }
                group.next_generation(&mut slots);
                if live
                    .iter()
                    .any(|&r| slots.get(r).is_some_and(|s| s.collective == InCollective::Failed))
                    || group.failing_for().is_some()
                {
                    return Err(format!("case {case}: a new group starts with failures"));
                }
            }
        }
        Ok(())
    }
}

//! What the coordinator knows about each rank — one slot per rank — and about the collective
//! group they form. Who is in the run is the roster's (`roster.rs`); a slot follows its changes.

use std::time::{Duration, Instant};

use crate::control::change::Change;
use crate::control::deadline::{Deadline, DeadlineRule};
use crate::link::wire::{Readiness, Window};

/// Batches a rank's measured pace spans (without ElChe) before older ones weigh half.
const PACE_BATCHES: usize = 512;

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
    /// The median ms of the window's last steps, when measured.
    pub(crate) tail_ms: Option<f64>,
    /// What the reduce that opened the window cost the rank, ms, when one did.
    pub(crate) exposed_ms: Option<f64>,
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
    /// Its recent window times: how long it may stay silent ([`RankSlot::watch`]).
    pub(crate) windows: Deadline,
    /// When it was pinged for being late and not heard from since.
    probed: Option<Instant>,
}

/// What the coordinator's watch makes of a rank's silence at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watch {
    /// Heard from within its deadline.
    OnTime,
    /// Past its deadline for the first time since it was last heard: ping it.
    Late,
    /// Late and pinged; waiting for an answer a quarter of its deadline.
    Pinged,
    /// Late and its ping unanswered (a confirmed miss), or silent past the watchdog: dead.
    Dead(Duration),
}

impl RankSlot {
    fn new(window: Window) -> RankSlot {
        let now = Instant::now();
        RankSlot {
            in_flight: 0,
            works_sent: 0,
            ready: None,
            pace: Pace::default(),
            window,
            heard: now,
            sent: now,
            collective: InCollective::Outside,
            windows: Deadline::default(),
            probed: None,
        }
    }

    /// Judges the rank's silence at `now` against the deadline its own windows give (`cap`, the
    /// watchdog, until they are calibrated, or when `calibrated` is false because it does
    /// something other than train, such as evaluating): late at three quarters of it (pinged
    /// once), dead at the deadline when that ping, sent about a quarter of it before, went
    /// unanswered (a confirmed miss), or at once past `cap`.
    ///
    /// The watch is called every `look` at most, so a derived deadline is judged at the last
    /// look before it: a silence that will pass it before the next look is dead now, and the
    /// death is declared within the deadline, not up to a look after it. The watchdog is the
    /// user's number, a silence it never cuts short.
    pub(crate) fn watch(
        &mut self,
        rule: &DeadlineRule,
        cap: Duration,
        calibrated: bool,
        now: Instant,
        look: Duration,
    ) -> Watch {
        let silent = now.saturating_duration_since(self.heard);
        let limit = if calibrated { self.windows.silence(rule, cap) } else { cap };
        if self.probed.is_some_and(|p| p < self.heard) {
            self.probed = None;
        }
        let ahead = silent + look;
        if ahead <= limit.mul_f64(0.75) {
            return Watch::OnTime;
        }
        if silent > cap {
            return Watch::Dead(silent);
        }
        match self.probed {
            None => {
                self.probed = Some(now);
                Watch::Late
            }
            Some(p)
                if (if limit < cap { ahead } else { silent }) > limit
                    && now.saturating_duration_since(p) + look >= limit / 4 =>
            {
                Watch::Dead(silent)
            }
            Some(_) => Watch::Pinged,
        }
    }

    /// The deadline of its silence now (the watchdog `cap` until calibrated).
    pub(crate) fn deadline(&self, rule: &DeadlineRule, cap: Duration) -> Duration {
        self.windows.silence(rule, cap)
    }
}

/// Every rank's slot, in rank order.
#[derive(Debug)]
pub(crate) struct Slots {
    slots: Vec<RankSlot>,
}

impl Slots {
    /// One fresh slot per rank, each in its `windows` entry.
    pub(crate) fn new(windows: Vec<Window>) -> Slots {
        Slots { slots: windows.into_iter().map(RankSlot::new).collect() }
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

    /// Follows a change of the run's members: the seat's slot starts afresh in its window
    /// (nothing in flight, nothing ready, its pace unknown); the coordinator gives a rank
    /// joined again its window once ElChe has admitted it.
    pub(crate) fn apply(&mut self, change: &Change) {
        if let Some(slot) = self.slots.get_mut(change.rank()) {
            *slot = RankSlot::new(slot.window);
        }
    }

    /// Whether every rank of `live` reported the pending reduce's collective as failed
    /// (nobody is left inside it, nobody finished it).
    pub(crate) fn all_failed(&self, live: &[usize]) -> bool {
        live.iter().all(|&r| self.get(r).is_some_and(|s| s.collective == InCollective::Failed))
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
    use crate::runtime::engine::fault::DeadFlags;
    use crate::runtime::engine::roster::Roster;
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    fn window() -> Window {
        Window { round: 1, target: 1, limit: 1, wall: None }
    }

    /// The watch on a fake clock, per rank speed (a window of `ms`, ±30% jitter, with a
    /// message at most every step of a tenth of it): a rank that keeps talking is never
    /// judged late; a silent one is pinged once at three quarters of its deadline and declared
    /// dead at the deadline — within 3 of its windows or 2 s, whichever is longer — and a rank heard
    /// after its ping is on time again; the watchdog caps it all, and it is the deadline
    /// until 3 windows are seen, or while the rank does something other than train.
    #[test]
    fn the_watch_finds_silence_within_three_windows_and_never_a_talking_rank() -> Result<(), String>
    {
        let rule = DeadlineRule::default();
        let cap = Duration::from_secs(30);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(30);
        let t0 = Instant::now();
        // The watch is called every `tick` here: every `look`.
        let (tick, look) = (Duration::from_millis(10), Duration::from_millis(10));
        for ms in [50.0_f64, 200.0, 500.0, 1000.0, 2500.0, 5000.0, 20_000.0] {
            let mut slot = RankSlot::new(window());
            slot.heard = t0;
            let mut now = t0;
            // Before calibration: the watchdog (pinged at three quarters of it, not dead at it).
            let want = Watch::Late;
            let mut fresh = RankSlot::new(window());
            fresh.heard = t0;
            let got = fresh.watch(&rule, cap, true, t0 + cap, look);
            if got != want {
                return Err(format!("{ms} ms: uncalibrated at the watchdog gave {got:?}"));
            }
            for _ in 0..200 {
                let w = ms * rng.random_range(0.7..1.3);
                let mut left = w;
                while left > 0.0 {
                    let step = (ms / 10.0 * rng.random_range(0.7..1.3)).min(left);
                    now += Duration::from_secs_f64(step / 1000.0);
                    left -= step;
                    let got = slot.watch(&rule, cap, true, now, look);
                    if got != Watch::OnTime {
                        return Err(format!("{ms} ms: a talking rank judged {got:?}"));
                    }
                    slot.heard = now;
                }
                slot.windows.record(&rule, w);
            }
            // Silent from `now`: find when it is pinged, then when it is dead.
            let (mut pinged, mut dead) = (None, None);
            let mut t = now;
            while dead.is_none() && t < now + cap + cap {
                t += tick;
                match slot.watch(&rule, cap, true, t, look) {
                    Watch::Late if pinged.is_none() => pinged = Some(t - now),
                    Watch::Late => return Err(format!("{ms} ms: pinged twice")),
                    Watch::Dead(_) => dead = Some(t - now),
                    Watch::OnTime | Watch::Pinged => {}
                }
            }
            // Past the watchdog it is dead at once, pinged or not.
            let Some(dead) = dead else {
                return Err(format!("{ms} ms: never declared dead"));
            };
            let pinged = pinged.unwrap_or(dead);
            let bound = Duration::from_secs_f64(3.0 * ms / 1000.0).max(Duration::from_secs(2));
            // Within the deadline itself (past it only at the watchdog, dead at once there).
            let bound = if bound < cap { bound } else { cap + tick };
            if dead > bound || pinged > dead || (pinged == dead && dead <= cap) {
                return Err(format!(
                    "{ms} ms: pinged at {pinged:?}, dead at {dead:?}, bound {bound:?}"
                ));
            }
            // Heard after its ping: on time again, and a later silence is pinged afresh.
            slot.heard = now + pinged.min(cap) + tick;
            let got = slot.watch(&rule, cap, true, slot.heard, look);
            if got != Watch::OnTime {
                return Err(format!("{ms} ms: heard after its ping, judged {got:?}"));
            }
            let later = slot.heard + cap - tick;
            if ms <= 10_000.0 && slot.watch(&rule, cap, true, later, look) != Watch::Late {
                return Err(format!("{ms} ms: a second silence was not pinged"));
            }
            // Doing something else (evaluating): the watchdog alone (pinged, never dead, before it).
            if matches!(
                slot.watch(&rule, cap, false, slot.heard + cap - tick, look),
                Watch::Dead(_)
            ) || !matches!(
                slot.watch(&rule, cap, false, slot.heard + cap + tick, look),
                Watch::Dead(_)
            ) {
                return Err(format!("{ms} ms: not judged by the watchdog while not training"));
            }
        }
        Ok(())
    }

    /// Random deaths, through the roster: a dead rank's slot starts afresh in its window; a
    /// collective failure counts only in the generation it happened in, "all failed" means
    /// every live rank failed, and a new generation starts with no failure.
    #[test]
    fn slots_follow_deaths_and_generations() -> Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
        for case in 0..300 {
            let world = rng.random_range(1..8);
            let mut roster = Roster::new(world, DeadFlags::new(world));
            let mut slots = Slots::new(vec![window(); world]);
            let mut group = GroupBook::default();
            for _ in 0..20 {
                let rank = rng.random_range(0..world + 1);
                if let Some(slot) = slots.get_mut(rank) {
                    slot.in_flight = 2;
                    slot.window.target = 7;
                }
                if let Some(change) = roster.die(rank, 0) {
                    slots.apply(&change);
                    let slot = slots.get(rank).ok_or("no slot")?;
                    if slot.in_flight != 0 || slot.window.target != 7 {
                        return Err(format!("case {case}: rank {rank}'s slot after death"));
                    }
                }
                let live = roster.live();
                let generation = group.generation;
                let stale = generation.wrapping_sub(1);
                for &r in &live {
                    // A failure reported for an older group does not count.
                    group.left(&mut slots, r, stale, true);
                }
                if !live.is_empty() && slots.all_failed(&live) {
                    return Err(format!("case {case}: stale failures counted"));
                }
                for &r in &live {
                    group.left(&mut slots, r, generation, true);
                }
                if !slots.all_failed(&live) || group.failing_for().is_none() && !live.is_empty() {
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

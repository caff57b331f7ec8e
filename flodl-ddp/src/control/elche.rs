//! ElChe, the cadence balancer: how many batches each rank trains per reduce window.
//!
//! The slowest rank (the *anchor rank*) trains `anchor` batches per window; every other rank gets
//! `round(anchor × slow_ms / its_ms)` so all ranks reach the reduce at about the same wall time.
//! ElChe is pure logic: the runtime feeds it per-window compute time and step counts
//! ([`ElChe::report_timing`]) and the guard's verdict ([`ElChe::apply_verdict`]); it never reads a
//! clock and never touches a device.
//!
//! # Choices between the two reference behaviours
//!
//! * **Speed estimate: trust window with a change-point rule, not adaptive EMA.** Each rank
//!   keeps its last five readings of ms/batch and uses their mean
//!   (`control::trust_window`). The [0.5] adaptive EMA (`α = clamp(|err|, 0.1, 0.8)`)
//!   lets one outlier window (a page fault, a GC pause, a cold cache) move the estimate by up to
//!   80%, which then moves every count; the mean of five readings bounds one outlier's weight at
//!   20% and is exactly restorable from a checkpoint (one seeded sample). Alone it follows a real
//!   change of speed only over four or five windows, so a reading 2× or more out of line with the
//!   held ones (and beyond their spread), confirmed by the next or led into by the one before,
//!   replaces them: the plan follows a change two windows after the window it begins in.
//! * **Dead zone 5%, not 10%.** Counts are only changed when the new target differs from the
//!   current count by more than 5%. With the trust window the estimate noise is already small; a
//!   10% dead zone would freeze counts up to 10% away from the true ratio, i.e. the fast rank could
//!   idle 10% of every window.
//! * **Anchor-rank election with hysteresis, not argmax.** Ranks within 15% of the slowest form the
//!   slow cohort; the current anchor rank keeps its seat unless a cohort member is at least 10%
//!   slower. With two near-equal slow devices argmax flips on noise, and every flip renormalises
//!   all counts around another rank. A challenger that wins takes the seat (the reference "lowest
//!   index" rule can hand the seat straight back to the challenged rank).
//! * **Overhead = exposed / (window compute + exposed), grow-only, staged, at most ×2 per
//!   step.** *Exposed* is the part of the exchange the ranks cannot train through
//!   ([`Exposure`]), as the ranks measured it (their own encoding, the round trip and the
//!   merge; under `--overlap` only what the window did not hide), averaged over a cycle of
//!   fragments under `--fragments`. The
//!   [0.5] rule (`anchor = ceil(anchor · ov/target)`, decay by one when `ov < target/2`) both jumps
//!   on a single slow reduce and saw-tooths around the target. Here growth is only *proposed* and
//!   committed when the guard says [`Verdict::Stable`]; the only downward forces are
//!   [`Verdict::NudgeDown`] and the window cap. The overhead is the fraction of window wall time
//!   spent reducing, which is what the target is meant to bound.
//! * **Window cap: remainder to the largest count.** When the window exceeds `max_total` batches
//!   (one epoch), counts are scaled down (floor, at least 1) and the rounding remainder goes to
//!   the largest count, the rank that absorbs an extra batch at the least wall cost (the [0.5]
//!   rule hands it to ranks 0, 1, … regardless of speed).
//! * **Phase machine** (Probe → Warmup → Stable → Mature) from [0.6+]; the anchor rank is only
//!   re-elected from Stable on, so early noisy readings cannot move it.
//!
//! Under `Sync` there is no window: build ElChe with `anchor = 1` and `with_max_anchor(1)`.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::control::change::Change;
use crate::control::exposure::Exposure;
use crate::control::logic_error::{LogicError, LogicResult};
use crate::control::trust_window::TrustWindow;
use crate::control::verdict::Verdict;

/// Relative change a count target must exceed before it is applied.
pub(crate) const DEAD_ZONE: f64 = 0.05;
/// A rank belongs to the slow cohort when its ms/batch is at least this fraction of the slowest.
pub(crate) const COHORT_FRACTION: f64 = 0.85;
/// A cohort challenger must be this much slower than the anchor rank to take its seat.
pub(crate) const CHALLENGE_MARGIN: f64 = 1.10;
/// Largest speed ratio (anchor ms / rank ms) a count is computed from.
pub(crate) const MAX_SPEED_RATIO: f64 = 64.0;
/// Consecutive `Stable` verdicts that re-arm growth after it was latched off.
pub(crate) const REARM_STABLES: u32 = 5;
/// How many past count vectors [`ElChe::recent_batch_share`] averages.
pub(crate) const SHARE_HISTORY: usize = 10;
/// Calibrations after which the phase becomes [`Phase::Stable`].
pub(crate) const STABLE_AFTER: u64 = 5;
/// Calibrations after which the phase becomes [`Phase::Mature`].
pub(crate) const MATURE_AFTER: u64 = 20;
/// Default fraction of window wall time the reduce may cost.
pub(crate) const DEFAULT_OVERHEAD_TARGET: f64 = 0.05;
/// The overhead targets a run may set (a run's check refuses others; [`ElChe`] clamps to them).
pub const OVERHEAD_TARGETS: std::ops::RangeInclusive<f64> = 0.01..=0.5;
/// Default ceiling of the anchor.
pub(crate) const DEFAULT_MAX_ANCHOR: usize = 1000;

/// How far ElChe's calibration has come; monotone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Phase {
    /// No timing yet: counts are the initial (or hinted) ones.
    Probe,
    /// At least one calibration.
    Warmup,
    /// At least `STABLE_AFTER` calibrations: the anchor rank may be re-elected.
    Stable,
    /// At least `MATURE_AFTER` calibrations.
    Mature,
}

impl Phase {
    fn after(calibrations: u64) -> Phase {
        match calibrations {
            0 => Phase::Probe,
            c if c < STABLE_AFTER => Phase::Warmup,
            c if c < MATURE_AFTER => Phase::Stable,
            _ => Phase::Mature,
        }
    }
}

/// Whether ElChe may propose a larger anchor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Growth {
    /// Proposals are made when the reduce overhead exceeds the target.
    Armed,
    /// A guard verdict turned growth off; `stables` consecutive `Stable` verdicts seen since.
    Latched {
        /// Consecutive `Stable` verdicts since the latch; `REARM_STABLES` re-arms.
        stables: u32,
    },
}

/// Whether a rank still takes part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Membership {
    /// The rank trains and is counted.
    Alive,
    /// The rank was declared dead: its count is 0 and it is never elected.
    Retired,
}

/// How counts are refreshed after the estimates or the anchor changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refresh {
    /// New speed estimates: dead zone and `max_batch_diff` step limit apply.
    Smoothed,
    /// The anchor itself changed: targets apply at once.
    Forced,
}

/// One rank's window as ElChe reads it ([`ElChe::report_windows`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowReading {
    /// The window's training time, ms.
    pub wall_ms: f64,
    /// Batches trained in it.
    pub steps: u64,
    /// The median ms of the window's last steps, when the rank measured it (see the rank's
    /// `Progress`); a tail out of line with the rank's speed, on the reading's side, makes
    /// a change of speed count at once.
    pub tail_ms: Option<f64>,
}

/// ElChe's checkpointed state.
///
/// Restoring seeds each rank's trust window with one sample equal to the saved mean. The guard's
/// own history is checkpointed by the guard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElCheState {
    /// The anchor (batches the anchor rank trains per window).
    pub anchor: usize,
    /// The elected (or pinned) anchor rank.
    pub anchor_rank: Option<usize>,
    /// Smoothed ms/batch per rank (0 where unknown).
    pub ms_per_batch: Vec<f64>,
    /// Calibration phase.
    pub phase: Phase,
    /// Number of calibrations so far.
    pub calibrations: u64,
    /// Planned batch counts per rank (before slack and window cap).
    pub planned: Vec<usize>,
    /// The growth latch.
    pub growth: Growth,
    /// Which ranks are alive.
    pub membership: Vec<Membership>,
}

/// The cadence balancer (see the module documentation).
#[derive(Debug, Clone)]
pub struct ElChe {
    anchor: usize,
    min_anchor: usize,
    max_anchor: usize,
    overhead_target: f64,
    max_batch_diff: Option<usize>,
    max_total: Option<usize>,
    relax_up: bool,
    anchor_rank: Option<usize>,
    windows: Vec<TrustWindow>,
    membership: Vec<Membership>,
    calibrations: u64,
    growth: Growth,
    proposal: Option<usize>,
    // Dead-zoned counts before the one-shot callback slack and the window cap.
    planned: Vec<usize>,
    // What ranks actually get this window: `planned` minus slack, capped.
    counts: Vec<usize>,
    slack_ms: Vec<f64>,
    window_cap_binding: bool,
    history: VecDeque<Vec<usize>>,
}

impl ElChe {
    /// A balancer for `world` ranks starting with `anchor` batches per rank.
    ///
    /// Defaults: overhead target `DEFAULT_OVERHEAD_TARGET`, `min_anchor = anchor`,
    /// `max_anchor = max(DEFAULT_MAX_ANCHOR, anchor)`, no `max_batch_diff`, no window cap.
    ///
    /// # Errors
    /// [`LogicError::WorldTooSmall`] when `world < 1`; [`LogicError::InvalidValue`] when
    /// `anchor == 0`.
    pub fn new(world: usize, anchor: usize) -> LogicResult<ElChe> {
        if world < 1 {
            return Err(LogicError::WorldTooSmall { what: "ElChe", world, min: 1 });
        }
        if anchor == 0 {
            return Err(LogicError::InvalidValue { what: "anchor", value: 0.0 });
        }
        Ok(ElChe {
            anchor,
            min_anchor: anchor,
            max_anchor: DEFAULT_MAX_ANCHOR.max(anchor),
            overhead_target: DEFAULT_OVERHEAD_TARGET,
            max_batch_diff: None,
            max_total: None,
            relax_up: false,
            anchor_rank: None,
            windows: vec![TrustWindow::default(); world],
            membership: vec![Membership::Alive; world],
            calibrations: 0,
            growth: Growth::Armed,
            proposal: None,
            planned: vec![anchor; world],
            counts: vec![anchor; world],
            slack_ms: vec![0.0; world],
            window_cap_binding: false,
            history: VecDeque::new(),
        })
    }

    /// Sets the fraction of window wall time a reduce may cost, clamped to
    /// [`OVERHEAD_TARGETS`] (the default when not finite).
    pub fn with_overhead_target(mut self, target: f64) -> ElChe {
        self.overhead_target = match target.is_finite() {
            true => target.clamp(*OVERHEAD_TARGETS.start(), *OVERHEAD_TARGETS.end()),
            false => DEFAULT_OVERHEAD_TARGET,
        };
        self
    }

    /// Sets the anchor ceiling (at least 1); lowers `min_anchor` and the anchor if they exceed it.
    pub fn with_max_anchor(mut self, max: usize) -> ElChe {
        self.max_anchor = max.max(1);
        self.min_anchor = self.min_anchor.min(self.max_anchor);
        if self.anchor > self.max_anchor {
            self.anchor = self.max_anchor;
            self.refresh(Refresh::Forced);
        }
        self
    }

    /// Sets the anchor floor growth proposals respect (nudges bypass it), at most `max_anchor`.
    pub fn with_min_anchor(mut self, min: usize) -> ElChe {
        self.min_anchor = min.clamp(1, self.max_anchor);
        self
    }

    /// Limits how much a calibrated count may change per recalibration (0 freezes counts after
    /// the first calibration); also bounds the fast−slow spread `relax_up` may create.
    pub fn with_max_batch_diff(mut self, diff: usize) -> ElChe {
        self.max_batch_diff = Some(diff);
        self
    }

    /// Caps the window at `max_total` batches summed over ranks (typically one epoch's batches).
    pub fn with_max_total(mut self, max_total: usize) -> ElChe {
        self.max_total = Some(max_total.max(1));
        self.refresh(Refresh::Forced);
        self
    }

    /// Lets each `Stable` verdict add one batch to the anchor (bounded by `max_batch_diff`).
    pub fn with_relax_up(mut self) -> ElChe {
        self.relax_up = true;
        self
    }

    /// Pins `slow_rank` as the anchor rank and gives every other rank `round(anchor × ratio)`
    /// batches (ratio at least 1) until the first calibration.
    ///
    /// # Errors
    /// [`LogicError::RankOutOfRange`] for a rank outside the world; [`LogicError::InvalidValue`]
    /// for a non-finite ratio.
    pub fn with_speed_ratio(mut self, slow_rank: usize, ratio: f64) -> LogicResult<ElChe> {
        self.check_rank(slow_rank)?;
        if !ratio.is_finite() {
            return Err(LogicError::InvalidValue { what: "speed ratio", value: ratio });
        }
        let ratio = ratio.clamp(1.0, MAX_SPEED_RATIO);
        self.anchor_rank = Some(slow_rank);
        for (r, c) in self.planned.iter_mut().enumerate() {
            *c = if r == slow_rank {
                self.anchor
            } else {
                ((self.anchor as f64 * ratio).round() as usize).max(1)
            };
        }
        self.finish_counts();
        Ok(self)
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.windows.len()
    }

    /// Batches the anchor rank trains per window.
    pub fn anchor(&self) -> usize {
        self.anchor
    }

    /// The rank the window is paced by, once pinned or elected.
    pub fn anchor_rank(&self) -> Option<usize> {
        self.anchor_rank
    }

    /// Batches each rank trains in the coming window (0 for retired ranks).
    pub fn counts(&self) -> &[usize] {
        &self.counts
    }

    /// Smoothed ms/batch per rank (0 where no valid reading is held).
    pub fn ms_per_batch(&self) -> Vec<f64> {
        self.windows.iter().map(TrustWindow::mean).collect()
    }

    /// Calibration phase.
    pub fn phase(&self) -> Phase {
        Phase::after(self.calibrations)
    }

    /// Number of successful calibrations.
    pub fn calibrations(&self) -> u64 {
        self.calibrations
    }

    /// True once at least one timing report produced a speed estimate.
    pub fn is_calibrated(&self) -> bool {
        self.calibrations > 0
    }

    /// True when the counts are not all equal (a speed hint or a calibration made them differ).
    pub fn has_speed_hint(&self) -> bool {
        let alive: Vec<usize> = self.alive_ranks().map(|r| self.counts[r]).collect();
        alive.windows(2).any(|w| w[0] != w[1])
    }

    /// The growth the last report proposed, committed by the next `Stable` verdict.
    pub fn proposed_anchor(&self) -> Option<usize> {
        self.proposal
    }

    /// The growth latch.
    pub fn growth(&self) -> Growth {
        self.growth
    }

    /// True when the window cap scaled the counts down this window.
    pub fn window_cap_binding(&self) -> bool {
        self.window_cap_binding
    }

    /// Which ranks are alive.
    pub fn membership(&self) -> &[Membership] {
        &self.membership
    }

    /// Expected wall time of one window in ms (`anchor × anchor rank's ms/batch`), 0 until
    /// calibrated. A `Cadence` rank is ready for the reduce once it has computed this long,
    /// even short of its count (the window's wall budget, [`crate::Policy::window`]).
    pub fn anchor_wall_ms(&self) -> f64 {
        if !self.is_calibrated() {
            return 0.0;
        }
        let ms = self.anchor_rank.map_or(0.0, |a| self.windows[a].mean());
        self.anchor as f64 * ms
    }

    /// Feeds one window's timing: per rank the compute wall time in ms and the steps really
    /// trained since the last reduce, and the ms the reduce cost the ranks (its exposed part).
    ///
    /// A rank with no steps or no time counts as a miss for that rank (`MAX_MISSES` misses in a
    /// row clear its estimate). If no rank has an estimate afterwards the call changes nothing
    /// else. Otherwise the anchor rank is (re-)elected when allowed, counts are recomputed, and a
    /// larger anchor may be proposed (see [`ElChe::apply_verdict`]).
    ///
    /// # Errors
    /// [`LogicError::WorldMismatch`] when a slice's length is not the world size.
    pub fn report_timing(
        &mut self,
        wall_ms: &[f64],
        steps: &[u64],
        exposed_ms: f64,
    ) -> LogicResult<()> {
        self.report_exchange(wall_ms, steps, &Exposure::of(exposed_ms))
    }

    /// [`ElChe::report_timing`] with the exchange described by `exposure`: the overhead a
    /// growth proposal weighs is the exposed exchange of the last reduces ([`Exposure::overhead`]
    /// of the anchor's window).
    ///
    /// # Errors
    /// As [`ElChe::report_timing`].
    pub fn report_exchange(
        &mut self,
        wall_ms: &[f64],
        steps: &[u64],
        exposure: &Exposure,
    ) -> LogicResult<()> {
        self.check_len("wall_ms", wall_ms.len())?;
        self.check_len("steps", steps.len())?;
        let windows: Vec<WindowReading> = (wall_ms.iter().zip(steps))
            .map(|(&wall_ms, &steps)| WindowReading { wall_ms, steps, tail_ms: None })
            .collect();
        self.report_windows(&windows, exposure)
    }

    /// [`ElChe::report_exchange`] with each rank's window as a [`WindowReading`]: a reading
    /// with a tail lets a change of speed that ended the window be followed at once.
    ///
    /// # Errors
    /// As [`ElChe::report_timing`].
    pub fn report_windows(
        &mut self,
        windows: &[WindowReading],
        exposure: &Exposure,
    ) -> LogicResult<()> {
        self.check_len("windows", windows.len())?;
        // The slack reserved for the window that just ended is spent.
        self.consume_slack();
        let mut anchor_lost = false;
        for (r, &reading) in windows.iter().enumerate() {
            if self.membership[r] == Membership::Retired {
                continue;
            }
            let WindowReading { wall_ms: wall, steps: n, tail_ms } = reading;
            if n > 0 && wall > 0.0 && wall.is_finite() {
                self.windows[r].push_tail(wall / n as f64, tail_ms);
            } else if self.windows[r].miss() && self.anchor_rank == Some(r) {
                anchor_lost = true;
            }
        }
        if self.alive_ranks().all(|r| self.windows[r].mean() <= 0.0) {
            self.finish_counts();
            return Ok(());
        }
        self.calibrations += 1;
        let anchor_known = self.anchor_rank.is_some_and(|a| self.windows[a].mean() > 0.0);
        if !anchor_known || anchor_lost || self.phase() >= Phase::Stable {
            self.anchor_rank = self.elect();
        }
        self.refresh(Refresh::Smoothed);
        self.history.push_back(self.counts.clone());
        if self.history.len() > SHARE_HISTORY {
            self.history.pop_front();
        }
        self.proposal = self.propose(exposure);
        Ok(())
    }

    /// Obeys the guard: `Stable` commits a proposed growth (and re-arms growth after
    /// `REARM_STABLES` of them), `SuppressGrowth` drops it and latches growth off, `NudgeDown`
    /// drops it, latches growth off and shrinks the anchor by the factor.
    pub fn apply_verdict(&mut self, verdict: Verdict) {
        match verdict {
            Verdict::Stable => {
                if let Some(p) = self.proposal.take() {
                    self.anchor = p;
                    self.refresh(Refresh::Forced);
                }
                if let Growth::Latched { stables } = self.growth {
                    self.growth = if stables + 1 >= REARM_STABLES {
                        Growth::Armed
                    } else {
                        Growth::Latched { stables: stables + 1 }
                    };
                }
                if self.relax_up && self.anchor < self.max_anchor {
                    let spread_ok = self.max_batch_diff.is_none_or(|d| {
                        let projected = self.targets(self.anchor + 1);
                        let alive: Vec<usize> = self.alive_ranks().map(|r| projected[r]).collect();
                        let hi = alive.iter().copied().max().unwrap_or(0);
                        let lo = alive.iter().copied().min().unwrap_or(0);
                        hi - lo <= d
                    });
                    if spread_ok {
                        self.anchor += 1;
                        self.refresh(Refresh::Forced);
                    }
                }
            }
            Verdict::SuppressGrowth => {
                self.proposal = None;
                self.growth = Growth::Latched { stables: 0 };
            }
            Verdict::NudgeDown { factor } => {
                self.proposal = None;
                self.growth = Growth::Latched { stables: 0 };
                self.nudge_anchor_down(factor);
            }
        }
    }

    /// Shrinks the anchor to `ceil(anchor × clamp(factor, 0.1, 1))` (at least 1, bypassing
    /// `min_anchor`) and recomputes the counts at once.
    pub fn nudge_anchor_down(&mut self, factor: f64) {
        let f = if factor.is_finite() { factor.clamp(0.1, 1.0) } else { 1.0 };
        let nudged = ((self.anchor as f64 * f).ceil() as usize).max(1);
        self.anchor = self.anchor.min(nudged);
        self.refresh(Refresh::Forced);
    }

    /// The current counts scaled down to at most `max` in total (see [`clamp_total`]).
    pub fn clamp_total(&self, max: usize) -> Vec<usize> {
        clamp_total(&self.counts, max)
    }

    /// Normalised mean of the last `SHARE_HISTORY` windows' counts: each rank's share of the
    /// batches (equal shares before the first calibration).
    pub fn recent_batch_share(&self) -> Vec<f64> {
        let w = self.world();
        let mut mean = vec![0.0; w];
        if self.history.is_empty() {
            for r in self.alive_ranks() {
                mean[r] = self.counts[r] as f64;
            }
        } else {
            for counts in &self.history {
                for (m, &c) in mean.iter_mut().zip(counts) {
                    *m += c as f64;
                }
            }
        }
        let total: f64 = mean.iter().sum();
        if total > 0.0 {
            mean.iter_mut().for_each(|m| *m /= total);
        }
        mean
    }

    /// Reserves `slack_ms` of the coming window on `rank` (for an eval or checkpoint callback):
    /// its count drops by `ceil(slack_ms / its ms/batch)` batches (never below 1) for one window.
    ///
    /// # Errors
    /// [`LogicError::RankOutOfRange`]; [`LogicError::InvalidValue`] for a negative or non-finite
    /// slack.
    pub fn reserve_slack(&mut self, rank: usize, slack_ms: f64) -> LogicResult<()> {
        self.check_rank(rank)?;
        if !(slack_ms >= 0.0 && slack_ms.is_finite()) {
            return Err(LogicError::InvalidValue { what: "callback slack", value: slack_ms });
        }
        self.slack_ms[rank] = slack_ms;
        self.finish_counts();
        Ok(())
    }

    /// Declares `rank` dead: its count becomes 0, it is never elected again, and a new anchor
    /// rank is elected among the survivors if it held the seat.
    ///
    /// # Errors
    /// [`LogicError::RankOutOfRange`].
    pub fn retire(&mut self, rank: usize) -> LogicResult<()> {
        self.check_rank(rank)?;
        self.membership[rank] = Membership::Retired;
        self.windows[rank] = TrustWindow::default();
        if self.anchor_rank == Some(rank) {
            self.anchor_rank = self.elect();
        }
        self.refresh(Refresh::Forced);
        Ok(())
    }

    /// Admits a retired `rank` again (a process that joined the run again) with a fresh
    /// estimate: its count is the anchor's until its first measured window.
    ///
    /// # Errors
    /// [`LogicError::RankOutOfRange`].
    pub fn admit(&mut self, rank: usize) -> LogicResult<()> {
        self.check_rank(rank)?;
        self.membership[rank] = Membership::Alive;
        self.windows[rank] = TrustWindow::default();
        self.slack_ms[rank] = 0.0;
        if self.anchor_rank.is_none() {
            self.anchor_rank = self.elect();
        }
        self.refresh(Refresh::Forced);
        Ok(())
    }

    /// Follows a change of the run's members: a rank out of the run (vacant or dead) is
    /// retired, one that joined again is admitted.
    ///
    /// # Errors
    /// [`LogicError::RankOutOfRange`].
    pub(crate) fn apply(&mut self, change: &Change) -> LogicResult<()> {
        match change {
            Change::Vacated { rank, .. } | Change::Died { rank, .. } => self.retire(*rank),
            Change::Joined { rank } => self.admit(*rank),
        }
    }

    /// The checkpointable state.
    pub fn state(&self) -> ElCheState {
        ElCheState {
            anchor: self.anchor,
            anchor_rank: self.anchor_rank,
            ms_per_batch: self.ms_per_batch(),
            phase: self.phase(),
            calibrations: self.calibrations,
            planned: self.planned.clone(),
            growth: self.growth,
            membership: self.membership.clone(),
        }
    }

    /// Restores a checkpointed state (configuration knobs stay as built).
    ///
    /// # Errors
    /// [`LogicError::WorldMismatch`] when the state's world differs; [`LogicError::InvalidValue`]
    /// for a zero anchor; [`LogicError::RankOutOfRange`] for an anchor rank outside the world.
    pub fn restore(&mut self, state: &ElCheState) -> LogicResult<()> {
        self.check_len("ElChe state ms_per_batch", state.ms_per_batch.len())?;
        self.check_len("ElChe state planned counts", state.planned.len())?;
        self.check_len("ElChe state membership", state.membership.len())?;
        if state.anchor == 0 {
            return Err(LogicError::InvalidValue { what: "anchor", value: 0.0 });
        }
        if let Some(a) = state.anchor_rank {
            self.check_rank(a)?;
        }
        self.anchor = state.anchor;
        self.anchor_rank = state.anchor_rank;
        self.windows = state.ms_per_batch.iter().map(|&ms| TrustWindow::seeded(ms)).collect();
        self.calibrations = state.calibrations;
        self.planned = state.planned.clone();
        self.growth = state.growth;
        self.membership = state.membership.clone();
        self.proposal = None;
        self.slack_ms = vec![0.0; self.world()];
        self.history.clear();
        self.finish_counts();
        Ok(())
    }

    fn alive_ranks(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.world()).filter(|&r| self.membership[r] == Membership::Alive)
    }

    fn check_rank(&self, rank: usize) -> LogicResult<()> {
        if rank >= self.world() {
            return Err(LogicError::RankOutOfRange { rank, world: self.world() });
        }
        Ok(())
    }

    fn check_len(&self, what: &'static str, got: usize) -> LogicResult<()> {
        if got != self.world() {
            return Err(LogicError::WorldMismatch { what, expected: self.world(), got });
        }
        Ok(())
    }

    /// Elects the anchor rank among alive ranks with an estimate (see the module docs).
    fn elect(&self) -> Option<usize> {
        let ms = self.ms_per_batch();
        let known: Vec<usize> = self.alive_ranks().filter(|&r| ms[r] > 0.0).collect();
        let slowest = known.iter().map(|&r| ms[r]).fold(0.0, f64::max);
        let cohort: Vec<usize> =
            known.into_iter().filter(|&r| ms[r] >= COHORT_FRACTION * slowest).collect();
        // The slowest cohort member, lowest index on ties.
        let slowest_member =
            cohort.iter().copied().fold(None, |best: Option<usize>, r| match best {
                Some(b) if ms[b] >= ms[r] => Some(b),
                _ => Some(r),
            });
        match self.anchor_rank {
            Some(cur) if cohort.contains(&cur) => {
                let challenged = cohort.iter().any(|&c| ms[c] >= CHALLENGE_MARGIN * ms[cur]);
                if challenged { slowest_member } else { Some(cur) }
            }
            Some(_) => slowest_member,
            None => cohort.first().copied(),
        }
    }

    /// Undamped count targets for a given anchor.
    fn targets(&self, anchor: usize) -> Vec<usize> {
        let ms = self.ms_per_batch();
        let slow = self.anchor_rank.map_or(0.0, |a| ms[a]);
        (0..self.world())
            .map(|r| {
                if self.membership[r] == Membership::Retired {
                    0
                } else if Some(r) == self.anchor_rank || ms[r] <= 0.0 || slow <= 0.0 {
                    anchor
                } else {
                    let ratio = (slow / ms[r]).min(MAX_SPEED_RATIO);
                    ((anchor as f64 * ratio).round() as usize).max(1)
                }
            })
            .collect()
    }

    /// Recomputes `planned` from the estimates, then the effective counts.
    fn refresh(&mut self, how: Refresh) {
        let targets = self.targets(self.anchor);
        // Before the first calibration nothing has been measured, so the dead zone has nothing
        // to damp; the first calibration (count 1) applies its targets raw.
        let raw = how == Refresh::Forced || self.calibrations <= 1;
        for (r, &target) in targets.iter().enumerate() {
            let cur = self.planned[r];
            if self.membership[r] == Membership::Retired || cur == 0 {
                self.planned[r] = target;
                continue;
            }
            if raw {
                self.planned[r] = target;
                continue;
            }
            if (target as f64 - cur as f64).abs() <= DEAD_ZONE * cur as f64 {
                continue;
            }
            self.planned[r] = match self.max_batch_diff {
                Some(d) if target > cur => target.min(cur + d),
                Some(d) => target.max(cur.saturating_sub(d)).max(1),
                None => target,
            };
        }
        self.finish_counts();
    }

    /// Effective counts: `planned` minus the one-shot slack, then the window cap.
    fn finish_counts(&mut self) {
        let ms = self.ms_per_batch();
        let mut counts = self.planned.clone();
        for r in 0..self.world() {
            if self.membership[r] == Membership::Retired {
                counts[r] = 0;
            } else if self.slack_ms[r] > 0.0 && ms[r] > 0.0 {
                let cut = (self.slack_ms[r] / ms[r]).ceil() as usize;
                counts[r] = counts[r].saturating_sub(cut).max(1);
            }
        }
        self.window_cap_binding = false;
        if let Some(max) = self.max_total {
            let capped = clamp_total(&counts, max);
            self.window_cap_binding = capped != counts;
            counts = capped;
        }
        self.counts = counts;
    }

    /// Consumes the slack once a window was planned with it.
    fn consume_slack(&mut self) {
        self.slack_ms.iter_mut().for_each(|s| *s = 0.0);
    }

    /// Window-pressure growth proposal from the exchange's exposed cost.
    fn propose(&self, exposure: &Exposure) -> Option<usize> {
        if self.growth != Growth::Armed || self.window_cap_binding || self.calibrations < 2 {
            return None;
        }
        let m_b = self.anchor_rank.map_or(0.0, |a| self.windows[a].mean());
        if m_b <= 0.0 {
            return None;
        }
        let overhead = exposure.overhead(self.anchor as f64 * m_b);
        if overhead <= 0.0 {
            return None;
        }
        let threshold = if self.phase() >= Phase::Stable {
            self.overhead_target
        } else {
            2.0 * self.overhead_target
        };
        if overhead <= threshold {
            return None;
        }
        let grown = (self.anchor as f64 * (overhead / self.overhead_target).min(2.0)).ceil();
        let proposal = (grown as usize).clamp(self.min_anchor, self.max_anchor);
        (proposal > self.anchor).then_some(proposal)
    }
}

/// Scales `counts` down so they sum to at most `max`: each nonzero count becomes
/// `max(1, floor(c × max / Σ))` and the remainder up to `max` goes to the largest count (lowest
/// rank on ties). Zero counts stay zero. The result can exceed `max` only when there are more
/// nonzero counts than `max` (each keeps one batch).
pub fn clamp_total(counts: &[usize], max: usize) -> Vec<usize> {
    let total: usize = counts.iter().sum();
    if total <= max {
        return counts.to_vec();
    }
    let mut out: Vec<usize> =
        counts
            .iter()
            .map(|&c| {
                if c == 0 { 0 } else { ((c as u128 * max as u128 / total as u128) as usize).max(1) }
            })
            .collect();
    let sum: usize = out.iter().sum();
    if sum < max {
        let largest = (0..out.len()).fold(0, |b, r| if out[r] > out[b] { r } else { b });
        out[largest] += max - sum;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_follows_calibrations() {
        let cases = [(0, Phase::Probe), (1, Phase::Warmup), (4, Phase::Warmup)];
        let more =
            [(5, Phase::Stable), (19, Phase::Stable), (20, Phase::Mature), (99, Phase::Mature)];
        for (c, p) in cases.into_iter().chain(more) {
            assert_eq!(Phase::after(c), p, "calibrations {c}");
        }
    }

    /// The plan of the window after each reading of the slow rank (rank 0 steady at 4 ms/batch,
    /// rank 1, the anchor, at 10 and its readings below, anchor 10): the plan of the window a
    /// change falls in was made before it, so a change is absorbed within 3 windows when the
    /// plan after the second reading it touches is the new speed's.
    #[test]
    fn the_plan_follows_a_change_of_speed_and_not_a_stall() -> LogicResult<()> {
        // Five steady windows first: [25, 10] (the phase is Stable from then on).
        let steady = [(10.0, 25); 5];
        let cases: [(&str, &[(f64, usize)]); 5] = [
            // x3 from inside a window (15 ms: its mixed reading leans that way), then x3.
            ("slowed x3", &[(15.0, 28), (30.0, 75), (30.0, 75), (30.0, 75)]),
            // x3 from the window's start: held one window, then followed.
            ("slowed x3 at a window's start", &[(30.0, 25), (30.0, 75), (30.0, 75)]),
            // x3, then back inside a window (20 ms, leaning), then back.
            (
                "slowed x3 and back",
                &[(30.0, 25), (30.0, 75), (30.0, 75), (20.0, 69), (10.0, 25), (10.0, 25)],
            ),
            // A two-window stall of 1.6x (a loaded host) moves the plan by the mean's 24% at
            // most, never to the stall's 40.
            (
                "two-window stall x1.6",
                &[
                    (16.0, 28),
                    (16.0, 31),
                    (10.0, 31),
                    (10.0, 31),
                    (10.0, 31),
                    (10.0, 28),
                    (10.0, 25),
                ],
            ),
            // One window 3x: held, then one fifth of the mean (14 ms: 35) for four windows.
            (
                "one window x3",
                &[(30.0, 25), (10.0, 35), (10.0, 35), (10.0, 35), (10.0, 35), (10.0, 25)],
            ),
        ];
        for (name, readings) in cases {
            let mut el = ElChe::new(2, 10)?;
            for (i, &(ms, want)) in steady.iter().chain(readings).enumerate() {
                el.report_timing(
                    &[4.0 * el.counts()[0] as f64, ms * 10.0],
                    &[el.counts()[0] as u64, 10],
                    0.0,
                )?;
                assert_eq!(el.counts(), &[want, 10], "{name}: after reading {i} ({ms} ms)");
            }
        }
        Ok(())
    }
}

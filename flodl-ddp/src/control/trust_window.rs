//! One rank's speed estimate in ElChe: the mean of its recent ms/batch readings, which a
//! confirmed change of speed replaces.
//!
//! The mean of the last [`TRUST_WINDOW`] readings bounds one outlier's weight at a fifth, but
//! follows a real change of speed (a device throttled, shared, or back) only over about four
//! readings. So each new reading is first judged against the ones held, in log space (a factor
//! off is a factor off, whichever way): it is *out of line* when it lies more than
//! [`OUT_DEVIATIONS`] robust deviations (1.4826 × the median absolute deviation) and at least
//! [`OUT_FACTOR`] from their median. An out-of-line reading is held apart for one window. It
//! becomes a *change* — the held readings are dropped and the new ones kept — when it is
//! confirmed:
//! * by the next reading, out of line on the same side; or
//! * by the reading before it, which already leaned that way (more than [`LEAD_DEVIATIONS`]
//!   deviations and [`LEAD_FACTOR`] off the median, without being out of line): a change that
//!   began inside that window gives it a mixed reading.
//!
//! * by its own window's tail: a reading may come with the median ms of the window's last steps
//!   (`tail`, measured by the rank over at least [`TAIL_MIN`] steps). A tail out of line on the
//!   reading's side says the window ended at the new speed — most of its last steps, not one
//!   stalled step, were off — and the change is followed at once, from the tail's speed. A
//!   tail out of line under a reading that is not makes the reading lean that way (the change
//!   began late in the window), so the next out-of-line reading confirms it.
//!
//! A held reading not confirmed joins the mean one window late, as every reading did before.
//! So a change of speed of 2× or more is followed by the plan of the window after the first one
//! to end at the new speed (two windows after the one it begins in, with tails), while a
//! loaded host's stalls — under 2×, a single window, or a few steps of a window — move the
//! estimate no more than the plain mean lets them. A window slowed 2× or more through most of
//! its last steps is indistinguishable from a change and is followed; the first normal window
//! after it is followed back the same way.

use std::collections::VecDeque;

/// How many ms/batch readings a trust window holds.
pub(crate) const TRUST_WINDOW: usize = 5;
/// Consecutive invalid readings after which a trust window is cleared.
pub(crate) const MAX_MISSES: u32 = 5;
/// Readings a window must hold before their spread widens the bands (with fewer, a new
/// reading is judged against the factors alone).
pub(crate) const SPREAD_FROM: usize = 3;
/// Robust deviations from the median beyond which a reading may be out of line.
pub(crate) const OUT_DEVIATIONS: f64 = 3.0;
/// Smallest factor off the median that is out of line, however quiet the readings.
pub(crate) const OUT_FACTOR: f64 = 2.0;
/// Robust deviations from the median beyond which a reading leans towards a change.
pub(crate) const LEAD_DEVIATIONS: f64 = 2.0;
/// Smallest factor off the median that leans towards a change, however quiet the readings.
pub(crate) const LEAD_FACTOR: f64 = 1.25;
/// Fewest steps a window's tail is measured over (fewer: no tail; one stalled step then
/// cannot move its median).
pub(crate) const TAIL_MIN: usize = 3;
/// The median absolute deviation of a normal law, in standard deviations, inverted.
const MAD_TO_SIGMA: f64 = 1.4826;

/// Which side of the held readings' median a reading lies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// Slower (more ms per batch).
    Slower,
    /// Faster.
    Faster,
}

/// What became of a reading ([`TrustWindow::push`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judgement {
    /// Kept in the mean.
    Kept,
    /// Out of line: held apart until the next reading says whether the speed changed.
    Held(Side),
    /// A confirmed change of speed: the readings before it were dropped.
    Changed(Side),
}

/// What the latest reading was, against the ones held before it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
enum Latest {
    /// In line, or not judged (too few readings held).
    #[default]
    InLine,
    /// Kept, but leaning off the median towards `Side`.
    Leaning(Side),
    /// Out of line towards `Side`, held apart: the reading in ms/batch.
    Held(Side, f64),
}

/// The median and the acceptance bands of the held readings, in natural-log units.
#[derive(Debug, Clone, Copy)]
struct Band {
    center: f64,
    out: f64,
    lean: f64,
}

/// One rank's recent ms/batch readings and the state of its change-point rule (see the module
/// documentation).
#[derive(Debug, Clone, Default)]
pub(crate) struct TrustWindow {
    readings: VecDeque<f64>,
    misses: u32,
    latest: Latest,
}

impl TrustWindow {
    /// A window holding one reading (none when `ms` is not a positive finite number).
    pub(crate) fn seeded(ms: f64) -> TrustWindow {
        let mut w = TrustWindow::default();
        if ms > 0.0 && ms.is_finite() {
            w.readings.push_back(ms);
        }
        w
    }

    /// Judges a valid reading (positive and finite) with no tail: [`TrustWindow::push_tail`].
    #[cfg(test)]
    pub(crate) fn push(&mut self, ms: f64) -> Judgement {
        self.push_tail(ms, None)
    }

    /// Judges a valid reading (positive and finite), with the median ms of its window's last
    /// steps when the rank measured one, and keeps, holds or follows it.
    pub(crate) fn push_tail(&mut self, ms: f64, tail: Option<f64>) -> Judgement {
        self.misses = 0;
        let tail = tail.filter(|t| *t > 0.0 && t.is_finite());
        let Some(band) = self.band() else {
            self.release_held();
            self.keep(ms);
            self.latest = Latest::InLine;
            return Judgement::Kept;
        };
        let off = ms.ln() - band.center;
        let side = if off > 0.0 { Side::Slower } else { Side::Faster };
        // The tail's side, when it is out of line itself.
        let tail_out = tail.and_then(|t| {
            let off = t.ln() - band.center;
            let side = if off > 0.0 { Side::Slower } else { Side::Faster };
            (off.abs() > band.out).then_some((side, t))
        });
        if off.abs() <= band.out {
            self.release_held();
            self.keep(ms);
            self.latest = match tail_out {
                Some((s, _)) => Latest::Leaning(s),
                None if off.abs() > band.lean => Latest::Leaning(side),
                None => Latest::InLine,
            };
            return Judgement::Kept;
        }
        match self.latest {
            Latest::Held(s, held) if s == side => {
                // Two in a row out on one side: keep the held one too unless it was a mixed
                // window (the change began inside it), far from the new speed.
                self.readings.clear();
                if (held.ln() - ms.ln()).abs() <= LEAD_FACTOR.ln() {
                    self.readings.push_back(held);
                }
                self.readings.push_back(ms);
                self.latest = Latest::InLine;
                Judgement::Changed(side)
            }
            Latest::Leaning(s) if s == side => {
                self.readings.clear();
                self.readings.push_back(ms);
                self.latest = Latest::InLine;
                Judgement::Changed(side)
            }
            // The window ended at the new speed: followed now, from its tail (the reading's
            // mean may still hold steps from before the change).
            _ if tail_out.is_some_and(|(s, _)| s == side) => {
                self.readings.clear();
                self.readings.push_back(tail_out.map_or(ms, |(_, t)| t));
                self.latest = Latest::InLine;
                Judgement::Changed(side)
            }
            _ => {
                self.release_held();
                self.latest = Latest::Held(side, ms);
                Judgement::Held(side)
            }
        }
    }

    /// Counts a missing reading; returns true when the window was just cleared.
    pub(crate) fn miss(&mut self) -> bool {
        self.misses += 1;
        if self.misses >= MAX_MISSES && !self.readings.is_empty() {
            self.readings.clear();
            self.latest = Latest::InLine;
            return true;
        }
        false
    }

    /// Mean of the kept readings, 0 when there are none.
    pub(crate) fn mean(&self) -> f64 {
        if self.readings.is_empty() {
            0.0
        } else {
            self.readings.iter().sum::<f64>() / self.readings.len() as f64
        }
    }

    fn keep(&mut self, ms: f64) {
        if self.readings.len() == TRUST_WINDOW {
            self.readings.pop_front();
        }
        self.readings.push_back(ms);
    }

    /// A held reading the next one did not confirm joins the mean (one window late).
    fn release_held(&mut self) {
        if let Latest::Held(_, held) = self.latest {
            self.keep(held);
            self.latest = Latest::InLine;
        }
    }

    /// The held readings' median and bands (none without readings); their spread counts from
    /// [`SPREAD_FROM`] readings on.
    fn band(&self) -> Option<Band> {
        if self.readings.is_empty() {
            return None;
        }
        let logs: Vec<f64> = self.readings.iter().map(|r| r.ln()).collect();
        let center = median(logs.clone());
        let sigma = if logs.len() < SPREAD_FROM {
            0.0
        } else {
            MAD_TO_SIGMA * median(logs.iter().map(|l| (l - center).abs()).collect())
        };
        Some(Band {
            center,
            out: (OUT_DEVIATIONS * sigma).max(OUT_FACTOR.ln()),
            lean: (LEAD_DEVIATIONS * sigma).max(LEAD_FACTOR.ln()),
        })
    }
}

/// The median of a non-empty list (the mean of the middle two for an even length).
pub(crate) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_last_five_and_clears_after_misses() {
        let mut w = TrustWindow::default();
        // Each reading at most 1.2x the last ones' median: all in line.
        for x in [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6] {
            assert_eq!(w.push(x), Judgement::Kept, "{x}");
        }
        assert!((w.mean() - 1.4).abs() < 1e-12);
        for i in 0..MAX_MISSES {
            let cleared = w.miss();
            assert_eq!(cleared, i + 1 == MAX_MISSES);
        }
        assert_eq!(w.mean(), 0.0);
    }

    /// Readings in, what each was judged and the estimate after it.
    #[test]
    fn readings_are_judged_and_followed() {
        use Judgement::{Changed, Held, Kept};
        use Side::{Faster, Slower};
        type Step = (f64, Judgement, f64);
        let steady = [(10.0, Kept, 10.0), (10.0, Kept, 10.0), (10.0, Kept, 10.0)];
        let cases: [(&str, &[Step]); 8] = [
            // Out of line twice on one side: the second replaces the readings (with the held
            // one, at the same speed).
            ("step x3", &[(30.0, Held(Slower), 10.0), (30.0, Changed(Slower), 30.0)]),
            // A two-window stall of 2x or more is followed, and left as fast (judged against
            // the two readings the change kept).
            (
                "stall x2.5",
                &[
                    (25.0, Held(Slower), 10.0),
                    (25.0, Changed(Slower), 25.0),
                    (10.0, Held(Faster), 25.0),
                    (10.0, Changed(Faster), 10.0),
                ],
            ),
            // A mixed window (1.5x: in line but leaning) then an out-of-line one: a change.
            ("step x3 in a mixed window", &[(15.0, Kept, 11.25), (30.0, Changed(Slower), 30.0)]),
            // A mixed window out of line itself (2.5x) then 3x: the mixed one is dropped.
            (
                "step x3 out of a mixed window",
                &[(22.0, Held(Slower), 10.0), (30.0, Changed(Slower), 30.0)],
            ),
            // Faster by 3: the same, the other way.
            (
                "step /3",
                &[(10.0 / 3.0, Held(Faster), 10.0), (10.0 / 3.0, Changed(Faster), 10.0 / 3.0)],
            ),
            // One window 3x: held, then joins the mean one window late.
            ("lone outlier", &[(30.0, Held(Slower), 10.0), (10.0, Kept, 14.0), (10.0, Kept, 14.0)]),
            // A two-window stall under 2x is never a change: the plain mean.
            ("stall 1.6x", &[(16.0, Kept, 11.5), (16.0, Kept, 12.4), (10.0, Kept, 12.4)]),
            // Out of line one way then the other: the first joins the mean, the second is held.
            (
                "up then down",
                &[(30.0, Held(Slower), 10.0), (4.0, Held(Faster), 15.0), (10.0, Kept, 12.8)],
            ),
        ];
        for (name, steps) in cases {
            let mut w = TrustWindow::default();
            for (i, &(x, judged, mean)) in steady.iter().chain(steps.iter()).enumerate() {
                assert_eq!(w.push(x), judged, "{name}: reading {i} ({x})");
                assert!((w.mean() - mean).abs() < 1e-9, "{name}: reading {i}: mean {}", w.mean());
            }
        }
    }

    /// Readings with their windows' tails: what each was judged and the estimate after it.
    #[test]
    fn a_tail_at_the_new_speed_is_followed_at_once_and_a_stalled_step_is_not() {
        use Judgement::{Changed, Held, Kept};
        use Side::{Faster, Slower};
        type Step = (f64, Option<f64>, Judgement, f64);
        let steady = [(10.0, Some(10.0), Kept, 10.0); 3];
        let cases: [(&str, &[Step]); 8] = [
            // The window ran 3x from its start: followed by its own reading.
            ("step x3 at a window's start", &[(30.0, Some(30.0), Changed(Slower), 30.0)]),
            ("step /3 at a window's start", &[(2.5, Some(2.5), Changed(Faster), 2.5)]),
            // Mixed, out of line, ending at the new speed: followed from the tail.
            ("step x3 out of a mixed window", &[(22.0, Some(30.0), Changed(Slower), 30.0)]),
            // Late in the window: the reading in line, its tail not; the next confirms.
            (
                "step x3 late in a window",
                &[(12.0, Some(30.0), Kept, 10.5), (30.0, Some(30.0), Changed(Slower), 30.0)],
            ),
            // Stalled steps but a tail at the old speed: as without tails.
            ("a stall, the tail steady", &[(30.0, Some(10.0), Held(Slower), 10.0)]),
            (
                "a stall then back",
                &[(30.0, Some(10.0), Held(Slower), 10.0), (10.0, Some(10.0), Kept, 14.0)],
            ),
            // A tail the other way from its reading says nothing.
            ("a tail against its reading", &[(30.0, Some(3.0), Held(Slower), 10.0)]),
            // No tail (too few steps): the rule without tails.
            ("no tail", &[(30.0, None, Held(Slower), 10.0), (30.0, None, Changed(Slower), 30.0)]),
        ];
        for (name, steps) in cases {
            let mut w = TrustWindow::default();
            for (i, &(x, tail, judged, mean)) in steady.iter().chain(steps.iter()).enumerate() {
                assert_eq!(w.push_tail(x, tail), judged, "{name}: reading {i} ({x}, {tail:?})");
                assert!((w.mean() - mean).abs() < 1e-9, "{name}: reading {i}: mean {}", w.mean());
            }
        }
    }

    /// Noisy readings widen the bands: 2.5x is in line among readings that spread ±40%.
    #[test]
    fn the_bands_follow_the_spread() {
        let mut w = TrustWindow::default();
        for x in [10.0, 14.0, 7.0, 12.0, 8.0] {
            w.push(x);
        }
        assert_eq!(w.push(25.0), Judgement::Kept);
        let mut quiet = TrustWindow::default();
        for x in [10.0, 10.2, 9.9, 10.1, 10.0] {
            quiet.push(x);
        }
        assert_eq!(quiet.push(25.0), Judgement::Held(Side::Slower));
    }
}

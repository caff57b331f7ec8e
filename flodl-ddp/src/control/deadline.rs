//! A rank's silence deadline derived from its own cadence: late past the median of its recent
//! window times plus `k` median absolute deviations, or past `windows` of its median window,
//! whichever is later, never below a floor, never past the watchdog (the upper bound and manual
//! override); the watchdog alone until calibrated.
//!
//! Pure: it is fed window times in ms and answers durations; it reads no clock. Each rank's
//! `RankSlot` holds its [`Deadline`] and judges its silence with it (the coordinator's
//! liveness check).

use std::collections::VecDeque;
use std::time::Duration;

/// The rule's constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeadlineRule {
    /// Deviations past the median a window may run before the rank is late.
    pub k: f64,
    /// The least deadline: a fast rank is never declared dead sooner.
    pub floor: Duration,
    /// The least deadline in the rank's own median windows: a rank whose window is a step or
    /// two (a transformer averaged after every slow step) stays silent a whole step, and a
    /// loaded machine stretches one step well past its jitter.
    pub windows: f64,
    /// Windows seen before the derived deadline applies (until then, the watchdog).
    pub grace: usize,
    /// Recent windows kept.
    pub keep: usize,
    /// The smallest spread assumed, as a fraction of the median (a rank whose windows were all
    /// equal so far is allowed this much jitter anyway).
    pub min_spread: f64,
}

impl Default for DeadlineRule {
    /// k = 5, a 2 s floor, at least 2.5 windows, 3 windows of grace, the last 32 windows, a
    /// spread of at least 15%: a steady or ±30%-jittery rank (MAD ≈ 15%, 1.75 windows by the
    /// deviations) is late after 2.5 of its windows, one whose windows vary by half after about
    /// 2.75 (a short sample's MAD can read low: the spread floor keeps ±30% jitter inside the
    /// deadline). Within the goal of 3 windows or 2 s, whichever is longer. The 2.5 windows:
    /// with 1.75, a 2-rank transformer run averaged after every slow step lost its slow rank
    /// to one step stretched past 2 s by a loaded machine (median steps well under 2 s).
    fn default() -> Self {
        DeadlineRule {
            k: 5.0,
            floor: Duration::from_secs(2),
            windows: 2.5,
            grace: 3,
            keep: 32,
            min_spread: 0.15,
        }
    }
}

/// One rank's recent window times and the deadline they give.
#[derive(Debug, Clone, Default)]
pub struct Deadline {
    recent: VecDeque<f64>,
}

impl Deadline {
    /// Records a window of `ms` (non-finite or negative readings are ignored), keeping the
    /// newest `rule.keep`.
    pub fn record(&mut self, rule: &DeadlineRule, ms: f64) {
        if !ms.is_finite() || ms < 0.0 {
            return;
        }
        self.recent.push_back(ms);
        while self.recent.len() > rule.keep.max(1) {
            self.recent.pop_front();
        }
    }

    /// How long the rank may stay silent: `watchdog` until `rule.grace` windows are seen, then
    /// max(median + k·max(MAD, min_spread·median), windows·median), at least the floor, at
    /// most `watchdog`.
    pub fn silence(&self, rule: &DeadlineRule, watchdog: Duration) -> Duration {
        if self.recent.len() < rule.grace.max(1) {
            return watchdog;
        }
        let mut xs: Vec<f64> = self.recent.iter().copied().collect();
        let median = median_of(&mut xs);
        let mut dev: Vec<f64> = xs.iter().map(|x| (x - median).abs()).collect();
        let mad = median_of(&mut dev).max(rule.min_spread * median);
        let ms = (median + rule.k * mad).max(rule.windows * median);
        let derived = Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(watchdog);
        derived.max(rule.floor).min(watchdog)
    }
}

/// The median of `xs` (0 when empty).
fn median_of(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => xs[n / 2],
        _ => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    use super::*;

    /// Hand-computed deadlines: the watchdog before calibration, the floor for fast ranks, the
    /// derived value between, the watchdog as the cap; bad readings ignored.
    #[test]
    fn deadlines_follow_each_ranks_own_windows() -> Result<(), String> {
        let rule = DeadlineRule::default();
        let w = Duration::from_secs(30);
        // (windows in ms, watchdog, want)
        let cases: Vec<(Vec<f64>, Duration, Duration)> = vec![
            (vec![], w, w),
            (vec![5000.0, 5000.0], w, w),
            // Fast and steady: the floor.
            (vec![100.0, 100.0, 100.0], w, Duration::from_secs(2)),
            // Steady 4 s: 4000 + 5 × 600 (the 15% spread) = 7 s, under 2.5 windows: 10 s.
            (vec![4000.0, 4000.0, 4000.0], w, Duration::from_secs(10)),
            // Median 4 s, MAD 1.5 s: 11.5 s, past 2.5 windows.
            (
                vec![2500.0, 4000.0, 5500.0, 4000.0, 2500.0, 5500.0],
                w,
                Duration::from_millis(11_500),
            ),
            // Median 1 s: 2.5 s, past the floor.
            (vec![1000.0, 900.0, 1100.0], w, Duration::from_millis(2500)),
            // Slow (10× the others): its own 8 s windows give 20 s.
            (vec![8000.0, 8000.0, 8000.0], w, Duration::from_secs(20)),
            // ... 20 s windows give 50 s: capped by the watchdog.
            (vec![20_000.0, 20_000.0, 20_000.0], w, w),
            (vec![20_000.0, 20_000.0, 20_000.0], Duration::from_secs(10), Duration::from_secs(10)),
            // NaN, infinite and negative readings are no windows.
            (vec![f64::NAN, 100.0, f64::INFINITY, -3.0, 100.0], w, w),
        ];
        for (i, (windows, watchdog, want)) in cases.into_iter().enumerate() {
            let mut d = Deadline::default();
            for ms in &windows {
                d.record(&rule, *ms);
            }
            let got = d.silence(&rule, watchdog);
            if got.abs_diff(want) > Duration::from_millis(1) {
                return Err(format!("case {i}: {windows:?} gave {got:?}, want {want:?}"));
            }
        }
        Ok(())
    }

    /// Ranks at 1×, 2.5×, 5× and 10× a 200 ms window with ±30% jitter on every window: no
    /// window of 100,000 per rank outlasts the deadline before it (no false eviction), and a
    /// silent rank is found within 3 of its windows or 2 s, whichever is longer.
    #[test]
    fn jitter_never_evicts_and_silence_is_found_within_three_windows() -> Result<(), String> {
        let rule = DeadlineRule::default();
        let watchdog = Duration::from_secs(30);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(30);
        for skew in [1.0, 2.5, 5.0, 10.0] {
            let base = 200.0 * skew;
            let mut d = Deadline::default();
            for n in 0..100_000 {
                let ms = base * rng.random_range(0.7..1.3);
                let limit = d.silence(&rule, watchdog).as_secs_f64() * 1000.0;
                if ms > limit {
                    return Err(format!("skew {skew}: window {n} of {ms:.0} ms past {limit:.0}"));
                }
                d.record(&rule, ms);
            }
            let found = d.silence(&rule, watchdog).as_secs_f64() * 1000.0;
            let bound = (3.0 * base).max(2000.0);
            if found > bound {
                return Err(format!("skew {skew}: silence found after {found:.0} ms > {bound:.0}"));
            }
        }
        Ok(())
    }
}

//! The divergence guard: per-reduce divergence of the replicas, and the verdict ElChe obeys.
//!
//! At each reduce every rank measures how far its replica had drifted from the consensus,
//! `D_r = ‖W_pre − W_post‖ / ‖W_post‖` (`divergence`); the guard sees `max_r D_r` and the
//! window's largest step count, and answers a [`Verdict`]. Two rules:
//! * **trend** (level) guard: `SuppressGrowth` when the last three divergences, each per √step
//!   of its window (`D / √k_max`), rise strictly and the last divergence exceeds a threshold (0.05;
//!   0.3 under EASGD, whose replicas keep an elastic spread).
//! * **growth-rate (λ) guard**: `λ = ln(D_t / D_{t−1}) / k_max`, the divergence's growth rate per
//!   step, smoothed by a bias-corrected EMA; `NudgeDown{0.5}` after three events above 1e-2,
//!   otherwise `SuppressGrowth` after three above 1e-3.
//!
//! The guard is not consulted under `Sync` (there is no window to shrink): use [`Guard::Off`].

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::control::verdict::Verdict;

/// A post-reduce norm below this makes the divergence 0 (nothing to compare against).
pub(crate) const MIN_POST_NORM: f64 = 1e-10;
/// A divergence at or below this yields no growth rate and breaks the λ chain.
pub(crate) const MIN_DIVERGENCE: f64 = 1e-8;
/// Default trend threshold.
pub(crate) const TREND_THRESHOLD: f64 = 0.05;
/// Default trend threshold under EASGD blending.
pub(crate) const TREND_THRESHOLD_EASGD: f64 = 0.3;
/// Divergences the trend guard remembers.
pub(crate) const TREND_HISTORY: usize = 5;
/// EMA decay of the growth rate.
pub(crate) const LAMBDA_DECAY: f64 = 0.9;
/// Smoothed growth rate above which `NudgeDown` streaks count.
pub(crate) const LAMBDA_NUDGE: f64 = 1e-2;
/// Smoothed growth rate above which `SuppressGrowth` streaks count.
pub(crate) const LAMBDA_SUPPRESS: f64 = 1e-3;
/// Consecutive events above a threshold that fire its verdict.
pub(crate) const LAMBDA_STREAK: u32 = 3;
/// The anchor factor of the growth guard's `NudgeDown`.
pub(crate) const NUDGE_FACTOR: f64 = 0.5;

/// `‖W_pre − W_post‖ / ‖W_post‖`, 0 when `‖W_post‖ < 1e-10` (or an input is not finite).
pub(crate) fn divergence(diff_norm: f64, post_norm: f64) -> f64 {
    if post_norm < MIN_POST_NORM || !post_norm.is_finite() || !diff_norm.is_finite() {
        0.0
    } else {
        diff_norm / post_norm
    }
}

/// What the guard sees of one reduce.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReduceReport {
    /// `max_r D_r` over the ranks that took part.
    pub divergence: f64,
    /// The largest number of steps a rank trained in the window.
    pub k_max: u64,
}

/// The trend (level) rule.
///
/// The rise is judged per √step of the window (`D / √k_max`), not on `D` itself: replicas fed
/// different batches spread like a random walk, so a window of `k` steps ends `~√k` apart even
/// when nothing drifts. Judged on `D`, every growth of the window that ElChe commits reads as a
/// rising trend: on a slow link three growths in a row latched growth off after each burst and
/// held the windows at a few hundred batches, the reduce 15-40% of the wall
/// (`flodl-cli/tests/hosts.rs`). Per √step, windows of equal length compare as before and a
/// divergence that outgrows the random walk still suppresses growth. The level, what makes a
/// rise matter, stays the raw divergence of the last window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrendGuard {
    threshold: f64,
    history: VecDeque<f64>,
}

impl TrendGuard {
    /// A trend guard firing above `threshold`.
    pub fn new(threshold: f64) -> TrendGuard {
        TrendGuard { threshold, history: VecDeque::new() }
    }

    /// The remembered divergences per √step (`D / √k_max`), oldest first.
    pub fn history(&self) -> impl Iterator<Item = f64> + '_ {
        self.history.iter().copied()
    }

    /// Records the divergence of a window whose longest rank trained `k_max` steps (0 counts
    /// as 1) and judges it.
    pub fn report(&mut self, divergence: f64, k_max: u64) -> Verdict {
        if self.history.len() == TREND_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(divergence / (k_max.max(1) as f64).sqrt());
        let n = self.history.len();
        if n < 3 {
            return Verdict::Stable;
        }
        let (a, b, c) = (self.history[n - 3], self.history[n - 2], self.history[n - 1]);
        if a < b && b < c && divergence > self.threshold {
            Verdict::SuppressGrowth
        } else {
            Verdict::Stable
        }
    }
}

/// The growth-rate (λ) rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrowthGuard {
    previous: Option<f64>,
    ema: f64,
    samples: i32,
    nudge_streak: u32,
    suppress_streak: u32,
}

impl Default for GrowthGuard {
    fn default() -> GrowthGuard {
        GrowthGuard::new()
    }
}

impl GrowthGuard {
    /// A growth guard with no history.
    pub fn new() -> GrowthGuard {
        GrowthGuard { previous: None, ema: 0.0, samples: 0, nudge_streak: 0, suppress_streak: 0 }
    }

    /// The bias-corrected smoothed growth rate, once there is one.
    pub fn lambda(&self) -> Option<f64> {
        (self.samples > 0).then(|| self.ema / (1.0 - LAMBDA_DECAY.powi(self.samples)))
    }

    /// Records a reduce and judges it.
    pub fn report(&mut self, report: &ReduceReport) -> Verdict {
        let d = report.divergence;
        let usable = d.is_finite() && d > MIN_DIVERGENCE;
        let previous = std::mem::replace(&mut self.previous, usable.then_some(d));
        let Some(prev) = previous.filter(|_| usable && report.k_max > 0) else {
            // No rate this time: the chain is broken and the streaks restart.
            self.nudge_streak = 0;
            self.suppress_streak = 0;
            return Verdict::Stable;
        };
        let raw = (d / prev).ln() / report.k_max as f64;
        self.ema = LAMBDA_DECAY * self.ema + (1.0 - LAMBDA_DECAY) * raw;
        self.samples = self.samples.saturating_add(1);
        let lambda = self.lambda().unwrap_or(raw);
        self.nudge_streak = if lambda > LAMBDA_NUDGE { self.nudge_streak + 1 } else { 0 };
        self.suppress_streak = if lambda > LAMBDA_SUPPRESS { self.suppress_streak + 1 } else { 0 };
        if self.nudge_streak >= LAMBDA_STREAK {
            self.nudge_streak = 0;
            Verdict::NudgeDown { factor: NUDGE_FACTOR }
        } else if self.suppress_streak >= LAMBDA_STREAK {
            self.suppress_streak = 0;
            Verdict::SuppressGrowth
        } else {
            Verdict::Stable
        }
    }
}

/// The divergence guard in force (its state is checkpointed with serde).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Guard {
    /// Always `Stable` (also the choice under `Sync`).
    Off,
    /// The trend rule only.
    Trend(TrendGuard),
    /// The growth-rate rule only.
    Growth(GrowthGuard),
    /// Both rules; the more severe verdict wins.
    Both(TrendGuard, GrowthGuard),
}

impl Guard {
    /// The default guard: both rules, with the trend threshold for plain averaging or EASGD.
    pub fn standard(easgd: bool) -> Guard {
        let threshold = if easgd { TREND_THRESHOLD_EASGD } else { TREND_THRESHOLD };
        Guard::Both(TrendGuard::new(threshold), GrowthGuard::new())
    }

    /// Records a reduce and returns the verdict for ElChe (and the overshoot bound).
    pub fn report(&mut self, report: &ReduceReport) -> Verdict {
        match self {
            Guard::Off => Verdict::Stable,
            Guard::Trend(t) => t.report(report.divergence, report.k_max),
            Guard::Growth(g) => g.report(report),
            Guard::Both(t, g) => {
                let a = t.report(report.divergence, report.k_max);
                let b = g.report(report);
                more_severe(a, b)
            }
        }
    }
}

/// The more severe of two verdicts (`NudgeDown` > `SuppressGrowth` > `Stable`; of two nudges,
/// the smaller factor).
pub(crate) fn more_severe(a: Verdict, b: Verdict) -> Verdict {
    match (a, b) {
        (Verdict::NudgeDown { factor: x }, Verdict::NudgeDown { factor: y }) => {
            Verdict::NudgeDown { factor: x.min(y) }
        }
        (n @ Verdict::NudgeDown { .. }, _) | (_, n @ Verdict::NudgeDown { .. }) => n,
        (Verdict::SuppressGrowth, _) | (_, Verdict::SuppressGrowth) => Verdict::SuppressGrowth,
        _ => Verdict::Stable,
    }
}

#[cfg(test)]
mod tests {
    //! The divergence guard against hand-computed sequences, and ElChe obeying it.

    use crate::control::guard::{
        GrowthGuard, Guard, ReduceReport, TrendGuard, divergence, more_severe,
    };
    use crate::{ElChe, Verdict};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    const STABLE: Verdict = Verdict::Stable;
    const SUPPRESS: Verdict = Verdict::SuppressGrowth;
    const NUDGE: Verdict = Verdict::NudgeDown { factor: 0.5 };

    #[test]
    fn divergence_by_hand() {
        assert_eq!(divergence(3.0, 4.0), 0.75);
        assert_eq!(divergence(3.0, 1e-11), 0.0);
        assert_eq!(divergence(f64::NAN, 4.0), 0.0);
    }

    #[test]
    fn trend_guard_sequences() {
        let cases: [(&[f64], &[Verdict]); 4] = [
            (&[0.01, 0.02, 0.03, 0.06], &[STABLE, STABLE, STABLE, SUPPRESS]),
            (&[0.06, 0.07, 0.07, 0.08], &[STABLE, STABLE, STABLE, STABLE]),
            (&[0.1, 0.09, 0.08], &[STABLE, STABLE, STABLE]),
            (&[0.04, 0.05, 0.051, 0.052, 0.01], &[STABLE, STABLE, SUPPRESS, SUPPRESS, STABLE]),
        ];
        // Windows of equal length: the divergences compare as they are.
        for (ds, want) in cases {
            for k in [1, 100] {
                let mut g = TrendGuard::new(0.05);
                let got: Vec<Verdict> = ds.iter().map(|&d| g.report(d, k)).collect();
                assert_eq!(got, want, "{ds:?} at k_max {k}");
            }
        }
        let mut g = TrendGuard::new(0.05);
        for d in [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] {
            g.report(d, 4);
        }
        assert_eq!(g.history().collect::<Vec<_>>(), vec![1.0, 1.5, 2.0, 2.5, 3.0]);
    }

    /// A window's divergence and its longest rank's steps.
    type Window = (f64, u64);

    /// Growing windows: a divergence that rises by the window's √k (a random walk's spread) is no
    /// trend; one that rises faster is, once above the threshold.
    #[test]
    fn trend_guard_judges_divergence_per_root_step() {
        // (divergence, k_max) per reduce: windows doubling from 16 steps.
        let cases: [(&[Window], &[Verdict]); 4] = [
            // D about ∝ √k: per √step 0.025, 0.0249, 0.025, 0.0248.
            (&[(0.1, 16), (0.141, 32), (0.2, 64), (0.28, 128)], &[STABLE; 4]),
            // D slower than √k (what the slow-link run measured).
            (&[(0.12, 16), (0.13, 32), (0.15, 64), (0.17, 128)], &[STABLE; 4]),
            // D ∝ k: drifting apart faster than a random walk.
            (
                &[(0.06, 16), (0.12, 32), (0.24, 64), (0.48, 128)],
                &[STABLE, STABLE, SUPPRESS, SUPPRESS],
            ),
            // D ∝ k but below the threshold: no matter.
            (&[(0.001, 16), (0.002, 32), (0.004, 64)], &[STABLE; 3]),
        ];
        for (reports, want) in cases {
            let mut g = TrendGuard::new(0.05);
            let got: Vec<Verdict> = reports.iter().map(|&(d, k)| g.report(d, k)).collect();
            assert_eq!(got, want, "{reports:?}");
        }
    }

    /// Divergences growing by `e^(rate·k)` per reduce of `k` steps: λ = rate exactly.
    fn growing(rate: f64, k: u64, n: usize) -> Vec<ReduceReport> {
        (0..n)
            .map(|i| ReduceReport {
                divergence: 0.01 * (rate * k as f64 * i as f64).exp(),
                k_max: k,
            })
            .collect()
    }

    #[test]
    fn growth_guard_sequences() {
        // λ = 0.02 > 1e-2: nudge on the 3rd rate (4th report); the suppress streak, not reset by the
        // nudge, fires on the next report; then the pattern repeats.
        let mut g = GrowthGuard::new();
        let got: Vec<Verdict> = growing(0.02, 10, 8).iter().map(|r| g.report(r)).collect();
        assert_eq!(got, [STABLE, STABLE, STABLE, NUDGE, SUPPRESS, STABLE, NUDGE, SUPPRESS]);
        let lambda = g.lambda().unwrap_or(0.0);
        assert!((lambda - 0.02).abs() < 1e-12, "bias-corrected EMA of a constant rate: {lambda}");
        // λ = 0.005: suppress every third rate.
        let mut g = GrowthGuard::new();
        let got: Vec<Verdict> = growing(0.005, 10, 7).iter().map(|r| g.report(r)).collect();
        assert_eq!(got, [STABLE, STABLE, STABLE, SUPPRESS, STABLE, STABLE, SUPPRESS]);
        // Shrinking divergence: always stable.
        let mut g = GrowthGuard::new();
        assert!(growing(-0.05, 10, 10).iter().all(|r| g.report(r) == STABLE));
    }

    #[test]
    fn growth_chain_breaks_on_tiny_divergence() {
        let mut g = GrowthGuard::new();
        let mut reports = growing(0.02, 10, 3);
        reports.push(ReduceReport { divergence: 1e-9, k_max: 10 });
        reports.extend(growing(0.02, 10, 3));
        let got: Vec<Verdict> = reports.iter().map(|r| g.report(r)).collect();
        // Two rates, a break (streaks reset), a fresh start without a rate, two rates: never three.
        assert_eq!(got, [STABLE; 7]);
        // The first rate after the break: the EMA keeps its history, only the streaks restarted.
        let lambda = g.lambda().unwrap_or(0.0);
        assert!((lambda - 0.02).abs() < 1e-12);
    }

    #[test]
    fn combined_guard_takes_the_more_severe() {
        assert_eq!(more_severe(STABLE, SUPPRESS), SUPPRESS);
        assert_eq!(more_severe(NUDGE, SUPPRESS), NUDGE);
        assert_eq!(
            more_severe(Verdict::NudgeDown { factor: 0.7 }, Verdict::NudgeDown { factor: 0.3 }),
            Verdict::NudgeDown { factor: 0.3 }
        );
        let mut off = Guard::Off;
        let mut both = Guard::standard(false);
        let got: Vec<Verdict> = growing(0.02, 10, 4).iter().map(|r| both.report(r)).collect();
        // Divergences 0.01, 0.0122, 0.0149, 0.0182 stay below the trend threshold: growth rule only.
        assert_eq!(got, [STABLE, STABLE, STABLE, NUDGE]);
        assert!(growing(0.02, 10, 4).iter().all(|r| off.report(r) == STABLE));
    }

    #[test]
    fn guard_state_round_trips() -> TestResult {
        let mut g = Guard::standard(true);
        for r in growing(0.004, 5, 4) {
            g.report(&r);
        }
        // bincode keeps every f64 bit (serde_json's default float parsing may not).
        let bytes = bincode::serde::encode_to_vec(&g, bincode::config::standard())?;
        let (mut back, _): (Guard, usize) =
            bincode::serde::decode_from_slice(&bytes, bincode::config::standard())?;
        assert_eq!(back, g);
        let next = ReduceReport { divergence: 1.0, k_max: 5 };
        assert_eq!(back.report(&next), g.report(&next));
        Ok(())
    }

    #[test]
    fn elche_obeys_the_guard() -> TestResult {
        let mut el = ElChe::new(2, 40)?;
        el.report_timing(&[160.0, 400.0], &[40, 40], 0.0)?;
        let mut guard = Guard::Growth(GrowthGuard::new());
        let mut anchors = Vec::new();
        for r in growing(0.02, 40, 4) {
            el.apply_verdict(guard.report(&r));
            anchors.push(el.anchor());
        }
        assert_eq!(anchors, [40, 40, 40, 20]);
        assert_eq!(el.counts(), &[50, 20]);
        Ok(())
    }
}

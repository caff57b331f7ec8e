//! The divergence guard: per-reduce divergence of the replicas, and the verdict ElChe obeys.
//!
//! At each reduce every rank measures how far its replica had drifted from the consensus,
//! `D_r = ‖W_pre − W_post‖ / ‖W_post‖` ([`divergence`]); the guard sees `max_r D_r` and the
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
pub const MIN_DIVERGENCE: f64 = 1e-8;
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
pub fn divergence(diff_norm: f64, post_norm: f64) -> f64 {
    if post_norm < MIN_POST_NORM || !post_norm.is_finite() || !diff_norm.is_finite() {
        0.0
    } else {
        diff_norm / post_norm
    }
}

/// The cosine between `W_pre` and `W_post` from their norms and the divergence
/// (`(pre² + post² − (D·post)²) / (2·pre·post)`, law of cosines), or `None` when a norm is 0.
pub fn cosine(pre_norm: f64, post_norm: f64, divergence: f64) -> Option<f64> {
    if pre_norm <= 0.0 || post_norm <= 0.0 {
        return None;
    }
    let d = divergence * post_norm;
    Some((pre_norm * pre_norm + post_norm * post_norm - d * d) / (2.0 * pre_norm * post_norm))
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
pub fn more_severe(a: Verdict, b: Verdict) -> Verdict {
    match (a, b) {
        (Verdict::NudgeDown { factor: x }, Verdict::NudgeDown { factor: y }) => {
            Verdict::NudgeDown { factor: x.min(y) }
        }
        (n @ Verdict::NudgeDown { .. }, _) | (_, n @ Verdict::NudgeDown { .. }) => n,
        (Verdict::SuppressGrowth, _) | (_, Verdict::SuppressGrowth) => Verdict::SuppressGrowth,
        _ => Verdict::Stable,
    }
}

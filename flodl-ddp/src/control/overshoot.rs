//! The `Async` overshoot bound: how many batches past its window a rank may train before it waits.

use serde::{Deserialize, Serialize};

use crate::control::verdict::Verdict;

/// Hard ceiling of the overshoot, whatever the configuration.
pub(crate) const OVERSHOOT_CEILING: usize = 15;

/// How the bound is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OvershootMode {
    /// Starts at `initial`, grows by one per `Stable` reduce up to `cap`, resets on `NudgeDown`.
    Auto {
        /// Starting (and reset) value: `clamp(epoch_batches / 100, 2, 5)`.
        initial: usize,
        /// Growth cap: `clamp(epoch_batches / 50, 3, 10)`.
        cap: usize,
    },
    /// A user value, never changed by verdicts.
    Fixed,
}

/// The overshoot bound (`max_overshoot`) and its auto-sizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overshoot {
    mode: OvershootMode,
    current: usize,
}

impl Overshoot {
    /// Auto-sized from the number of batches in one epoch.
    pub fn auto(epoch_batches: usize) -> Overshoot {
        let initial = (epoch_batches / 100).clamp(2, 5);
        let cap = (epoch_batches / 50).clamp(3, 10).min(OVERSHOOT_CEILING);
        Overshoot { mode: OvershootMode::Auto { initial, cap }, current: initial }
    }

    /// A fixed bound (at most `OVERSHOOT_CEILING`).
    pub fn fixed(batches: usize) -> Overshoot {
        Overshoot { mode: OvershootMode::Fixed, current: batches.min(OVERSHOOT_CEILING) }
    }

    /// How the bound is chosen.
    pub fn mode(&self) -> OvershootMode {
        self.mode
    }

    /// Batches a rank may train past its window count.
    pub fn current(&self) -> usize {
        self.current
    }

    /// Follows the guard: `Stable` grows an auto bound by one (up to its cap), `NudgeDown`
    /// resets it, `SuppressGrowth` holds it.
    pub fn apply_verdict(&mut self, verdict: Verdict) {
        if let OvershootMode::Auto { initial, cap } = self.mode {
            match verdict {
                Verdict::Stable => self.current = (self.current + 1).min(cap),
                Verdict::SuppressGrowth => {}
                Verdict::NudgeDown { .. } => self.current = initial,
            }
        }
    }

    /// True when a rank that trained `steps` batches since the last reduce, with a window of
    /// `count`, may be given more work.
    pub fn allows(&self, steps: usize, count: usize) -> bool {
        steps < count + self.current
    }
}

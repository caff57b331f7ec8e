//! Learning-rate schedules as pure functions of the cohort step, and the linear scaling rule.
//!
//! The step a schedule is indexed by is the *cohort step*: the global step the coordinator
//! accumulates at each reduce (`Σ` over ranks of the steps trained in the window) plus the steps
//! this rank trained since (`cohort_step`). So a schedule advances with the total number of
//! batches the cohort trained, whatever the world size or speed skew.

use std::f64::consts::PI;

use serde::{Deserialize, Serialize};

use crate::control::logic_error::{LogicError, LogicResult};

/// Default fraction of a one-cycle run spent warming up.
pub(crate) const ONE_CYCLE_WARMUP: f64 = 0.3;
/// Default ratio of a one-cycle peak to its starting rate.
pub(crate) const ONE_CYCLE_DIV: f64 = 25.0;
/// Default ratio of a one-cycle starting rate to its final rate.
pub(crate) const ONE_CYCLE_FINAL_DIV: f64 = 1e4;

/// A learning-rate schedule: `lr(step)` is a pure function of the cohort step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Schedule {
    /// `lr` at every step.
    Constant {
        /// The rate.
        lr: f64,
    },
    /// `lr · gamma^floor(step / every)`.
    Step {
        /// Starting rate.
        lr: f64,
        /// Steps between decays (at least 1).
        every: u64,
        /// Decay factor.
        gamma: f64,
    },
    /// `lr · gamma^k`, `k` = number of milestones ≤ step.
    MultiStep {
        /// Starting rate.
        lr: f64,
        /// Steps at which the rate decays (any order).
        milestones: Vec<u64>,
        /// Decay factor.
        gamma: f64,
    },
    /// `lr · gamma^step`.
    Exponential {
        /// Starting rate.
        lr: f64,
        /// Decay factor per step.
        gamma: f64,
    },
    /// `min_lr + (lr − min_lr)·(1 + cos(π·min(step, total)/total))/2`.
    Cosine {
        /// Starting rate.
        lr: f64,
        /// Rate at and after `total`.
        min_lr: f64,
        /// Steps of the descent (at least 1).
        total: u64,
    },
    /// One cycle: linear rise from `max_lr/div` to `max_lr` over `warmup·total` steps, then a
    /// cosine descent to `max_lr/(div·final_div)` at `total` (held after).
    OneCycle {
        /// Peak rate.
        max_lr: f64,
        /// Steps of the whole cycle (at least 1).
        total: u64,
        /// Fraction of `total` spent rising, in (0, 1).
        warmup: f64,
        /// Peak / starting rate.
        div: f64,
        /// Starting / final rate.
        final_div: f64,
    },
    /// Linear warmup `(step + 1)/steps · inner.lr(0)` for `steps` steps, then
    /// `inner.lr(step − steps)`.
    Warmup {
        /// Warmup steps (0 disables the warmup).
        steps: u64,
        /// The schedule after warmup.
        inner: Box<Schedule>,
    },
}

impl Schedule {
    /// A one-cycle schedule with the usual defaults (30% warmup, div 25, final div 1e4).
    pub fn one_cycle(max_lr: f64, total: u64) -> Schedule {
        Schedule::OneCycle {
            max_lr,
            total,
            warmup: ONE_CYCLE_WARMUP,
            div: ONE_CYCLE_DIV,
            final_div: ONE_CYCLE_FINAL_DIV,
        }
    }

    /// This schedule behind a linear warmup of `steps` steps.
    pub fn with_warmup(self, steps: u64) -> Schedule {
        Schedule::Warmup { steps, inner: Box::new(self) }
    }

    /// Checks every parameter: rates finite and ≥ 0, factors finite and > 0, periods ≥ 1,
    /// one-cycle warmup in (0, 1).
    ///
    /// # Errors
    /// [`LogicError::InvalidValue`] naming the first bad parameter.
    pub fn validate(&self) -> LogicResult<()> {
        let rate = |what, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(LogicError::InvalidValue { what, value: v })
            }
        };
        let factor = |what, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(LogicError::InvalidValue { what, value: v })
            }
        };
        let period = |what, v: u64| {
            if v >= 1 { Ok(()) } else { Err(LogicError::InvalidValue { what, value: 0.0 }) }
        };
        match self {
            Schedule::Constant { lr } => rate("lr", *lr),
            Schedule::Step { lr, every, gamma } => {
                rate("lr", *lr)?;
                period("step every", *every)?;
                factor("gamma", *gamma)
            }
            Schedule::MultiStep { lr, gamma, .. } | Schedule::Exponential { lr, gamma } => {
                rate("lr", *lr)?;
                factor("gamma", *gamma)
            }
            Schedule::Cosine { lr, min_lr, total } => {
                rate("lr", *lr)?;
                rate("min lr", *min_lr)?;
                period("cosine total", *total)
            }
            Schedule::OneCycle { max_lr, total, warmup, div, final_div } => {
                rate("max lr", *max_lr)?;
                period("one-cycle total", *total)?;
                factor("one-cycle div", *div)?;
                factor("one-cycle final div", *final_div)?;
                if *warmup > 0.0 && *warmup < 1.0 {
                    Ok(())
                } else {
                    Err(LogicError::InvalidValue {
                        what: "one-cycle warmup fraction",
                        value: *warmup,
                    })
                }
            }
            Schedule::Warmup { inner, .. } => inner.validate(),
        }
    }

    /// The rate at cohort step `step`.
    pub fn lr(&self, step: u64) -> f64 {
        match self {
            Schedule::Constant { lr } => *lr,
            Schedule::Step { lr, every, gamma } => lr * gamma.powf((step / (*every).max(1)) as f64),
            Schedule::MultiStep { lr, milestones, gamma } => {
                lr * gamma.powf(milestones.iter().filter(|&&m| m <= step).count() as f64)
            }
            Schedule::Exponential { lr, gamma } => lr * gamma.powf(step as f64),
            Schedule::Cosine { lr, min_lr, total } => {
                let t = step.min(*total) as f64 / (*total).max(1) as f64;
                min_lr + (lr - min_lr) * (1.0 + (PI * t).cos()) / 2.0
            }
            Schedule::OneCycle { max_lr, total, warmup, div, final_div } => {
                let start = max_lr / div;
                let end = start / final_div;
                let total = (*total).max(1) as f64;
                let rise = (warmup * total).max(1.0);
                let s = (step as f64).min(total);
                if s < rise {
                    start + (max_lr - start) * s / rise
                } else {
                    let t = ((s - rise) / (total - rise).max(1.0)).min(1.0);
                    end + (max_lr - end) * (1.0 + (PI * t).cos()) / 2.0
                }
            }
            Schedule::Warmup { steps, inner } => {
                if step < *steps {
                    (step + 1) as f64 / *steps as f64 * inner.lr(0)
                } else {
                    inner.lr(step - steps)
                }
            }
        }
    }
}

/// The linear scaling rule: `1 + (world − 1)·ratio` when `world > 1` and `ratio > 0`, else 1.
pub(crate) fn lr_scale(world: usize, ratio: f64) -> f64 {
    if world > 1 && ratio > 0.0 && ratio.is_finite() {
        1.0 + (world - 1) as f64 * ratio
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    //! LR schedules, cohort steps and the linear scaling rule against hand-computed values.

    use crate::LogicError;
    use crate::control::schedule::{Schedule, lr_scale};
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn check(schedule: &Schedule, cases: &[(u64, f64)]) {
        for &(step, want) in cases {
            let got = schedule.lr(step);
            assert!(
                (got - want).abs() <= 1e-12 * want.abs().max(1.0),
                "{schedule:?} step {step}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn schedules_by_hand() -> TestResult {
        check(&Schedule::Constant { lr: 0.1 }, &[(0, 0.1), (1_000_000, 0.1)]);
        check(
            &Schedule::Step { lr: 0.1, every: 10, gamma: 0.5 },
            &[(0, 0.1), (9, 0.1), (10, 0.05), (25, 0.025)],
        );
        check(
            &Schedule::MultiStep { lr: 1.0, milestones: vec![30, 10], gamma: 0.1 },
            &[(9, 1.0), (10, 0.1), (29, 0.1), (30, 0.01)],
        );
        check(&Schedule::Exponential { lr: 2.0, gamma: 0.5 }, &[(0, 2.0), (3, 0.25)]);
        check(
            &Schedule::Cosine { lr: 1.0, min_lr: 0.0, total: 100 },
            &[(0, 1.0), (50, 0.5), (100, 0.0), (200, 0.0)],
        );
        check(&Schedule::Cosine { lr: 1.0, min_lr: 0.1, total: 100 }, &[(50, 0.55)]);
        check(
            &Schedule::Constant { lr: 0.8 }.with_warmup(4),
            &[(0, 0.2), (1, 0.4), (3, 0.8), (4, 0.8), (40, 0.8)],
        );
        check(
            &Schedule::Step { lr: 1.0, every: 2, gamma: 0.5 }.with_warmup(5),
            &[(0, 0.2), (4, 1.0), (5, 1.0), (7, 0.5)],
        );
        // Peak 1, start 0.04, end 4e-6; rise over 30 steps, cosine over 70.
        check(
            &Schedule::one_cycle(1.0, 100),
            &[(0, 0.04), (15, 0.52), (30, 1.0), (65, 0.500002), (100, 4e-6), (1000, 4e-6)],
        );
        Ok(())
    }

    #[test]
    fn step_schedules_match_repeated_multiplication() -> TestResult {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(9);
        for _ in 0..500 {
            let lr = rng.random_range(1e-4..1.0);
            let gamma = rng.random_range(0.1..1.0);
            let every = rng.random_range(1..50u64);
            let step = rng.random_range(0..2000u64);
            let mut reference = lr;
            for s in 1..=step {
                if s % every == 0 {
                    reference *= gamma;
                }
            }
            let got = Schedule::Step { lr, every, gamma }.lr(step);
            assert!(
                (got - reference).abs() <= 1e-9 * reference.max(1e-300),
                "{got} vs {reference}"
            );
            let mut exp = lr;
            for _ in 0..step.min(200) {
                exp *= gamma;
            }
            let e = Schedule::Exponential { lr, gamma }.lr(step.min(200));
            assert!((e - exp).abs() <= 1e-9 * exp.max(1e-300));
            // Cosine stays within [min, lr] and never rises.
            let total = rng.random_range(1..500u64);
            let cos = Schedule::Cosine { lr, min_lr: lr / 10.0, total };
            let (a, b) = (cos.lr(step), cos.lr(step + 1));
            assert!(b <= a + 1e-15 && a <= lr + 1e-15 && a >= lr / 10.0 - 1e-15);
        }
        Ok(())
    }

    #[test]
    fn validation_and_serde() -> TestResult {
        let bad = [
            Schedule::Constant { lr: -1.0 },
            Schedule::Step { lr: 0.1, every: 0, gamma: 0.5 },
            Schedule::Exponential { lr: 0.1, gamma: f64::NAN },
            Schedule::Cosine { lr: 0.1, min_lr: 0.0, total: 0 },
            Schedule::OneCycle { max_lr: 0.1, total: 10, warmup: 1.0, div: 25.0, final_div: 1e4 },
            Schedule::Constant { lr: f64::INFINITY }.with_warmup(3),
        ];
        for s in bad {
            assert!(matches!(s.validate(), Err(LogicError::InvalidValue { .. })), "{s:?}");
        }
        let good = Schedule::one_cycle(0.05, 1000).with_warmup(10);
        good.validate()?;
        let json = serde_json::to_string(&good)?;
        assert_eq!(serde_json::from_str::<Schedule>(&json)?, good);
        Ok(())
    }

    #[test]
    fn linear_scaling_by_hand() {
        let cases = [(4, 1.0, 4.0), (4, 0.5, 2.5), (1, 1.0, 1.0), (4, 0.0, 1.0), (3, -1.0, 1.0)];
        for (w, ratio, want) in cases {
            assert_eq!(lr_scale(w, ratio), want, "world {w} ratio {ratio}");
        }
    }
}

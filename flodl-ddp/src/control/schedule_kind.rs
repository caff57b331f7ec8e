//! The learning-rate schedules by name, as a run's settings give them; [`ScheduleKind::build`]
//! makes the [`Schedule`] once the run's length in cohort steps is known.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::control::schedule::Schedule;

/// A learning-rate schedule by name, spanning the whole run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduleKind {
    /// The rate throughout.
    Constant,
    /// A cosine from the rate down to 0 at the end.
    Cosine,
    /// Warm up to the rate (again), then anneal.
    OneCycle,
    /// The rate divided by 10 at half and at three quarters.
    Step,
    /// A constant factor per step, down to 1% at the end.
    Exponential,
}

impl ScheduleKind {
    /// Every schedule, in the order help texts name them.
    pub const ALL: [ScheduleKind; 5] = [
        ScheduleKind::Constant,
        ScheduleKind::Cosine,
        ScheduleKind::OneCycle,
        ScheduleKind::Step,
        ScheduleKind::Exponential,
    ];

    /// The schedule's name (`one-cycle`).
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::Constant => "constant",
            ScheduleKind::Cosine => "cosine",
            ScheduleKind::OneCycle => "one-cycle",
            ScheduleKind::Step => "step",
            ScheduleKind::Exponential => "exponential",
        }
    }

    /// The schedule over `total` cohort steps, peaking at `lr`, the first `warmup` of them a
    /// linear warmup; `None` = constant without warmup.
    pub fn build(self, lr: f64, total: u64, warmup: u64) -> Option<Schedule> {
        let total = total.max(1);
        let warmup = warmup.min(total - 1);
        let rest = total - warmup;
        let schedule = match self {
            ScheduleKind::Constant if warmup == 0 => return None,
            ScheduleKind::Constant => Schedule::Constant { lr },
            ScheduleKind::Cosine => Schedule::Cosine { lr, min_lr: 0.0, total: rest },
            ScheduleKind::OneCycle => Schedule::one_cycle(lr, rest),
            ScheduleKind::Step => {
                Schedule::MultiStep { lr, milestones: vec![rest / 2, rest * 3 / 4], gamma: 0.1 }
            }
            ScheduleKind::Exponential => {
                Schedule::Exponential { lr, gamma: 0.01f64.powf(1.0 / rest as f64) }
            }
        };
        Some(if warmup > 0 { schedule.with_warmup(warmup) } else { schedule })
    }
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScheduleKind {
    type Err = String;

    /// The name as `Display` writes it.
    fn from_str(s: &str) -> Result<Self, String> {
        let name = s.trim().to_ascii_lowercase();
        ScheduleKind::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| {
            format!("schedule '{s}': expected constant, cosine, one-cycle, step or exponential")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_peak_at_lr_and_end_where_named() -> Result<(), String> {
        // The flag, the file and summary.json spell a schedule alike.
        for kind in ScheduleKind::ALL {
            assert_eq!(kind.to_string().parse::<ScheduleKind>(), Ok(kind));
            assert_eq!(serde_json::to_value(kind).map_err(|e| e.to_string())?, kind.to_string());
        }
        let total = 1000;
        assert!(ScheduleKind::Constant.build(0.05, total, 0).is_none());
        let cases = [
            (ScheduleKind::Cosine, 0, 0.05, 0.0),
            (ScheduleKind::Step, 0, 0.05, 0.0005),
            (ScheduleKind::OneCycle, 0, 0.05 / 25.0, 0.0),
            (ScheduleKind::Exponential, 0, 0.05, 0.0005),
            (ScheduleKind::Constant, 100, 0.05 / 100.0, 0.05),
            (ScheduleKind::Cosine, 100, 0.05 / 100.0, 0.0),
            (ScheduleKind::Exponential, 250, 0.05 / 250.0, 0.0005),
        ];
        for (kind, warmup, first, last) in cases {
            let s = kind.build(0.05, total, warmup).ok_or(format!("{kind}: none"))?;
            let peak = (0..=total).map(|t| s.lr(t)).fold(0.0, f64::max);
            assert!((peak - 0.05).abs() < 1e-9, "{kind}: peak {peak}");
            assert!((s.lr(0) - first).abs() < 1e-9, "{kind}: first {}", s.lr(0));
            assert!((s.lr(total) - last).abs() < 1e-6, "{kind}: last {}", s.lr(total));
        }
        Ok(())
    }
}

//! A rank whose speed changes for part of a run (a device throttled, or shared for a while): an
//! emulation for benches and tests, a pure function of the run's progress in cohort steps.

use std::fmt;
use std::str::FromStr;

/// Rank `rank` runs `factor` times slower than its own slowdown from `from` to `until` of the
/// run (fractions of the run's cohort steps, `0 <= from < until <= 1`), then as before. Its
/// text is `RANK:FACTOR@FROM-UNTIL` (`1:3@0.3-0.6`: rank 1, three times slower from 30% to
/// 60% of the run).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeedChange {
    /// The rank that changes speed.
    pub rank: usize,
    /// How many times slower it runs meanwhile (on top of its slowdown).
    pub factor: f64,
    /// Where the change starts, as a fraction of the run.
    pub from: f64,
    /// Where it ends, as a fraction of the run.
    pub until: f64,
}

impl SpeedChange {
    /// The extra factor of `rank` at `progress` (the fraction of the run's cohort steps done)
    /// under `changes`: the product of those in force, 1 when none is.
    pub fn factor_at(changes: &[SpeedChange], rank: usize, progress: f64) -> f64 {
        changes
            .iter()
            .filter(|c| c.rank == rank && (c.from..c.until).contains(&progress))
            .map(|c| c.factor)
            .product()
    }

    /// `None` when the change is well formed for a run of `ranks` ranks, else what is wrong
    /// with it.
    pub fn problem(&self, ranks: usize) -> Option<&'static str> {
        if self.rank >= ranks {
            Some("a rank of the run")
        } else if !(self.factor.is_finite() && self.factor >= 1.0) {
            Some("a factor >= 1 (1 = unchanged)")
        } else if !((0.0..self.until).contains(&self.from) && self.until <= 1.0) {
            Some("0 <= from < until <= 1 (fractions of the run)")
        } else {
            None
        }
    }
}

impl fmt::Display for SpeedChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}@{}-{}", self.rank, self.factor, self.from, self.until)
    }
}

impl FromStr for SpeedChange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let form = || format!("'{s}' is not RANK:FACTOR@FROM-UNTIL (e.g. 1:3@0.3-0.6)");
        let (rank, rest) = s.trim().split_once(':').ok_or_else(form)?;
        let (factor, span) = rest.split_once('@').ok_or_else(form)?;
        let (from, until) = span.split_once('-').ok_or_else(form)?;
        Ok(SpeedChange {
            rank: rank.trim().parse().map_err(|_| form())?,
            factor: factor.trim().parse().map_err(|_| form())?,
            from: from.trim().parse().map_err(|_| form())?,
            until: until.trim().parse().map_err(|_| form())?,
        })
    }
}

impl serde::Serialize for SpeedChange {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for SpeedChange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

    #[test]
    fn text_round_trips_and_bad_text_is_refused() -> Result<()> {
        let c: SpeedChange = "1:3@0.3-0.6".parse()?;
        assert_eq!(c, SpeedChange { rank: 1, factor: 3.0, from: 0.3, until: 0.6 });
        assert_eq!(c.to_string().parse::<SpeedChange>()?, c);
        for bad in ["", "1:3", "1@0.3-0.6", "x:3@0.3-0.6", "1:3@0.3", "1:3@a-0.6", "-1:3@0-1"] {
            assert!(bad.parse::<SpeedChange>().is_err(), "{bad}");
        }
        Ok(())
    }

    #[test]
    fn the_factor_holds_only_inside_its_span_and_rank() {
        let changes = [
            SpeedChange { rank: 1, factor: 3.0, from: 0.25, until: 0.5 },
            SpeedChange { rank: 1, factor: 2.0, from: 0.4, until: 0.6 },
        ];
        let cases = [
            (1, 0.0, 1.0),
            (1, 0.25, 3.0),
            (1, 0.45, 6.0),
            (1, 0.5, 2.0),
            (1, 0.6, 1.0),
            (0, 0.3, 1.0),
        ];
        for (rank, progress, want) in cases {
            assert_eq!(SpeedChange::factor_at(&changes, rank, progress), want, "{rank} {progress}");
        }
    }

    #[test]
    fn a_change_is_checked_against_the_run() {
        let ok = SpeedChange { rank: 1, factor: 3.0, from: 0.3, until: 0.6 };
        let cases = [
            (ok, None),
            (SpeedChange { rank: 2, ..ok }, Some("a rank of the run")),
            (SpeedChange { factor: 0.5, ..ok }, Some("a factor >= 1 (1 = unchanged)")),
            (SpeedChange { factor: f64::NAN, ..ok }, Some("a factor >= 1 (1 = unchanged)")),
            (
                SpeedChange { from: 0.6, ..ok },
                Some("0 <= from < until <= 1 (fractions of the run)"),
            ),
            (
                SpeedChange { until: 1.5, ..ok },
                Some("0 <= from < until <= 1 (fractions of the run)"),
            ),
            (
                SpeedChange { from: -0.1, ..ok },
                Some("0 <= from < until <= 1 (fractions of the run)"),
            ),
        ];
        for (change, want) in cases {
            assert_eq!(change.problem(2), want, "{change}");
        }
    }
}

//! The committed baseline (benches/baseline.json) and the comparison that flags regressions.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::criterion_result::BenchResult;

/// The baseline file's format version.
const VERSION: u32 = 1;

/// Reference times per benchmark, with where they were measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Baseline {
    /// Format version.
    pub(crate) version: u32,
    /// The machine the times come from (cores, CPU model): compare like with like.
    pub(crate) host: String,
    /// When it was last saved (UTC).
    pub(crate) saved: String,
    /// Time per iteration by criterion id.
    pub(crate) benchmarks: BTreeMap<String, Reference>,
}

/// One benchmark's reference time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Reference {
    /// Typical time per iteration, in ns.
    pub(crate) time_ns: f64,
    /// Lower end of its 95% interval, in ns.
    pub(crate) low_ns: f64,
    /// Upper end of its 95% interval, in ns.
    pub(crate) high_ns: f64,
}

/// How a result compares with the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    /// Not in the baseline.
    New,
    /// Within the threshold.
    Unchanged,
    /// Faster by more than the threshold.
    Improved,
    /// Slower by more than the threshold.
    Regressed,
}

/// A result set against its reference.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Comparison {
    /// The reference time, if any, in ns.
    pub(crate) baseline_ns: Option<f64>,
    /// Change of the time in percent (positive: slower).
    pub(crate) change_pct: Option<f64>,
    /// The verdict.
    pub(crate) status: Status,
}

impl Baseline {
    /// Reads a baseline; a missing file is an empty baseline.
    ///
    /// # Errors
    /// When the file exists but cannot be read or parsed.
    pub(crate) fn load(path: &Path) -> Result<Baseline> {
        match fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("bad baseline {}", path.display())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Baseline::default()),
            Err(error) => Err(error).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Writes the baseline as pretty JSON.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub(crate) fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)? + "\n";
        fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
    }

    /// This baseline with `results` recorded over it (other entries are kept).
    pub(crate) fn updated(&self, results: &[BenchResult], host: &str, saved: &str) -> Baseline {
        let mut benchmarks = self.benchmarks.clone();
        for result in results {
            let reference = Reference {
                time_ns: result.time_ns,
                low_ns: result.low_ns,
                high_ns: result.high_ns,
            };
            benchmarks.insert(result.id.clone(), reference);
        }
        Baseline { version: VERSION, host: host.to_string(), saved: saved.to_string(), benchmarks }
    }

    /// Compares a time with this baseline's reference for `id`.
    pub(crate) fn compare(&self, id: &str, time_ns: f64, threshold_pct: f64) -> Comparison {
        let Some(reference) = self.benchmarks.get(id) else {
            return Comparison { baseline_ns: None, change_pct: None, status: Status::New };
        };
        let change_pct = (time_ns / reference.time_ns - 1.0) * 100.0;
        let status = if change_pct > threshold_pct {
            Status::Regressed
        } else if change_pct < -threshold_pct {
            Status::Improved
        } else {
            Status::Unchanged
        };
        Comparison { baseline_ns: Some(reference.time_ns), change_pct: Some(change_pct), status }
    }

    /// Baseline ids that `results` lacks (not run this time, or renamed).
    pub(crate) fn absent_from(&self, results: &[BenchResult]) -> Vec<String> {
        self.benchmarks.keys().filter(|id| !results.iter().any(|r| &r.id == *id)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::criterion_result::tests::{benchmark_json, estimates_json};

    fn result(function: &str, mean: f64) -> Result<BenchResult> {
        BenchResult::parse(
            &benchmark_json("kernels", function, "1", "null"),
            &estimates_json(mean, None),
        )
    }

    #[test]
    fn changes_beyond_the_threshold_are_flagged() -> Result<()> {
        let baseline = Baseline::default().updated(
            &[result("a", 100.0)?],
            "test host",
            "2026-12-02T00:00:00Z",
        );
        let cases = [
            (100.0, 10.0, Status::Unchanged, 0.0),
            (109.0, 10.0, Status::Unchanged, 9.0),
            (111.0, 10.0, Status::Regressed, 11.0),
            (150.0, 60.0, Status::Unchanged, 50.0),
            (89.0, 10.0, Status::Improved, -11.0),
            (95.0, 1.0, Status::Improved, -5.0),
        ];
        for (time, threshold, status, change) in cases {
            let comparison = baseline.compare("kernels/a/1", time, threshold);
            assert_eq!(comparison.status, status, "{time} at {threshold}%");
            assert_eq!(comparison.baseline_ns, Some(100.0));
            let got = comparison.change_pct.unwrap_or(f64::NAN);
            assert!((got - change).abs() < 1e-9, "{time}: {got} vs {change}");
        }
        let new = baseline.compare("kernels/b/1", 1.0, 10.0);
        assert_eq!((new.status, new.baseline_ns, new.change_pct), (Status::New, None, None));
        Ok(())
    }

    #[test]
    fn updates_merge_and_round_trip() -> Result<()> {
        let first =
            Baseline::default().updated(&[result("a", 100.0)?, result("b", 5.0)?], "h1", "t1");
        let second = first.updated(&[result("b", 7.0)?, result("c", 9.0)?], "h2", "t2");
        let times: Vec<(&str, f64)> =
            second.benchmarks.iter().map(|(k, v)| (k.as_str(), v.time_ns)).collect();
        assert_eq!(times, [("kernels/a/1", 100.0), ("kernels/b/1", 7.0), ("kernels/c/1", 9.0)]);
        assert_eq!(
            (second.host.as_str(), second.saved.as_str(), second.version),
            ("h2", "t2", VERSION)
        );
        assert_eq!(second.absent_from(&[result("b", 1.0)?]), ["kernels/a/1", "kernels/c/1"]);
        let path =
            std::env::temp_dir().join(format!("flodl-xtask-baseline-{}.json", std::process::id()));
        second.save(&path)?;
        let loaded = Baseline::load(&path);
        fs::remove_file(&path)?;
        assert_eq!(loaded?, second);
        assert_eq!(Baseline::load(&path)?, Baseline::default());
        Ok(())
    }
}

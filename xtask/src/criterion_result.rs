//! Criterion's saved results: `<criterion dir>/**/new/{benchmark,estimates}.json`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::quantity::RateUnit;

/// Criterion's throughput of one iteration, as `benchmark.json` stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Throughput {
    /// Bits per iteration.
    Bits(u64),
    /// Bytes per iteration (binary prefixes).
    Bytes(u64),
    /// Bytes per iteration (decimal prefixes).
    BytesDecimal(u64),
    /// Elements per iteration.
    Elements(u64),
    /// Elements and bytes per iteration.
    ElementsAndBytes {
        /// Elements per iteration.
        elements: u64,
        /// Bytes per iteration.
        bytes: u64,
    },
}

#[derive(Debug, Deserialize)]
struct BenchmarkJson {
    group_id: String,
    function_id: Option<String>,
    value_str: Option<String>,
    throughput: Option<Throughput>,
    full_id: String,
}

#[derive(Debug, Deserialize)]
struct Interval {
    lower_bound: f64,
    upper_bound: f64,
}

#[derive(Debug, Deserialize)]
struct Estimate {
    confidence_interval: Interval,
    point_estimate: f64,
}

#[derive(Debug, Deserialize)]
struct EstimatesJson {
    mean: Estimate,
    slope: Option<Estimate>,
    std_dev: Estimate,
}

/// One benchmark's latest result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct BenchResult {
    /// Criterion's full id (`kernels/cpu_axpy/1048576`).
    pub(crate) id: String,
    /// The group (`kernels`).
    pub(crate) group: String,
    /// The function id (`cpu_axpy`), empty when the group has none.
    pub(crate) function: String,
    /// The parameter (`1048576`), if any.
    pub(crate) parameter: Option<String>,
    /// Time per iteration: criterion's typical estimate (the slope, else the mean), in ns.
    pub(crate) time_ns: f64,
    /// The 95% confidence interval of that estimate, in ns.
    pub(crate) low_ns: f64,
    /// Upper end of the interval, in ns.
    pub(crate) high_ns: f64,
    /// Standard deviation of the samples, in ns.
    pub(crate) std_dev_ns: f64,
    /// Work per iteration, if the benchmark declared it.
    pub(crate) throughput: Option<Throughput>,
}

/// A throughput rate: how much per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rate {
    /// What is counted.
    pub(crate) unit: RateUnit,
    /// How many per second.
    pub(crate) per_second: f64,
}

impl BenchResult {
    /// Builds a result from the text of `benchmark.json` and `estimates.json`.
    ///
    /// # Errors
    /// When either is not criterion's JSON.
    pub(crate) fn parse(benchmark: &str, estimates: &str) -> Result<BenchResult> {
        let benchmark: BenchmarkJson =
            serde_json::from_str(benchmark).context("bad benchmark.json")?;
        let estimates: EstimatesJson =
            serde_json::from_str(estimates).context("bad estimates.json")?;
        let typical = estimates.slope.as_ref().unwrap_or(&estimates.mean);
        Ok(BenchResult {
            id: benchmark.full_id,
            group: benchmark.group_id,
            function: benchmark.function_id.unwrap_or_default(),
            parameter: benchmark.value_str,
            time_ns: typical.point_estimate,
            low_ns: typical.confidence_interval.lower_bound,
            high_ns: typical.confidence_interval.upper_bound,
            std_dev_ns: estimates.std_dev.point_estimate,
            throughput: benchmark.throughput,
        })
    }

    /// The throughput rate at `time_ns` per iteration (elements first when both are declared).
    pub(crate) fn rate_at(&self, time_ns: f64) -> Option<Rate> {
        let (unit, count) = match self.throughput.as_ref()? {
            Throughput::Bits(n) => (RateUnit::Bits, *n),
            Throughput::Bytes(n) => (RateUnit::BinaryBytes, *n),
            Throughput::BytesDecimal(n) => (RateUnit::Bytes, *n),
            Throughput::Elements(n) | Throughput::ElementsAndBytes { elements: n, .. } => {
                (RateUnit::of_elements(&self.function), *n)
            }
        };
        (time_ns > 0.0).then(|| Rate { unit, per_second: count as f64 / (time_ns * 1e-9) })
    }

    /// The throughput rate of this result.
    pub(crate) fn rate(&self) -> Option<Rate> {
        self.rate_at(self.time_ns)
    }
}

/// Every result under `dir` (sorted by group, function, then parameter, numbers numerically),
/// keeping only those written at or after `since` when given.
///
/// # Errors
/// When a result's JSON cannot be read or parsed.
pub(crate) fn read_results(dir: &Path, since: Option<SystemTime>) -> Result<Vec<BenchResult>> {
    let mut folders = Vec::new();
    find_new_folders(dir, &mut folders)?;
    let mut results = Vec::new();
    for folder in folders {
        let estimates_path = folder.join("estimates.json");
        if let Some(since) = since {
            let written = fs::metadata(&estimates_path)?.modified()?;
            if written < since {
                continue;
            }
        }
        let benchmark = fs::read_to_string(folder.join("benchmark.json"))?;
        let estimates = fs::read_to_string(&estimates_path)?;
        let result = BenchResult::parse(&benchmark, &estimates)
            .with_context(|| format!("in {}", folder.display()))?;
        results.push(result);
    }
    results
        .sort_by(|a, b| sort_key(a).partial_cmp(&sort_key(b)).unwrap_or(std::cmp::Ordering::Equal));
    Ok(results)
}

fn sort_key(result: &BenchResult) -> (&str, &str, f64, &str) {
    let parameter = result.parameter.as_deref().unwrap_or("");
    let size = parameter_size(parameter).unwrap_or(f64::INFINITY);
    (result.group.as_str(), result.function.as_str(), size, parameter)
}

/// The size a parameter names: a leading number times its suffix (`1M`, `64Ki`, `4096`).
pub(crate) fn parameter_size(parameter: &str) -> Option<f64> {
    let end =
        parameter.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(parameter.len());
    let number: f64 = parameter[..end].parse().ok()?;
    let multiplier = match parameter[end..].trim() {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(number * multiplier)
}

/// Folders named `new` holding both JSON files (criterion's `report` folders are skipped).
fn find_new_folders(dir: &Path, found: &mut Vec<PathBuf>) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error).with_context(|| format!("cannot read {}", dir.display())),
    };
    for entry in entries {
        let entry = entry?;
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let path = entry.path();
        let name = entry.file_name();
        if name == "new" {
            if path.join("benchmark.json").is_file() && path.join("estimates.json").is_file() {
                found.push(path);
            }
        } else if name != "report" && name != "base" && name != "change" {
            find_new_folders(&path, found)?;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A `benchmark.json` as criterion 0.8 writes it.
    pub(crate) fn benchmark_json(
        group: &str,
        function: &str,
        value: &str,
        throughput: &str,
    ) -> String {
        format!(
            r#"{{"group_id":"{group}","function_id":"{function}","value_str":"{value}","throughput":{throughput},"full_id":"{group}/{function}/{value}","directory_name":"{group}/{function}/{value}","title":"{group}/{function}/{value}"}}"#
        )
    }

    fn estimate(point: f64) -> String {
        format!(
            r#"{{"confidence_interval":{{"confidence_level":0.95,"lower_bound":{},"upper_bound":{}}},"point_estimate":{point},"standard_error":1.0}}"#,
            point * 0.9,
            point * 1.1
        )
    }

    /// An `estimates.json` as criterion 0.8 writes it; `slope` is null for flat sampling.
    pub(crate) fn estimates_json(mean: f64, slope: Option<f64>) -> String {
        let slope = slope.map_or("null".to_string(), estimate);
        format!(
            r#"{{"mean":{},"median":{},"median_abs_dev":{},"slope":{slope},"std_dev":{}}}"#,
            estimate(mean),
            estimate(mean),
            estimate(1.0),
            estimate(2.0)
        )
    }

    #[test]
    fn typical_is_the_slope_else_the_mean() -> Result<()> {
        let benchmark = benchmark_json("kernels", "cpu_axpy", "1024", r#"{"BytesDecimal":12288}"#);
        let with_slope = BenchResult::parse(&benchmark, &estimates_json(200.0, Some(100.0)))?;
        assert_eq!(with_slope.time_ns, 100.0);
        assert!(
            (with_slope.low_ns - 90.0).abs() < 1e-9 && (with_slope.high_ns - 110.0).abs() < 1e-9
        );
        let flat = BenchResult::parse(&benchmark, &estimates_json(200.0, None))?;
        assert_eq!(flat.time_ns, 200.0);
        assert_eq!(flat.id, "kernels/cpu_axpy/1024");
        assert_eq!((flat.group.as_str(), flat.function.as_str()), ("kernels", "cpu_axpy"));
        assert_eq!(flat.parameter.as_deref(), Some("1024"));
        assert_eq!(flat.std_dev_ns, 2.0);
        Ok(())
    }

    #[test]
    fn rates_follow_the_declared_throughput() -> Result<()> {
        let cases = [
            ("cpu_axpy", r#"{"BytesDecimal":1000}"#, Some((RateUnit::Bytes, 1e10))),
            ("cpu_copy", r#"{"Bytes":1000}"#, Some((RateUnit::BinaryBytes, 1e10))),
            ("cpu_net", r#"{"Bits":8}"#, Some((RateUnit::Bits, 8e7))),
            ("cuda0_gemm@flop", r#"{"Elements":2000}"#, Some((RateUnit::Flops, 2e10))),
            (
                "cpu_prefetch@sample",
                r#"{"ElementsAndBytes":{"elements":64,"bytes":50176}}"#,
                Some((RateUnit::Samples, 6.4e8)),
            ),
            ("cpu_plan", r#"{"Elements":5}"#, Some((RateUnit::Elements, 5e7))),
            ("cpu_plan", "null", None),
        ];
        for (function, throughput, want) in cases {
            let result = BenchResult::parse(
                &benchmark_json("g", function, "1", throughput),
                &estimates_json(100.0, None),
            )?;
            let got = result.rate().map(|r| (r.unit, r.per_second));
            match (got, want) {
                (Some((unit, rate)), Some((want_unit, want_rate))) => {
                    assert_eq!(unit, want_unit, "{function}");
                    assert!(
                        (rate / want_rate - 1.0).abs() < 1e-12,
                        "{function}: {rate} vs {want_rate}"
                    );
                }
                (got, want) => assert_eq!(got, want, "{function}"),
            }
        }
        Ok(())
    }

    #[test]
    fn parameter_sizes_read_suffixes() {
        let cases = [
            ("4096", Some(4096.0)),
            ("1M", Some(1e6)),
            ("10M", Some(1e7)),
            ("2.5k", Some(2500.0)),
            ("64Ki", Some(65536.0)),
            ("1Gi", Some(1073741824.0)),
            ("256x256", None),
            ("mlp", None),
            ("", None),
        ];
        for (parameter, want) in cases {
            assert_eq!(parameter_size(parameter), want, "{parameter}");
        }
    }

    #[test]
    fn results_are_found_under_new_folders_and_sorted() -> Result<()> {
        let dir =
            std::env::temp_dir().join(format!("flodl-xtask-criterion-{}", std::process::id()));
        let write = |path: &str, function: &str, value: &str, mean: f64| -> Result<()> {
            let folder = dir.join(path);
            fs::create_dir_all(&folder)?;
            fs::write(
                folder.join("benchmark.json"),
                benchmark_json("kernels", function, value, "null"),
            )?;
            fs::write(folder.join("estimates.json"), estimates_json(mean, None))?;
            Ok(())
        };
        let outcome = (|| -> Result<Vec<BenchResult>> {
            write("kernels/cpu_axpy/10M/new", "cpu_axpy", "10M", 3.0)?;
            write("kernels/cpu_axpy/65536/new", "cpu_axpy", "65536", 3.0)?;
            write("kernels/cpu_axpy/1M/new", "cpu_axpy", "1M", 3.0)?;
            write("kernels/cpu_axpy/1024/new", "cpu_axpy", "1024", 1.0)?;
            write("kernels/cpu_axpy/1024/base", "cpu_axpy", "1024", 9.0)?;
            write("kernels/cpu_add/64/new", "cpu_add", "64", 2.0)?;
            fs::create_dir_all(dir.join("report"))?;
            read_results(&dir, None)
        })();
        let missing = read_results(&dir.join("absent"), None);
        fs::remove_dir_all(&dir)?;
        let ids: Vec<String> = outcome?.into_iter().map(|r| r.id).collect();
        let want = [
            "kernels/cpu_add/64",
            "kernels/cpu_axpy/1024",
            "kernels/cpu_axpy/65536",
            "kernels/cpu_axpy/1M",
            "kernels/cpu_axpy/10M",
        ];
        assert_eq!(ids, want);
        assert!(missing?.is_empty());
        Ok(())
    }
}

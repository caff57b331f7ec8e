//! `cargo xtask bench-report`: run the criterion benches (or not), then write the dashboard.

use std::fs;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

use crate::baseline::Baseline;
use crate::criterion_result::read_results;
use crate::dashboard::Dashboard;
use crate::flags::BenchReportArgs;
use crate::workspace;

/// The bench package.
const BENCH_PACKAGE: &str = "flodl-benches";

/// Runs `cargo xtask bench-report`.
///
/// # Errors
/// When the benches fail, no results exist, a file cannot be written, or (with
/// `--fail-on-regression`) a benchmark regressed.
pub(crate) fn run(args: &BenchReportArgs) -> Result<()> {
    // Where criterion writes: `$CRITERION_HOME` when set, else `<target dir>/criterion`.
    let criterion_dir = std::env::var_os("CRITERION_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace::target_dir().join("criterion"));
    let since = if args.no_run {
        None
    } else {
        let started = SystemTime::now();
        run_benches(args)?;
        // Criterion writes each result once its benchmark ends; file times can be coarse.
        Some(started - Duration::from_secs(2))
    };
    let results = read_results(&criterion_dir, since)?;
    if results.is_empty() {
        bail!(
            "no criterion results under {} (run without --no-run, or check the filter)",
            criterion_dir.display()
        );
    }
    let baseline_path = args
        .baseline
        .clone()
        .unwrap_or_else(|| workspace::root().join("benches").join("baseline.json"));
    let baseline = Baseline::load(&baseline_path)?;
    let host = host_description();
    let now = utc_now();
    if args.save_baseline {
        baseline.updated(&results, &host, &now).save(&baseline_path)?;
        eprintln!("bench-report: saved {} results to {}", results.len(), baseline_path.display());
    }
    let shown_path =
        baseline_path.strip_prefix(workspace::root()).unwrap_or(&baseline_path).to_path_buf();
    let dashboard = Dashboard::new(results, &baseline, &shown_path, args.threshold, &host, &now);
    let out = args.out.clone().unwrap_or_else(|| workspace::target_dir().join("bench-report"));
    dashboard.write(&out)?;
    println!("{}", dashboard.markdown());
    eprintln!(
        "bench-report: {} benchmarks; wrote {}, summary.md, summary.json",
        dashboard.benchmarks.len(),
        out.join("index.html").display()
    );
    if args.fail_on_regression && !dashboard.regressions.is_empty() {
        bail!("{} benchmark(s) regressed beyond {}%", dashboard.regressions.len(), args.threshold);
    }
    Ok(())
}

/// The cargo arguments that run the selected benches with the criterion options.
pub(crate) fn bench_command(args: &BenchReportArgs) -> Vec<String> {
    let mut command: Vec<String> = vec!["bench".into(), "-p".into(), BENCH_PACKAGE.into()];
    if args.benches.is_empty() {
        // Only the bench targets: the lib's libtest harness would reject criterion's options.
        command.extend(["--bench".into(), "*".into()]);
    }
    for bench in &args.benches {
        command.extend(["--bench".into(), bench.clone()]);
    }
    command.push("--".into());
    if args.quick {
        command.push("--quick".into());
    }
    if let Some(seconds) = args.measurement_time {
        command.extend(["--measurement-time".into(), seconds.to_string()]);
    }
    if let Some(seconds) = args.warm_up_time {
        command.extend(["--warm-up-time".into(), seconds.to_string()]);
    }
    if let Some(n) = args.sample_size {
        command.extend(["--sample-size".into(), n.to_string()]);
    }
    command.push("--noplot".into());
    if let Some(filter) = &args.filter {
        command.push(filter.clone());
    }
    command
}

fn run_benches(args: &BenchReportArgs) -> Result<()> {
    let command = bench_command(args);
    eprintln!("== cargo {}", command.join(" "));
    let status = Command::new(workspace::cargo())
        .args(&command)
        .current_dir(workspace::root())
        .status()
        .context("cannot start cargo bench")?;
    if !status.success() {
        bail!("the benches failed (cargo {})", command.join(" "));
    }
    Ok(())
}

/// `N cores, <CPU model>`: what the baseline's numbers depend on.
fn host_description() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .and_then(|rest| rest.split_once(':'))
                    .map(|(_, m)| m.trim().to_string())
            })
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    format!("{cores} cores, {model}")
}

fn utc_now() -> String {
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    utc_timestamp(seconds)
}

/// A Unix time as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian calendar).
pub(crate) fn utc_timestamp(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let rest = unix_seconds % 86_400;
    // Days since 1970-01-01 to a civil date, counting in 400-year eras from 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> BenchReportArgs {
        BenchReportArgs {
            no_run: false,
            quick: false,
            measurement_time: None,
            warm_up_time: None,
            sample_size: None,
            benches: Vec::new(),
            filter: None,
            baseline: None,
            threshold: 10.0,
            save_baseline: false,
            fail_on_regression: false,
            out: None,
        }
    }

    #[test]
    fn bench_command_passes_criterion_options_after_the_separator() {
        assert_eq!(
            bench_command(&args()),
            ["bench", "-p", "flodl-benches", "--bench", "*", "--", "--noplot"]
        );
        let quick = BenchReportArgs {
            quick: true,
            measurement_time: Some(0.5),
            warm_up_time: Some(0.25),
            sample_size: Some(10),
            benches: vec!["kernels".into(), "data".into()],
            filter: Some("cpu_".into()),
            ..args()
        };
        let want = [
            "bench",
            "-p",
            "flodl-benches",
            "--bench",
            "kernels",
            "--bench",
            "data",
            "--",
            "--quick",
            "--measurement-time",
            "0.5",
            "--warm-up-time",
            "0.25",
            "--sample-size",
            "10",
            "--noplot",
            "cpu_",
        ];
        assert_eq!(bench_command(&quick), want);
    }

    #[test]
    fn timestamps_are_utc_civil_dates() {
        let cases = [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_709_251_199, "2024-02-29T23:59:59Z"),
            (1_796_215_200, "2026-12-02T12:40:00Z"),
            (4_102_444_800, "2100-01-01T00:00:00Z"),
        ];
        for (seconds, want) in cases {
            assert_eq!(utc_timestamp(seconds), want, "{seconds}");
        }
    }
}

//! Runs one matrix row: lists the binary's tests, runs the selected ones, reads the verdict.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::cargo_artifact::TestBinary;
use crate::matrix::{OUT_DIR, Row, RowKind, parse_test_list, selects, unmatched};

/// How many lines of a failed row's output go into the report.
const TAIL_LINES: usize = 40;

/// How a row ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// Every selected test passed.
    Passed,
    /// A test failed or the binary exited non-zero.
    Failed {
        /// The exit code, `None` when a signal ended it.
        code: Option<i32>,
    },
    /// Killed after the time limit.
    TimedOut,
    /// A case whose filters match no test of its binary (the matrix is stale).
    Missing,
    /// The binary was not built (renamed, or its crate has no such test file).
    NotBuilt,
    /// A full-binary row whose binary has no tests.
    NoTests,
    /// Not run, and why (it needs more GPUs than are visible; no GPU at all). Under
    /// `FLODL_REQUIRE_GPU=1` this fails the matrix: what did not run was not tested.
    NotRun {
        /// Why.
        reason: String,
    },
}

impl Outcome {
    /// Whether this outcome fails the matrix; `require_gpu` (`FLODL_REQUIRE_GPU=1`) makes a row
    /// that did not run a failure, never a pass.
    pub(crate) fn fails(&self, require_gpu: bool) -> bool {
        match self {
            Outcome::Failed { .. } | Outcome::TimedOut | Outcome::Missing | Outcome::NotBuilt => {
                true
            }
            Outcome::NotRun { .. } => require_gpu,
            Outcome::Passed | Outcome::NoTests => false,
        }
    }

    /// The outcome of a row that needs `needs` GPUs where `visible` are.
    pub(crate) fn needs_gpus(needs: usize, visible: usize) -> Outcome {
        let plural = if needs == 1 { "" } else { "s" };
        Outcome::NotRun { reason: format!("needs {needs} GPU{plural}, {visible} visible") }
    }

    /// A short word for the table.
    pub(crate) fn word(&self) -> String {
        match self {
            Outcome::Passed => "passed".into(),
            Outcome::Failed { code: Some(code) } => format!("FAILED (exit {code})"),
            Outcome::Failed { code: None } => "FAILED (signal)".into(),
            Outcome::TimedOut => "TIMED OUT".into(),
            Outcome::Missing => "MISSING (no test matches)".into(),
            Outcome::NotBuilt => "NOT BUILT".into(),
            Outcome::NoTests => "no tests".into(),
            Outcome::NotRun { reason } => format!("not run ({reason})"),
        }
    }
}

/// The record of one row.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RowResult {
    /// The row that ran.
    #[serde(flatten)]
    pub(crate) row: Row,
    /// How it ended.
    #[serde(flatten)]
    pub(crate) outcome: Outcome,
    /// Tests that passed.
    pub(crate) passed: usize,
    /// Tests that failed.
    pub(crate) failed: usize,
    /// Lines with `skipped:` in the output (GPU tests that did not run).
    pub(crate) skips: usize,
    /// Wall time of the run.
    pub(crate) seconds: f64,
    /// The end of the output, for failed rows.
    pub(crate) log_tail: Vec<String>,
    /// What a job measured (samples/s per rank, accuracy), read from its run directory.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) figures: Vec<String>,
}

impl RowResult {
    /// The record of a row that did not run, and why.
    pub(crate) fn not_run(row: Row, reason: &str) -> RowResult {
        RowResult {
            row,
            outcome: Outcome::NotRun { reason: reason.to_string() },
            passed: 0,
            failed: 0,
            skips: 0,
            seconds: 0.0,
            log_tail: Vec::new(),
            figures: Vec::new(),
        }
    }
}

/// What every row shares: environment, limits and the combined log.
#[derive(Debug)]
pub(crate) struct RunContext {
    /// GPUs visible to this run.
    pub(crate) gpus: usize,
    /// Set `FLODL_REQUIRE_GPU=1` (a skipped GPU test fails).
    pub(crate) require_gpu: bool,
    /// Kill a row after this long.
    pub(crate) timeout: Duration,
    /// The MNIST folder, exported as `FLODL_MNIST_DIR`.
    pub(crate) mnist_dir: PathBuf,
    /// Where each row's output is kept, one after another.
    pub(crate) log_path: PathBuf,
    /// Scratch file for the row in flight.
    pub(crate) scratch_path: PathBuf,
    /// The `fdl` binary for job rows (`None`: not built, so jobs are `NotBuilt`).
    pub(crate) fdl: Option<PathBuf>,
    /// Where job rows write their folders (`out/jobs`).
    pub(crate) jobs_dir: PathBuf,
}

impl RunContext {
    /// Runs one row against the binary it names (`None` when it was not built).
    ///
    /// # Errors
    /// When the binary cannot be started or the logs cannot be written.
    pub(crate) fn run_row(&self, row: &Row, binary: Option<&TestBinary>) -> Result<RowResult> {
        let mut result = RowResult {
            row: row.clone(),
            outcome: Outcome::Passed,
            passed: 0,
            failed: 0,
            skips: 0,
            seconds: 0.0,
            log_tail: Vec::new(),
            figures: Vec::new(),
        };
        if row.gpus > self.gpus {
            result.outcome = Outcome::needs_gpus(row.gpus, self.gpus);
            return Ok(result);
        }
        if let RowKind::Job { args, slug } = &row.kind {
            return self.run_job(row, args, slug, result);
        }
        let Some(binary) = binary else {
            result.outcome = Outcome::NotBuilt;
            return Ok(result);
        };
        let listed = self.command(binary).args(["--list", "--format", "terse"]).output();
        let listed = listed.with_context(|| format!("cannot start {}", binary.exe.display()))?;
        let tests = parse_test_list(&String::from_utf8_lossy(&listed.stdout));
        let missing = unmatched(&row.filters, &tests);
        if !missing.is_empty() {
            result.outcome = Outcome::Missing;
            result.log_tail = missing.iter().map(|name| format!("no test named {name}")).collect();
            return Ok(result);
        }
        if !tests.iter().any(|t| selects(&row.filters, t)) {
            result.outcome =
                if row.kind == RowKind::Case { Outcome::Missing } else { Outcome::NoTests };
            return Ok(result);
        }
        let scratch = File::create(&self.scratch_path)
            .with_context(|| format!("cannot write {}", self.scratch_path.display()))?;
        let mut command = self.command(binary);
        command.arg("--show-output");
        if !row.filters.is_empty() {
            command.arg("--exact").args(&row.filters);
        }
        if let RowKind::Binary { skip } = &row.kind
            && !skip.is_empty()
        {
            command.arg("--exact");
            for name in skip {
                command.args(["--skip", name]);
            }
        }
        if row.serial {
            command.arg("--test-threads=1");
        }
        command.stdout(Stdio::from(scratch.try_clone()?)).stderr(Stdio::from(scratch));
        let start = Instant::now();
        let status = wait_with_timeout(&mut command, self.timeout)?;
        result.seconds = start.elapsed().as_secs_f64();
        let output = fs::read_to_string(&self.scratch_path).unwrap_or_default();
        let (passed, failed) = parse_test_counts(&output);
        result.passed = passed;
        result.failed = failed;
        result.skips = count_skips(&output);
        result.outcome = match status {
            None => Outcome::TimedOut,
            Some(status) if status.success() && failed == 0 => Outcome::Passed,
            Some(status) => Outcome::Failed { code: status.code() },
        };
        if result.outcome.fails(self.require_gpu) {
            result.log_tail = failure_excerpt(&output, TAIL_LINES);
        }
        self.append_log(row, &binary.exe, &output)?;
        Ok(result)
    }

    /// Runs an `fdl` job in its own folder under [`RunContext::jobs_dir`]; a training's figures
    /// come from the run directory it wrote there.
    fn run_job(
        &self,
        row: &Row,
        args: &[String],
        slug: &str,
        mut result: RowResult,
    ) -> Result<RowResult> {
        let Some(fdl) = &self.fdl else {
            result.outcome = Outcome::NotBuilt;
            return Ok(result);
        };
        let folder = self.jobs_dir.join(slug);
        if folder.exists() {
            fs::remove_dir_all(&folder)
                .with_context(|| format!("cannot clear {}", folder.display()))?;
        }
        let out = folder.to_string_lossy();
        let args: Vec<String> = args.iter().map(|a| a.replace(OUT_DIR, &out)).collect();
        let scratch = File::create(&self.scratch_path)
            .with_context(|| format!("cannot write {}", self.scratch_path.display()))?;
        let mut command = Command::new(fdl);
        command
            .args(&args)
            .env("FLODL_MNIST_DIR", &self.mnist_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(scratch.try_clone()?))
            .stderr(Stdio::from(scratch));
        if self.require_gpu {
            command.env("FLODL_REQUIRE_GPU", "1");
        }
        let start = Instant::now();
        let status = wait_with_timeout(&mut command, self.timeout)?;
        result.seconds = start.elapsed().as_secs_f64();
        let output = fs::read_to_string(&self.scratch_path).unwrap_or_default();
        let passed = status.is_some_and(|s| s.success());
        (result.passed, result.failed) = if passed { (1, 0) } else { (0, 1) };
        result.outcome = match status {
            None => Outcome::TimedOut,
            Some(status) if status.success() => Outcome::Passed,
            Some(status) => Outcome::Failed { code: status.code() },
        };
        if result.outcome.fails(self.require_gpu) {
            result.log_tail = tail(&output, TAIL_LINES);
        }
        let summary = folder.join("summary.json");
        if let Ok(text) = fs::read_to_string(&summary) {
            result.figures = run_figures(&text);
        }
        fs::create_dir_all(&folder)?;
        fs::write(folder.join("output.txt"), &output)?;
        self.append_log(row, fdl, &output)?;
        Ok(result)
    }

    fn command(&self, binary: &TestBinary) -> Command {
        let mut command = Command::new(&binary.exe);
        command
            .current_dir(&binary.manifest_dir)
            .env("CARGO_MANIFEST_DIR", &binary.manifest_dir)
            .env("FLODL_MNIST_DIR", &self.mnist_dir)
            .stdin(Stdio::null());
        if std::env::var_os("RUST_BACKTRACE").is_none() {
            // A failure on a remote GPU machine should say where it happened.
            command.env("RUST_BACKTRACE", "1");
        }
        if self.require_gpu {
            command.env("FLODL_REQUIRE_GPU", "1");
        } else {
            command.env_remove("FLODL_REQUIRE_GPU");
        }
        command
    }

    fn append_log(&self, row: &Row, exe: &Path, output: &str) -> Result<()> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("cannot write {}", self.log_path.display()))?;
        writeln!(
            log,
            "===== {} :: {} {:?} ({})",
            row.label,
            row.binary,
            row.filters,
            exe.display()
        )?;
        log.write_all(output.as_bytes())?;
        writeln!(log)?;
        Ok(())
    }
}

/// Runs `command`; `None` when it outlived `timeout` and was killed.
fn wait_with_timeout(command: &mut Command, timeout: Duration) -> Result<Option<ExitStatus>> {
    let mut child = command.spawn().context("cannot start a test binary")?;
    let pid = child.id();
    let (sender, receiver) = mpsc::sync_channel(1);
    let waiter = thread::spawn(move || {
        // The receiver may be gone if we gave up; then nobody needs the status.
        let _ = sender.send(child.wait());
    });
    let status = match receiver.recv_timeout(timeout) {
        Ok(status) => Some(status?),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            let _ = receiver.recv();
            None
        }
    };
    let _ = waiter.join();
    Ok(status)
}

/// Passed and failed test counts summed over libtest's `test result:` lines.
pub(crate) fn parse_test_counts(output: &str) -> (usize, usize) {
    let mut passed = 0;
    let mut failed = 0;
    for line in output.lines().filter(|l| l.starts_with("test result:")) {
        for part in line.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(number)) = (words.next(), words.next()) else { continue };
            let Ok(number) = number.parse::<usize>() else { continue };
            match what {
                "passed" => passed += number,
                "failed" => failed += number,
                _ => {}
            }
        }
    }
    (passed, failed)
}

/// The figures of a training's `summary.json`: samples/s per rank with its device, the training
/// wall time and the test accuracy (empty when the text is not such a summary).
pub(crate) fn run_figures(summary: &str) -> Vec<String> {
    let Ok(json) = serde_json::from_str::<serde_json::Value>(summary) else {
        return Vec::new();
    };
    let mut figures = Vec::new();
    for rank in json["ranks"].as_array().into_iter().flatten() {
        if let (Some(r), Some(device), Some(rate)) =
            (rank["rank"].as_u64(), rank["device"].as_str(), rank["samples_per_s"].as_f64())
        {
            figures.push(format!("rank {r} ({device}): {rate:.0} samples/s"));
        }
    }
    if let Some(wall) = json["train_wall_s"].as_f64() {
        figures.push(format!("training wall: {wall:.2} s"));
    }
    if let Some(accuracy) = json["test"]["accuracy"].as_f64() {
        figures.push(format!("test accuracy: {:.2}%", accuracy * 100.0));
    }
    figures
}

/// Lines that report a skipped GPU test (`skipped: <reason>`).
pub(crate) fn count_skips(output: &str) -> usize {
    output.lines().filter(|l| l.contains("skipped:")).count()
}

/// What explains a failure: libtest's `failures:` section (the panics) when there is one, else
/// the end of the output; at most `n` lines either way.
fn failure_excerpt(output: &str, n: usize) -> Vec<String> {
    let lines: Vec<&str> = output.lines().collect();
    match lines.iter().position(|l| *l == "failures:") {
        Some(start) => lines[start..].iter().take(n).map(|l| l.to_string()).collect(),
        None => tail(output, n),
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].iter().map(|l| l.to_string()).collect()
}

/// The path of a file under `dir`, which is created if missing.
pub(crate) fn file_in(dir: &Path, name: &str) -> Result<PathBuf> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_over_result_lines() {
        let cases = [
            (
                "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 2 filtered out; finished in 0.01s",
                (3, 0),
            ),
            (
                "test result: FAILED. 10 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out",
                (10, 2),
            ),
            (
                "test result: ok. 1 passed; 0 failed\nnoise\ntest result: ok. 4 passed; 0 failed",
                (5, 0),
            ),
            ("running 0 tests\n", (0, 0)),
            ("test foo ... ok\n", (0, 0)),
        ];
        for (output, want) in cases {
            assert_eq!(parse_test_counts(output), want, "{output}");
        }
    }

    #[test]
    fn skips_and_tails_are_read_from_output() {
        let output =
            "running 2 tests\nskipped: no CUDA driver\nok\nskipped: 1 GPU visible, 2 needed\n";
        assert_eq!(count_skips(output), 2);
        assert_eq!(count_skips("all good\n"), 0);
        assert_eq!(tail(output, 2), ["ok", "skipped: 1 GPU visible, 2 needed"]);
        assert_eq!(tail("a\nb", 10), ["a", "b"]);
        assert!(tail("", 3).is_empty());
    }

    #[test]
    fn failure_excerpts_start_at_the_failures_section() {
        let output = "running 2 tests\ntest a ... ok\ntest b ... FAILED\n\nfailures:\n\n---- b stdout ----\npanicked at x\n\nsuccesses:\n    a\n";
        assert_eq!(
            failure_excerpt(output, 4),
            ["failures:", "", "---- b stdout ----", "panicked at x"]
        );
        let hung = "running 1 test\ntest c has been running for over 60 seconds\n";
        assert_eq!(failure_excerpt(hung, 1), ["test c has been running for over 60 seconds"]);
    }

    #[test]
    fn failures_are_the_outcomes_that_need_attention() {
        // (outcome, fails without FLODL_REQUIRE_GPU, fails with it)
        let cases = [
            (Outcome::Passed, false, false),
            (Outcome::Failed { code: Some(101) }, true, true),
            (Outcome::Failed { code: None }, true, true),
            (Outcome::TimedOut, true, true),
            (Outcome::Missing, true, true),
            (Outcome::NotBuilt, true, true),
            (Outcome::NoTests, false, false),
            (Outcome::needs_gpus(2, 1), false, true),
        ];
        for (outcome, loose, required) in cases {
            assert_eq!(outcome.fails(false), loose, "{outcome:?}");
            assert_eq!(outcome.fails(true), required, "{outcome:?} under FLODL_REQUIRE_GPU=1");
            assert!(!outcome.word().is_empty());
        }
        assert_eq!(Outcome::needs_gpus(2, 1).word(), "not run (needs 2 GPUs, 1 visible)");
        assert_eq!(Outcome::needs_gpus(1, 0).word(), "not run (needs 1 GPU, 0 visible)");
    }

    #[test]
    fn run_figures_come_from_a_summary() {
        let summary = r#"{"train_wall_s": 12.5, "test": {"accuracy": 0.9712, "loss": 0.1},
            "ranks": [{"rank": 0, "device": "cpu", "samples_per_s": 2100.4},
                      {"rank": 1, "device": "cuda:0", "samples_per_s": 51234.0}]}"#;
        assert_eq!(
            run_figures(summary),
            [
                "rank 0 (cpu): 2100 samples/s",
                "rank 1 (cuda:0): 51234 samples/s",
                "training wall: 12.50 s",
                "test accuracy: 97.12%",
            ]
        );
        assert!(run_figures("not json").is_empty());
        assert!(run_figures("{}").is_empty());
    }
}

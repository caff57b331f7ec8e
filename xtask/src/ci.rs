//! `cargo xtask ci`: the steps of `.ci/run`, run one by one with a summary.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::flags::CiArgs;
use crate::table::{Align, Table};
use crate::workspace;

/// One CI step: a cargo invocation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    /// A short name for the summary.
    pub(crate) title: &'static str,
    /// The arguments after `cargo`.
    pub(crate) args: &'static [&'static str],
    /// Environment variables set for it.
    pub(crate) env: &'static [(&'static str, &'static str)],
}

impl Step {
    /// The step as a shell command line (`cargo fmt --all --check`, `VAR=1 cargo test ...`).
    pub(crate) fn command_line(&self) -> String {
        let env = self.env.iter().map(|(k, v)| format!("{k}={v}"));
        let cargo = std::iter::once("cargo").chain(self.args.iter().copied()).map(str::to_owned);
        env.chain(cargo).collect::<Vec<_>>().join(" ")
    }
}

/// The steps, in the order `.ci/run` runs them (a test keeps the two equal).
pub(crate) const STEPS: [Step; 7] = [
    Step { title: "format", args: &["fmt", "--all", "--check"], env: &[] },
    // One lint of everything, the `mpi` code included (`.ci/run` installs Open MPI and libclang
    // first when missing; here they must be present).
    Step {
        title: "lint",
        args: &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--release",
            "--features",
            "flodl-nccl/mpi,flodl-cli/mpi",
            "--",
            "-D",
            "warnings",
        ],
        env: &[],
    },
    // In the release profile, so the build scripts and proc macros are the lint's.
    Step {
        title: "no cuda",
        args: &["check", "--workspace", "--no-default-features", "--release"],
        env: &[],
    },
    // CI runs as root: the emulated-hosts test must make its network namespaces, not skip.
    Step {
        title: "test",
        args: &["test", "--workspace", "--release"],
        env: &[("FLODL_REQUIRE_NETNS", "1")],
    },
    // `.ci/run` installs chromium first when it is missing; here it must be on PATH. Over the
    // workspace, so the test step's build serves (a `-p` build resolves features for one crate).
    Step {
        title: "browser",
        args: &["test", "--workspace", "--release", "--test", "browser"],
        env: &[("FLODL_BROWSER_TESTS", "1")],
    },
    // Both MPI test files from one build with the lint's features: flodl-nccl and the crates
    // above it are built again with `mpi`, the dependencies are the test step's.
    Step {
        title: "mpi",
        args: &[
            "test",
            "--workspace",
            "--release",
            "--features",
            "flodl-nccl/mpi,flodl-cli/mpi",
            "--test",
            "mpi_comm",
            "--test",
            "mpi",
        ],
        env: &[("FLODL_REQUIRE_MPI", "1")],
    },
    // flodl-tch, its own workspace (it links libtorch). `.ci/run` installs libtorch first when
    // it is missing (`flodl-tch/libtorch/install`); here it must be installed.
    Step {
        title: "tch",
        args: &[
            "test",
            "--manifest-path",
            "flodl-tch/Cargo.toml",
            "--workspace",
            "--release",
            "--target-dir",
            "target",
        ],
        env: &[],
    },
];

/// What happened to a step.
#[derive(Debug, Clone, Copy, PartialEq)]
enum StepResult {
    Passed { seconds: f64 },
    Failed { seconds: f64, code: Option<i32> },
    NotRun,
}

/// Runs the CI steps in the workspace root and prints a summary.
///
/// # Errors
/// When a step fails (or cannot start); the summary is printed first.
pub(crate) fn run(args: &CiArgs) -> Result<()> {
    let root = workspace::root();
    let mut results = Vec::new();
    let mut failed = false;
    for step in &STEPS {
        if failed && !args.keep_going {
            results.push(StepResult::NotRun);
            continue;
        }
        eprintln!("== {}", step.command_line());
        let start = Instant::now();
        let status = Command::new(workspace::cargo())
            .args(step.args)
            .current_dir(&root)
            .env("CARGO_TERM_COLOR", "never")
            .envs(step.env.iter().copied())
            .status()
            .with_context(|| format!("cannot start `{}`", step.command_line()))?;
        let seconds = start.elapsed().as_secs_f64();
        if status.success() {
            results.push(StepResult::Passed { seconds });
        } else {
            failed = true;
            results.push(StepResult::Failed { seconds, code: status.code() });
        }
    }
    eprintln!("\n== ci summary\n{}", summary(&results));
    let failures: Vec<&str> = STEPS
        .iter()
        .zip(&results)
        .filter(|(_, r)| matches!(r, StepResult::Failed { .. }))
        .map(|(s, _)| s.title)
        .collect();
    if failures.is_empty() {
        eprintln!("ci: all {} steps passed", STEPS.len());
        Ok(())
    } else {
        bail!("ci failed: {}", failures.join(", "))
    }
}

/// The summary table: step, command, result, time.
fn summary(results: &[StepResult]) -> String {
    let mut table = Table::new(&[
        ("step", Align::Left),
        ("command", Align::Left),
        ("result", Align::Left),
        ("time", Align::Right),
    ]);
    for (step, result) in STEPS.iter().zip(results) {
        let (verdict, time) = match result {
            StepResult::Passed { seconds } => ("ok".to_string(), format!("{seconds:.1} s")),
            StepResult::Failed { seconds, code } => {
                let code = code.map_or("signal".to_string(), |c| format!("exit {c}"));
                (format!("FAILED ({code})"), format!("{seconds:.1} s"))
            }
            StepResult::NotRun => ("not run".to_string(), String::new()),
        };
        table.push(vec![step.title.into(), step.command_line(), verdict, time]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_the_commands_of_the_ci_script() -> Result<()> {
        let script = std::fs::read_to_string(workspace::root().join(".ci").join("run"))?;
        // A command line is `cargo ...`, maybe after `VAR=value` assignments.
        let script_commands: Vec<&str> = script
            .lines()
            .map(str::trim)
            .filter(|line| {
                let mut words = line.split_whitespace().skip_while(|w| w.contains('='));
                words.next() == Some("cargo")
            })
            .collect();
        let ours: Vec<String> = STEPS.iter().map(Step::command_line).collect();
        assert_eq!(script_commands, ours);
        Ok(())
    }

    #[test]
    fn summary_reports_each_step() {
        let cases = [
            (
                [
                    StepResult::Passed { seconds: 1.25 },
                    StepResult::Failed { seconds: 30.0, code: Some(101) },
                    StepResult::NotRun,
                    StepResult::NotRun,
                    StepResult::NotRun,
                    StepResult::NotRun,
                    StepResult::NotRun,
                ],
                ["ok", "FAILED (exit 101)", "not run", "not run", "not run", "not run", "not run"],
            ),
            (
                [
                    StepResult::Passed { seconds: 0.0 },
                    StepResult::Passed { seconds: 2.0 },
                    StepResult::Passed { seconds: 40.0 },
                    StepResult::Passed { seconds: 9.0 },
                    StepResult::Passed { seconds: 3.0 },
                    StepResult::Passed { seconds: 3.0 },
                    StepResult::Failed { seconds: 3.0, code: None },
                ],
                ["ok", "ok", "ok", "ok", "ok", "ok", "FAILED (signal)"],
            ),
        ];
        for (results, verdicts) in cases {
            let text = summary(&results);
            let lines: Vec<&str> = text.lines().skip(2).collect();
            assert_eq!(lines.len(), STEPS.len());
            for ((line, step), verdict) in lines.iter().zip(&STEPS).zip(verdicts) {
                assert!(line.starts_with(step.title), "{line}");
                assert!(line.contains(&step.command_line()), "{line}");
                assert!(line.contains(verdict), "{line} lacks {verdict}");
            }
        }
    }
}

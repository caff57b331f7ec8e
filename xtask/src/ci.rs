//! `cargo xtask ci`: the steps of `.ci/run`, run one by one with a summary; each test step ends
//! with the list of the tests it skipped and why (see [`crate::skips`]).

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::flags::CiArgs;
use crate::skips::{self, Skip};
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
    /// Whether the step runs tests (`cargo test`), whose skips it then lists.
    pub(crate) fn runs_tests(&self) -> bool {
        self.args.first() == Some(&"test")
    }

    /// The step as a shell command line (`cargo fmt --all --check`, `VAR=1 cargo test ...`).
    pub(crate) fn command_line(&self) -> String {
        let env = self.env.iter().map(|(k, v)| format!("{k}={v}"));
        let cargo = std::iter::once("cargo").chain(self.args.iter().copied()).map(str::to_owned);
        env.chain(cargo).collect::<Vec<_>>().join(" ")
    }
}

/// The steps, in the order `.ci/run` runs them (a test keeps the two equal).
pub(crate) const STEPS: [Step; 8] = [
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
    // The public docs, broken links and all warnings denied (what docs.rs would show). In the
    // release profile, so the dependencies' metadata are the lint's and only the workspace's
    // crates are documented (about 15 s).
    Step {
        title: "docs",
        args: &["doc", "--workspace", "--no-deps", "--release"],
        env: &[("RUSTDOCFLAGS", "-Dwarnings")],
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

/// A step's result and, for a test step that ran, the tests it skipped.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    result: StepResult,
    skipped: Option<Vec<Skip>>,
}

/// Runs the CI steps in the workspace root and prints a summary.
///
/// # Errors
/// When a step fails (or cannot start); the summary is printed first.
pub(crate) fn run(args: &CiArgs) -> Result<()> {
    let root = workspace::root();
    let skip_dir = workspace::target_dir().join("skips");
    std::fs::create_dir_all(&skip_dir)
        .with_context(|| format!("cannot create {}", skip_dir.display()))?;
    let mut outcomes = Vec::new();
    let mut failed = false;
    for step in &STEPS {
        if failed && !args.keep_going {
            outcomes.push(Outcome { result: StepResult::NotRun, skipped: None });
            continue;
        }
        eprintln!("== {}", step.command_line());
        // The same file `.ci/run` uses, emptied first: the list is this step's.
        let log = skip_dir.join(format!("{}.log", step.title.replace(' ', "-")));
        if step.runs_tests() {
            std::fs::write(&log, "").with_context(|| format!("cannot write {}", log.display()))?;
        }
        let start = Instant::now();
        let status = Command::new(workspace::cargo())
            .args(step.args)
            .current_dir(&root)
            .env("CARGO_TERM_COLOR", "never")
            .env(skips::LOG_ENV, &log)
            .envs(step.env.iter().copied())
            .status()
            .with_context(|| format!("cannot start `{}`", step.command_line()))?;
        let seconds = start.elapsed().as_secs_f64();
        let skipped = if step.runs_tests() {
            let list =
                skips::read(&log).with_context(|| format!("cannot read {}", log.display()))?;
            eprintln!("{}", skips::render(&list));
            Some(list)
        } else {
            None
        };
        let result = if status.success() {
            StepResult::Passed { seconds }
        } else {
            failed = true;
            StepResult::Failed { seconds, code: status.code() }
        };
        outcomes.push(Outcome { result, skipped });
    }
    eprintln!("\n== ci summary\n{}", summary(&outcomes));
    let failures: Vec<&str> = STEPS
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| matches!(o.result, StepResult::Failed { .. }))
        .map(|(s, _)| s.title)
        .collect();
    if failures.is_empty() {
        eprintln!("ci: all {} steps passed; {}", STEPS.len(), skipped_line(&outcomes));
        Ok(())
    } else {
        bail!("ci failed: {}", failures.join(", "))
    }
}

/// The skips of every test step, listed (a skip is not a pass): `skipped: N` and one line each.
fn skipped_line(outcomes: &[Outcome]) -> String {
    let all: Vec<Skip> = STEPS
        .iter()
        .zip(outcomes)
        .flat_map(|(step, o)| {
            o.skipped.iter().flatten().map(move |s| Skip {
                test: s.test.clone(),
                reason: format!("{} (step {})", s.reason, step.title),
            })
        })
        .collect();
    skips::render(&all)
}

/// The summary table: step, command, result, tests skipped, time.
fn summary(outcomes: &[Outcome]) -> String {
    let mut table = Table::new(&[
        ("step", Align::Left),
        ("command", Align::Left),
        ("result", Align::Left),
        ("skipped", Align::Right),
        ("time", Align::Right),
    ]);
    for (step, outcome) in STEPS.iter().zip(outcomes) {
        let (verdict, time) = match outcome.result {
            StepResult::Passed { seconds } => ("ok".to_string(), format!("{seconds:.1} s")),
            StepResult::Failed { seconds, code } => {
                let code = code.map_or("signal".to_string(), |c| format!("exit {c}"));
                (format!("FAILED ({code})"), format!("{seconds:.1} s"))
            }
            StepResult::NotRun => ("not run".to_string(), String::new()),
        };
        let skipped = outcome.skipped.as_ref().map_or(String::new(), |s| s.len().to_string());
        table.push(vec![step.title.into(), step.command_line(), verdict, skipped, time]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_the_commands_of_the_ci_script() -> Result<()> {
        let script = std::fs::read_to_string(workspace::root().join(".ci").join("run"))?;
        // A command line is `cargo ...`, maybe after `VAR=value` assignments; a test step is
        // framed by `skips_begin <title>` and `skips_report`.
        let script_lines: Vec<&str> = script
            .lines()
            .map(str::trim)
            .filter(|line| {
                let mut words = line.split_whitespace().skip_while(|w| w.contains('='));
                matches!(words.next(), Some("cargo" | "skips_begin" | "skips_report"))
            })
            .collect();
        let mut ours = Vec::new();
        for step in &STEPS {
            if step.runs_tests() {
                ours.push(format!("skips_begin {}", step.title.replace(' ', "-")));
                ours.push(step.command_line());
                ours.push("skips_report".to_owned());
            } else {
                ours.push(step.command_line());
            }
        }
        assert_eq!(script_lines, ours);
        assert!(
            script.contains(&format!("export {}=", skips::LOG_ENV)),
            "the script's log variable"
        );
        Ok(())
    }

    fn passed(seconds: f64, skipped: Option<usize>) -> Outcome {
        let skip = Skip { test: "it t".into(), reason: "why".into() };
        Outcome { result: StepResult::Passed { seconds }, skipped: skipped.map(|n| vec![skip; n]) }
    }

    #[test]
    fn summary_reports_each_step_and_its_skips() {
        let not_run = || Outcome { result: StepResult::NotRun, skipped: None };
        let cases = [
            (
                vec![
                    passed(1.25, None),
                    Outcome {
                        result: StepResult::Failed { seconds: 30.0, code: Some(101) },
                        skipped: None,
                    },
                    not_run(),
                    not_run(),
                    not_run(),
                    not_run(),
                    not_run(),
                    not_run(),
                ],
                [
                    "ok",
                    "FAILED (exit 101)",
                    "not run",
                    "not run",
                    "not run",
                    "not run",
                    "not run",
                    "not run",
                ],
                "skipped: 0",
            ),
            (
                vec![
                    passed(0.0, None),
                    passed(2.0, None),
                    passed(15.0, None),
                    passed(40.0, None),
                    passed(9.0, Some(3)),
                    passed(3.0, Some(0)),
                    passed(3.0, Some(0)),
                    Outcome {
                        result: StepResult::Failed { seconds: 3.0, code: None },
                        skipped: Some(Vec::new()),
                    },
                ],
                ["ok", "ok", "ok", "ok", "ok 3", "ok 0", "ok 0", "FAILED (signal) 0"],
                "skipped: 3\n  it t: why (step test)\n  it t: why (step test)\n  it t: why (step test)",
            ),
        ];
        for (outcomes, verdicts, skipped) in cases {
            let text = summary(&outcomes);
            let lines: Vec<&str> = text.lines().skip(2).collect();
            assert_eq!(lines.len(), STEPS.len());
            for ((line, step), verdict) in lines.iter().zip(&STEPS).zip(verdicts) {
                assert!(line.starts_with(step.title), "{line}");
                assert!(line.contains(&step.command_line()), "{line}");
                let words: Vec<&str> = verdict.split(' ').collect();
                let squeezed = line.split_whitespace().collect::<Vec<_>>().join(" ");
                assert!(squeezed.contains(&words.join(" ")), "{line} lacks {verdict}");
            }
            assert_eq!(skipped_line(&outcomes), skipped);
        }
    }
}

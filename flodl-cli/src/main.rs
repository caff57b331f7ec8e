//! `fdl`: the flodl command line — devices, train, bench, report, audit, launch, cluster, data.

mod args;
mod audit;
mod bench;
mod chart;
mod config;
mod dashboard;
mod data;
mod devices;
mod failure;
mod interrupt;
mod launch;
mod model;
mod mpi_job;
mod progress;
mod record;
mod report;
mod resume;
mod run_dir;
mod swimlane;
mod takeover;
mod tally;
mod term_notice;
mod train;

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches};

use crate::args::{Cli, ClusterCommand, Command, DataCommand};

/// `fdl`'s grammar, every flag with a default stating it in its help.
fn command() -> clap::Command {
    Cli::command()
        .mut_subcommand("train", config::help_defaults)
        .mut_subcommand("bench", config::help_defaults)
        .mut_subcommand("launch", config::help_defaults)
}

fn main() -> ExitCode {
    let parsed = command().try_get_matches().and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(2);
        }
        Err(e) => {
            // clap's message has a usage block after the first line; one line is enough.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("error: invalid arguments");
            eprintln!("{first} (see fdl --help)");
            return ExitCode::from(2);
        }
    };
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match (
            e.downcast_ref::<interrupt::Interrupted>(),
            e.downcast_ref::<launch::JobStatus>(),
        ) {
            (Some(stop), _) => {
                eprintln!("{stop}");
                ExitCode::from(stop.signal.exit_code())
            }
            (None, Some(status)) => {
                eprintln!("[launch] {status}");
                ExitCode::from(status.code)
            }
            (None, None) => {
                eprintln!("error: {}", one_line(&e));
                if resume::CannotGoOn::is(&e) {
                    ExitCode::from(resume::CannotGoOn::EXIT)
                } else {
                    ExitCode::FAILURE
                }
            }
        },
    }
}

/// The error and its causes on one line, like `{:#}`, skipping a cause whose text an outer
/// message already quotes (library errors often print their source themselves).
pub(crate) fn one_line(error: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Devices => {
            devices::run();
            Ok(())
        }
        Command::Report(args) => regenerate_report(&args.run_dir),
        Command::Audit(args) => audit::run(&args.run_dir, &args.resumed_from),
        Command::Train(args) => {
            interrupt::install();
            train::run(&args)
        }
        Command::Bench(args) => {
            interrupt::install();
            bench::run(&args)
        }
        Command::Launch(args) => {
            log_warnings();
            launch::run(&args)
        }
        Command::Cluster(ClusterCommand::Keys(args)) => launch::keys(&args),
        Command::Data(DataCommand::Write(args)) => data::write(&args),
    }
}

/// Prints warnings and errors of the libraries on stderr (`RUST_LOG` overrides): a cluster
/// job's processes say there why a connection was refused or dropped. Colours only when stderr
/// is a terminal: a piped or captured log (a rank's, under `fdl launch`) stays plain text.
pub(crate) fn log_warnings() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
}

/// `fdl report <run-dir>`: rewrites report.html from metrics.jsonl and summary.json; a run that
/// ended without its summary (stopped by a signal) gets the report of what metrics.jsonl holds.
fn regenerate_report(dir: &Path) -> Result<()> {
    anyhow::ensure!(dir.is_dir(), "run directory {} does not exist", dir.display());
    let records = run_dir::read_metrics(dir)?;
    let html = if dir.join(run_dir::SUMMARY).exists() {
        report::render(&run_dir::read_summary(dir)?, &records)
    } else {
        let name = dir.file_name().map_or_else(|| "run".into(), |n| n.to_string_lossy());
        println!("{} has no {}: the run did not finish", dir.display(), run_dir::SUMMARY);
        report::render_unfinished(&name, &records)
    };
    let path = run_dir::write_report(dir, &html)?;
    println!("report: {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    /// Every default of `fdl`, read from `config::defaults`, is in the help of its flag, for
    /// every command that takes the train flags.
    #[test]
    fn help_states_the_real_defaults() -> Result<()> {
        let mut cmd = command();
        let d = config::defaults();
        let hidden: Vec<String> = d.hidden().iter().map(ToString::to_string).collect();
        let r = &d.run;
        let wants = [
            ("--policy", r.policy.map(|p| p.to_string())),
            ("--backend", r.backend.map(|b| b.to_string())),
            ("--epochs", r.epochs.map(|e| e.to_string())),
            ("--batch-size", r.batch_size.map(|b| b.to_string())),
            ("--lr", r.lr.map(|l| l.to_string())),
            ("--momentum", Some(d.momentum().to_string())),
            ("--seed", r.seed.map(|s| s.to_string())),
            ("--schedule", r.schedule.map(|s| s.to_string())),
            ("--hidden", Some(hidden.join(","))),
            ("--prefetch", r.prefetch.map(|p| p.to_string())),
        ];
        for sub in ["train", "bench", "launch"] {
            let help = cmd
                .find_subcommand_mut(sub)
                .map(|c| c.render_long_help().to_string())
                .unwrap_or_default();
            for (flag, value) in &wants {
                let value = value.clone().ok_or_else(|| anyhow::anyhow!("{flag}: no default"))?;
                // The flag's own paragraph holds its default.
                let paragraph = help
                    .split(&format!("{flag} <"))
                    .nth(1)
                    .and_then(|rest| rest.split("\n\n").next())
                    .unwrap_or_default();
                let want = format!("(default {value})");
                anyhow::ensure!(paragraph.contains(&want), "{sub} {flag}: lacks {want:?}");
            }
        }
        Ok(())
    }

    #[test]
    fn one_line_drops_repeated_causes_and_newlines() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = anyhow::Error::new(io).context("f.gz: gone").context("cannot load\nMNIST");
        assert_eq!(one_line(&e), "cannot load MNIST: f.gz: gone");
    }
}

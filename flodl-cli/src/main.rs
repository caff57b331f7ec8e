//! `fdl`: the flodl command line — devices, train, bench, report.

mod args;
mod chart;
mod config;
mod devices;
mod record;
mod report;
mod run_dir;

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use clap::error::ErrorKind;

use crate::args::{Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
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
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Devices => {
            devices::run();
            Ok(())
        }
        Command::Report(args) => regenerate_report(&args.run_dir),
        Command::Train(args) => {
            let run = config::RunFlags {
                eval_every: args.eval_every,
                checkpoint_dir: args.checkpoint_dir.clone(),
                checkpoint_every: args.checkpoint_every,
                resume: args.resume.clone(),
                out: args.out.clone(),
                name: args.name.clone(),
            };
            let (cfg, opts) = config::resolve(&args.flags, &run)?;
            if args.dry_run {
                let both = serde_json::json!({ "config": cfg, "options": opts });
                println!("{}", serde_json::to_string_pretty(&both)?);
                return Ok(());
            }
            anyhow::bail!("training needs the flodl-ddp trainer, which is not built yet")
        }
        Command::Bench(_) => {
            anyhow::bail!("bench needs the flodl-ddp trainer, which is not built yet")
        }
    }
}

/// `fdl report <run-dir>`: rewrites report.html from metrics.jsonl and summary.json.
fn regenerate_report(dir: &Path) -> Result<()> {
    anyhow::ensure!(dir.is_dir(), "run directory {} does not exist", dir.display());
    let summary = run_dir::read_summary(dir)?;
    let records = run_dir::read_metrics(dir)?;
    let path = run_dir::write_report(dir, &report::render(&summary, &records))?;
    println!("report: {}", path.display());
    Ok(())
}

//! `cargo xtask`: project automation (`ci`, `gpu-test`, `bench-report`).
//!
//! Each command lives in its own module with a `run` function; `flags` declares them all.

mod bundle;
mod cargo_artifact;
mod ci;
mod flags;
mod gpu_inventory;
mod gpu_test;
mod matrix;
mod matrix_report;
mod row_runner;
mod table;
mod workspace;

use std::process::ExitCode;

use clap::Parser;

use crate::flags::{Command, Xtask};

fn main() -> ExitCode {
    let xtask = Xtask::parse();
    let result = match xtask.command {
        Command::Ci(args) => ci::run(&args),
        Command::GpuTest(args) => gpu_test::run(&args),
        Command::RunBundle(args) => gpu_test::run_bundle(&args),
        Command::BenchReport(_) => {
            anyhow::Result::Err(anyhow::anyhow!("bench-report: not built yet"))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

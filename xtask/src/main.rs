//! `cargo xtask`: project automation (`ci`, `gpu-test`, `bench-report`).
//!
//! Each command lives in its own module with a `run` function; `flags` declares them all.

mod baseline;
mod bench_report;
mod bundle;
mod cargo_artifact;
mod chart;
mod ci;
mod criterion_result;
mod dashboard;
mod flags;
mod gpu_inventory;
mod gpu_test;
mod matrix;
mod matrix_report;
mod quantity;
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
        Command::BenchReport(args) => bench_report::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

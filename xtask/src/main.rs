//! `cargo xtask`: project automation (`ci`, `gpu-test`, `bench-report`).
//!
//! - `cargo xtask ci` runs the steps of `.ci/run` (fmt check, clippy and the docs with warnings
//!   denied, the workspace tests) one by one and prints a summary; a test keeps the two lists
//!   equal.
//! - `cargo xtask gpu-test` detects the GPUs (nvidia-smi, libcuda.so.1, `CUDA_VISIBLE_DEVICES`),
//!   builds the tests with the `cuda` feature, runs the matrix in [`matrix::CASES`] and then every
//!   test binary in full with `FLODL_REQUIRE_GPU=1`, and writes `target/gpu-test/matrix.{txt,json,log}`.
//!   Without a GPU it fails unless `--allow-no-gpu`. `--list` shows which tests each case selects.
//!   `--bundle DIR` writes stripped, gzipped test binaries, the MNIST data, this program and a
//!   `run.sh` for a GPU machine without Rust (`DIR/run.sh`, results in `$OUT` or `DIR/out`).
//! - `cargo xtask bench-report` runs `cargo bench -p flodl-benches` (`--quick`,
//!   `--measurement-time`, a filter) or reads the results (`--no-run`), compares them with
//!   `benches/baseline.json` (`--threshold`, `--save-baseline`), and writes
//!   `target/bench-report/{index.html,summary.md,summary.json}`.
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
mod skips;
mod table;
#[cfg(test)]
mod tidy;
mod workspace;

use std::process::ExitCode;

use clap::Parser;

use crate::flags::{Command, Xtask};

fn main() -> ExitCode {
    let xtask = Xtask::parse();
    let done = |result: anyhow::Result<()>| result.map(|()| ExitCode::SUCCESS);
    let result = match xtask.command {
        Command::Ci(args) => done(ci::run(&args)),
        Command::GpuTest(args) => done(gpu_test::run(&args)),
        Command::RunBundle(args) => gpu_test::run_bundle(&args),
        Command::BenchReport(args) => done(bench_report::run(&args)),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

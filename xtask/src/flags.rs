//! The command line of `cargo xtask`: one enum variant per command.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Project automation for flodl.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
pub(crate) struct Xtask {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run what `.ci/run` runs (fmt check, clippy and the docs with warnings denied, the
    /// workspace tests, the dashboard in headless chromium, which must be on PATH).
    Ci(CiArgs),
    /// Build the tests with the `cuda` feature and run the GPU matrix with `FLODL_REQUIRE_GPU=1`.
    GpuTest(GpuTestArgs),
    /// Run the GPU matrix from a bundle made by `gpu-test --bundle` (called by the bundle's run.sh).
    #[command(hide = true)]
    RunBundle(RunBundleArgs),
    /// Run the criterion benches (or read their results) and write the dashboard.
    BenchReport(BenchReportArgs),
}

/// Options of `cargo xtask ci`.
#[derive(Debug, Args)]
pub(crate) struct CiArgs {
    /// Run every step even after one fails (CI itself stops at the first failure).
    #[arg(long)]
    pub(crate) keep_going: bool,
}

/// Options shared by `gpu-test` and `run-bundle`: how the matrix runs.
#[derive(Debug, Args, Clone)]
pub(crate) struct MatrixArgs {
    /// Without a visible GPU, run the CPU cases instead of failing.
    #[arg(long)]
    pub(crate) allow_no_gpu: bool,
    /// Take this many GPUs as visible instead of detecting them.
    #[arg(long)]
    pub(crate) gpus: Option<usize>,
    /// Kill a case that runs longer than this many seconds.
    #[arg(long, default_value_t = 300)]
    pub(crate) timeout: u64,
    /// Run only the matrix cases, not every test binary in full afterwards.
    #[arg(long)]
    pub(crate) cases_only: bool,
    /// Where the table (matrix.txt), JSON (matrix.json) and log (matrix.log) go.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
}

/// Options of `cargo xtask gpu-test`.
#[derive(Debug, Args)]
pub(crate) struct GpuTestArgs {
    #[command(flatten)]
    pub(crate) matrix: MatrixArgs,
    /// Build stripped test binaries, the MNIST data and a run.sh into DIR instead of running.
    #[arg(long, value_name = "DIR")]
    pub(crate) bundle: Option<PathBuf>,
    /// List each test binary's tests and the matrix cases they match, then stop.
    #[arg(long)]
    pub(crate) list: bool,
    /// Go on with the tests that compile when some do not (the run still fails at the end).
    #[arg(long)]
    pub(crate) keep_going: bool,
}

/// Options of the hidden `cargo xtask run-bundle`.
#[derive(Debug, Args)]
pub(crate) struct RunBundleArgs {
    #[command(flatten)]
    pub(crate) matrix: MatrixArgs,
    /// The bundle's folder (the one holding bundle.json).
    #[arg(long, value_name = "DIR")]
    pub(crate) bundle: PathBuf,
}

/// Options of `cargo xtask bench-report`.
#[derive(Debug, Args)]
pub(crate) struct BenchReportArgs {
    /// Read the existing results under target/criterion instead of running the benches.
    #[arg(long)]
    pub(crate) no_run: bool,
    /// Pass `--quick` to criterion.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Criterion's measurement time per benchmark, in seconds.
    #[arg(long, value_name = "SECS")]
    pub(crate) measurement_time: Option<f64>,
    /// Criterion's warm-up time per benchmark, in seconds.
    #[arg(long, value_name = "SECS")]
    pub(crate) warm_up_time: Option<f64>,
    /// Criterion's sample count per benchmark (at least 10).
    #[arg(long, value_name = "N")]
    pub(crate) sample_size: Option<usize>,
    /// Run only these bench targets (file names under benches/benches), all when absent.
    #[arg(long = "bench", value_name = "NAME")]
    pub(crate) benches: Vec<String>,
    /// Run only benchmarks whose id matches this criterion filter (a regular expression).
    #[arg(value_name = "FILTER")]
    pub(crate) filter: Option<String>,
    /// The baseline file to compare with (default: benches/baseline.json).
    #[arg(long, value_name = "FILE")]
    pub(crate) baseline: Option<PathBuf>,
    /// Flag a benchmark as regressed when its time grew by more than this percentage.
    #[arg(long, default_value_t = 10.0, value_name = "PERCENT")]
    pub(crate) threshold: f64,
    /// Write this run's results as the new baseline.
    #[arg(long)]
    pub(crate) save_baseline: bool,
    /// Exit non-zero when a benchmark regressed.
    #[arg(long)]
    pub(crate) fail_on_regression: bool,
    /// Where the dashboard goes (default: target/bench-report).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
}

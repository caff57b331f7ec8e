//! The command-line grammar of `fdl` (clap derive).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use flodl_ddp::{RunSettings, as_text};
use serde::{Deserialize, Serialize};

use crate::dashboard::Bind;
use crate::failure::FailAt;

/// Train one model on several devices at once (local SGD with the ElChe cadence).
#[derive(Debug, Parser)]
#[command(name = "fdl", version, about, propagate_version = true)]
pub(crate) struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The `fdl` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// List every device with its name, memory and (for GPUs) compute capability.
    Devices,
    /// Train the reference MLP on MNIST across ranks and write a run directory.
    Train(TrainArgs),
    /// Run the A/B matrix (solo per device, then every policy x backend) and write a table.
    Bench(BenchArgs),
    /// Regenerate report.html of a run directory from its metrics.jsonl and summary.json.
    Report(ReportArgs),
    /// Audit a run's exactly-once ledger: per epoch, the samples in the final model, duplicated,
    /// skipped and lost to deaths; exits 0 only when none is skipped or duplicated.
    Audit(AuditArgs),
    /// Run a cluster job on this host: N rank processes of `fdl train` over mutual TLS on
    /// loopback (rank 0's process hosts the controller and writes the run directory).
    Launch(LaunchArgs),
    /// Cluster jobs across hosts.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Datasets on disk.
    #[command(subcommand)]
    Data(DataCommand),
}

/// `fdl data`.
#[derive(Debug, Subcommand)]
pub(crate) enum DataCommand {
    /// Write MNIST's training images to a record file (checksummed records, read from disk on
    /// every fetch by `fdl train --records`), optionally several times over with shifted
    /// copies (augmentation as multiplicity).
    Write(DataWriteArgs),
}

/// `fdl data write`.
#[derive(Debug, Clone, Args)]
pub(crate) struct DataWriteArgs {
    /// The record file to write.
    pub(crate) out: PathBuf,
    /// Directory with the MNIST idx files (default: data/mnist of this repository).
    #[arg(long, value_name = "DIR")]
    pub(crate) data: Option<PathBuf>,
    /// Copies of the training set to write: copy 0 as is, copy c shifted by a pixel offset
    /// that depends on c (default 1).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) copies: usize,
}

/// `fdl cluster`.
#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// Make a job CA (ca.pem; its key ca.key stays here), the controller's certificate
    /// (controller.pem, controller.key) and one per rank (rank-R.pem, rank-R.key) in DIR for a
    /// job across hosts (--world N), or one more rank's (--rank R): give each host ca.pem and
    /// only its own processes' files, and point --tls-ca/--tls-cert/--tls-key (or
    /// FLODL_TLS_*) at them ({rank} in a path is the process's rank).
    Keys(KeysArgs),
}

/// `fdl cluster keys`.
#[derive(Debug, Clone, Args)]
pub(crate) struct KeysArgs {
    /// Directory for the files (made 0700 if missing).
    pub(crate) dir: PathBuf,
    /// A host name or IP address the controller may be reached at (repeatable).
    #[arg(long = "host", value_name = "HOST")]
    pub(crate) hosts: Vec<String>,
    /// The job's number of ranks: a new CA, the controller's certificate and one per rank.
    #[arg(long, value_name = "N", conflicts_with = "rank")]
    pub(crate) world: Option<usize>,
    /// Issue rank R's certificate with DIR's CA (a host that joins later).
    #[arg(long, value_name = "R")]
    pub(crate) rank: Option<usize>,
}

/// `fdl launch`.
#[derive(Debug, Clone, Args)]
pub(crate) struct LaunchArgs {
    /// Number of rank processes.
    #[arg(long, value_name = "N")]
    pub(crate) nproc: usize,
    /// Start the ranks with Open MPI's `mpirun` as one MPI world (the collective backend's
    /// data plane on CPU ranks; needs an fdl built with `--features mpi`), the controller in a
    /// process of its own outside it.
    #[arg(long)]
    pub(crate) mpi: bool,
    /// Restarts after a death, at most N over the job (default 0). Host backend: a rank process
    /// other than the one hosting the current controller that dies is restarted and joins the
    /// running job at its next reduce; with a standby (`--standby`), a controller's death is a
    /// takeover and the old host's process restarts as a rank of the new term. With --mpi, where a death ends the MPI job: the job
    /// is restarted from its last checkpoint bundle.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) max_restarts: usize,
    /// Every `fdl train` flag, passed to each rank process.
    #[command(flatten)]
    pub(crate) train: TrainArgs,
}

/// How a `fdl train` process joins a cluster job its launcher started (torchrun, srun,
/// mpirun, fdl launch): the identity comes from the launcher's environment.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct ClusterFlags {
    /// The job CA's certificate (default: FLODL_TLS_CA).
    #[arg(long, value_name = "FILE", requires_all = ["tls_cert", "tls_key"])]
    pub(crate) tls_ca: Option<PathBuf>,
    /// This process's certificate (default: FLODL_TLS_CERT).
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    pub(crate) tls_cert: Option<PathBuf>,
    /// This process's private key (default: FLODL_TLS_KEY).
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_cert"])]
    pub(crate) tls_key: Option<PathBuf>,
    /// Where rank 0's controller listens (default: 127.0.0.1 on the controller port).
    #[arg(long, value_name = "ADDR")]
    pub(crate) bind: Option<std::net::SocketAddr>,
    /// Run only the controller of an N-rank MPI job (the collective backend across
    /// processes), outside the MPI world: start it before `mpirun`, whose ranks find it
    /// through FLODL_CONTROLLER_ADDR and FLODL_CONTROLLER_PORT.
    #[arg(long, value_name = "N")]
    pub(crate) controller: Option<usize>,
    /// Seconds the controller waits for every rank to join (default 300).
    #[arg(long, value_name = "SECS")]
    pub(crate) join_timeout: Option<f64>,
    /// Rank 0: start once N ranks (rank 0 included) have joined; a process for a rank still
    /// missing joins the running job at a reduce (host backend, or NCCL) (default: every rank).
    #[arg(long, value_name = "N")]
    pub(crate) quorum: Option<usize>,
}

/// Flags shared by `train` and `bench`: the file, the run's settings and what only `fdl` has.
///
/// Every flag is optional: a value given here overrides the same key in the `--config` file,
/// which overrides `fdl`'s default ([`crate::config::defaults`]). The file's keys are these
/// flags' names (kebab-case), so one declaration serves both: clap parses the flags, serde the
/// file, with the same types.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct TrainFlags {
    /// TOML file with any of these keys (kebab-case, e.g. `batch-size = 64`); flags override it.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// The run's settings: the library's one declaration of them (`flodl_ddp::RunSettings`).
    #[command(flatten)]
    pub(crate) settings: RunSettings,
    /// The model, the data and emulated failures: what only `fdl` has.
    #[command(flatten)]
    pub(crate) local: LocalFlags,
}

flodl_ddp::partial! {
    /// The flags (and `--config` keys) of what only `fdl` has: the reference MLP, the data it
    /// reads, emulated failures.
    #[derive(Debug, Clone, Default, PartialEq, Args, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub(crate) struct LocalFlags {
        /// SGD momentum.
        #[arg(long, value_name = "M", allow_negative_numbers = true)]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(crate) momentum: Option<f64>,
        /// Hidden layer widths of the MLP (784 inputs, these, 10 classes).
        #[arg(long, value_name = "LIST", value_delimiter = ',')]
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "as_text::list::deserialize"
        )]
        pub(crate) hidden: Option<Vec<usize>>,
        /// Directory with the MNIST idx files (default: data/mnist of this repository).
        #[arg(long, value_name = "DIR")]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(crate) data: Option<PathBuf>,
        /// Train on the first N training images only (quick runs and tests).
        #[arg(long, value_name = "N")]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(crate) train_subset: Option<usize>,
        /// Evaluate on the first N test images only (quick runs and tests).
        #[arg(long, value_name = "N")]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(crate) test_subset: Option<usize>,
        /// After the run, evaluate the returned model on the first N training samples too
        /// (summary.json's `train_eval`): the final model's loss on data it trained on, beside
        /// the epoch's mean of the ranks' local losses.
        #[arg(long, value_name = "N")]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(crate) train_eval: Option<usize>,
        /// Train on a record file (written by `fdl data write`), read from disk on every fetch,
        /// instead of MNIST's training images (the test set stays MNIST's).
        #[arg(long, value_name = "FILE")]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(crate) records: Option<PathBuf>,
        /// Read the record file around the page cache (O_DIRECT, Linux), so every fetch reads
        /// the disk (honest benchmarks).
        #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(crate) direct: Option<bool>,
        /// Emulate device failures: RANK@BATCH makes that rank's replica fail on its BATCH-th
        /// training batch, e.g. `1@20` or `0@5,1@5` (train only).
        #[arg(long, value_name = "LIST", value_delimiter = ',')]
        #[serde(default, skip_serializing_if = "Option::is_none", with = "as_text::list")]
        pub(crate) fail_rank: Option<Vec<FailAt>>,
    }
}

flodl_ddp::partial! {
    /// Flags of `train` that `bench` has not: resume, the run directory, the dashboard. Keys of
    /// the `--config` file too, like [`TrainFlags`].
    #[derive(Debug, Clone, Default, PartialEq, Args, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub(crate) struct RunFlags {
        /// Resume from a checkpoint: a directory (its newest intact bundle) or a `.fdlck` file.
        /// The run must have the same ranks, policy, backend, batch size, training set, seed,
        /// LR, schedule and warmup (every schedule but constant spans --epochs, so only a
        /// constant-LR run can be given more epochs) and the same model.
        #[arg(long, value_name = "PATH")]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(crate) resume: Option<PathBuf>,
        /// Run directory (default: runs/<name>, or runs/<UTC timestamp>).
        #[arg(long, value_name = "DIR")]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(crate) out: Option<PathBuf>,
        /// Name of the run (its directory under runs/ when --out is not given).
        #[arg(long, value_name = "NAME")]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub(crate) name: Option<String>,
        /// Serve a live dashboard of the run (a page updated as it trains, and /metrics for
        /// Prometheus) on ADDR: `auto` when no ADDR is given (127.0.0.1:7411, or a free port
        /// when that one is taken), a PORT on 127.0.0.1, or IP:PORT. Any address but loopback is
        /// served only to URLs with the run's token (random unless --dashboard-token is given).
        #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "auto")]
        #[serde(default, skip_serializing_if = "Option::is_none", with = "as_text::optional")]
        pub(crate) dashboard: Option<Bind>,
        /// The dashboard's token: every request must carry `?token=TOKEN` (letters, digits,
        /// - . _ ~); a secret, never written to the run directory.
        #[arg(long, value_name = "TOKEN")]
        #[serde(default, skip_serializing)]
        pub(crate) dashboard_token: Option<String>,
    }
}

/// `fdl train`.
#[derive(Debug, Clone, Args)]
pub(crate) struct TrainArgs {
    /// What to train and how.
    #[command(flatten)]
    pub(crate) flags: TrainFlags,
    /// Resume, the run directory and the dashboard.
    #[command(flatten)]
    pub(crate) run: RunFlags,
    /// No progress bars, even on a terminal.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// The model: the reference MLP on MNIST, or the candle transformer on the Shakespeare
    /// plays (`gpt-tiny`, `gpt`, `gpt-large`; `--train-subset`/`--test-subset` count windows).
    #[arg(long, value_enum, default_value_t)]
    pub(crate) model: crate::model::Model,
    /// Print the resolved configuration (with the run specification every rank agrees on) as
    /// JSON and exit without training.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Cluster jobs: certificates, bind address, join timeout.
    #[command(flatten)]
    pub(crate) cluster: ClusterFlags,
}

/// `fdl bench`.
#[derive(Debug, Clone, Args)]
pub(crate) struct BenchArgs {
    /// What to train and how (policy and backend are ignored: every combination runs).
    #[command(flatten)]
    pub(crate) flags: TrainFlags,
    /// Directory for bench.md and bench.json (default: `runs/bench-<UTC timestamp>`).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Skip the solo runs (one per device).
    #[arg(long)]
    pub(crate) no_solo: bool,
    /// Instead of the policy x backend matrix, run the configured policy and backend three
    /// times: staging off, the --staging budget with next-use eviction, and the same budget
    /// with LRU eviction (data-starve share, throughput and hit ratio side by side).
    #[arg(long)]
    pub(crate) staging_ab: bool,
    /// No progress output, even on a terminal.
    #[arg(long)]
    pub(crate) quiet: bool,
}

/// `fdl audit`.
#[derive(Debug, Clone, Args)]
pub(crate) struct AuditArgs {
    /// The run directory (holding the ledger.jsonl its run wrote).
    pub(crate) run_dir: PathBuf,
    /// The run directory of the run whose checkpoint RUN_DIR resumed: its consensus at the
    /// checkpoint's cut stands for the restored epochs, and must equal the checkpoint's coverage.
    /// Repeat it for a chain (a run after several takeovers), nearest first: each names the run
    /// the one before it resumed.
    #[arg(long, value_name = "DIR")]
    pub(crate) resumed_from: Vec<PathBuf>,
}

/// `fdl report`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ReportArgs {
    /// The run directory (holding metrics.jsonl and summary.json).
    pub(crate) run_dir: PathBuf,
}

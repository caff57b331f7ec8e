//! The error of a run configuration that cannot run: which option, and what is wrong with it.
//!
//! [`crate::RunSpec::check`] holds every rule on a run's options and answers with a
//! [`ConfigError`]; its [`Field`] names the option as [`crate::Trainer`]'s setter does, so a
//! front end (the `fdl` command line) can turn it back into its own name for the option.

use std::fmt;

use flodl_tensor::Device;

/// One option of a run, as [`crate::Trainer`] names its setter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// [`crate::Trainer::dataset`].
    Dataset,
    /// The `every` of [`crate::Trainer::test_dataset`].
    EvalEvery,
    /// [`crate::Trainer::eval_rank`].
    EvalRank,
    /// [`crate::Trainer::standby`].
    Standby,
    /// [`crate::Trainer::batch_size`].
    BatchSize,
    /// [`crate::Trainer::epochs`].
    Epochs,
    /// [`crate::Trainer::devices`]: the ranks and their devices.
    Devices,
    /// [`crate::Trainer::backend`].
    Backend,
    /// [`crate::Trainer::learning_rate`].
    LearningRate,
    /// [`crate::Trainer::schedule`].
    Schedule,
    /// The linear warmup of a schedule given by name ([`crate::RunSettings::warmup_epochs`]).
    WarmupEpochs,
    /// [`crate::Trainer::lr_scale_ratio`].
    LrScaleRatio,
    /// [`crate::Trainer::elche`].
    Elche,
    /// [`crate::Trainer::slowdown`].
    Slowdown,
    /// [`crate::Trainer::speed_changes`].
    SpeedChange,
    /// [`crate::Trainer::stall_timeout`].
    StallTimeout,
    /// [`crate::Trainer::snapshot_timeout`] (its deadline and its retries).
    SnapshotTimeout,
    /// [`crate::Trainer::watchdog`].
    Watchdog,
    /// [`crate::Trainer::gamma`].
    Gamma,
    /// [`crate::Trainer::outer`].
    Outer,
    /// [`crate::Trainer::easgd`].
    Easgd,
    /// [`crate::Trainer::max_grad_norm`].
    MaxGradNorm,
    /// [`crate::Trainer::checkpoint_dir`].
    Checkpoint,
    /// [`crate::Trainer::checkpoint_every`].
    CheckpointEvery,
    /// [`crate::Trainer::keep_checkpoints`].
    KeepCheckpoints,
    /// [`crate::Trainer::model_size`]: the model against the devices' memory.
    ModelSize,
    /// [`crate::Trainer::cluster`]: where this process sits in a cluster run.
    Cluster,
    /// The replica's own configuration (its factory's settings: an MLP's widths, a
    /// transformer's sizes).
    Model,
    /// [`crate::Trainer::wire`]: how model states travel between processes.
    Wire,
    /// [`crate::Trainer::overlap`]: ranks train on while their snapshots travel.
    Overlap,
    /// [`crate::Trainer::fragments`]: the fragments synced on staggered reduces.
    Fragments,
    /// [`crate::ElCheKnobs::overhead_target`]: the exchange's share of a window ElChe allows.
    OverheadTarget,
}

impl Field {
    /// The option's name: the name of [`crate::Trainer`]'s setter.
    pub fn name(self) -> &'static str {
        match self {
            Field::Dataset => "dataset",
            Field::EvalEvery => "eval_every",
            Field::EvalRank => "eval_rank",
            Field::Standby => "standby",
            Field::BatchSize => "batch_size",
            Field::Epochs => "epochs",
            Field::Devices => "devices",
            Field::Backend => "backend",
            Field::LearningRate => "learning_rate",
            Field::Schedule => "schedule",
            Field::WarmupEpochs => "warmup_epochs",
            Field::LrScaleRatio => "lr_scale_ratio",
            Field::Elche => "elche",
            Field::Slowdown => "slowdown",
            Field::SpeedChange => "speed_changes",
            Field::StallTimeout => "stall_timeout",
            Field::SnapshotTimeout => "snapshot_timeout",
            Field::Watchdog => "watchdog",
            Field::Gamma => "gamma",
            Field::Outer => "outer",
            Field::Easgd => "easgd",
            Field::MaxGradNorm => "max_grad_norm",
            Field::Checkpoint => "checkpoint_dir",
            Field::CheckpointEvery => "checkpoint_every",
            Field::KeepCheckpoints => "keep_checkpoints",
            Field::ModelSize => "model_size",
            Field::Cluster => "cluster",
            Field::Model => "model",
            Field::Wire => "wire",
            Field::Overlap => "overlap",
            Field::Fragments => "fragments",
            Field::OverheadTarget => "overhead_target",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What is wrong with an option's value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Problem {
    /// A required option was not given.
    Missing,
    /// The value lies outside what the option takes.
    OutOfRange {
        /// The value given, as text.
        value: String,
        /// What the option takes.
        expected: &'static str,
    },
    /// A per-rank list holds another count than one per rank.
    PerRank {
        /// Values given.
        given: usize,
        /// Ranks in the run.
        ranks: usize,
    },
    /// The training set holds less than one batch per rank.
    TooFewSamples {
        /// Samples in the training set.
        samples: usize,
        /// Samples per batch.
        batch_size: usize,
        /// Ranks in the run.
        ranks: usize,
    },
    /// More CPU ranks in one process than this machine's cores can serve.
    TooManyRanks {
        /// CPU ranks asked for.
        ranks: usize,
        /// Cores of this machine.
        cores: usize,
        /// The most CPU ranks allowed on it.
        max: usize,
    },
    /// The replicas on a device (parameters, gradients and optimizer state) do not fit its
    /// memory.
    OutOfMemory {
        /// The device.
        device: Device,
        /// Replicas it would hold.
        replicas: usize,
        /// Bytes they need.
        needs: u64,
        /// Bytes free on it.
        free: u64,
    },
    /// Another option's value rules this one out.
    Needs {
        /// The option that must change.
        other: Field,
        /// What it must be.
        to_be: &'static str,
    },
    /// Environment variables the option is read from are not set.
    MissingVariables {
        /// The variables needed.
        vars: &'static [&'static str],
        /// What makes them.
        made_by: &'static str,
    },
    /// A combination this build or this kind of run does not serve.
    Unsupported(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing => f.write_str("is required"),
            Problem::OutOfRange { value, expected } => {
                write!(f, "{value} is out of range (expected {expected})")
            }
            Problem::PerRank { given, ranks } => {
                write!(f, "{given} values given for {ranks} ranks (give one per rank, or none)")
            }
            Problem::TooFewSamples { samples, batch_size, ranks } => write!(
                f,
                "{samples} samples make fewer than one batch of {batch_size} per rank for \
                 {ranks} ranks"
            ),
            Problem::TooManyRanks { ranks, cores, max } => {
                write!(f, "{ranks} CPU ranks on {cores} cores (at most {max})")
            }
            Problem::OutOfMemory { device, replicas, needs, free } => write!(
                f,
                "{replicas} replica(s) on {device} need {} (parameters, gradients and optimizer \
                 state), {} free",
                bytes(*needs),
                bytes(*free)
            ),
            Problem::Needs { other, to_be } => write!(f, "needs {other} to be {to_be}"),
            Problem::MissingVariables { vars, made_by } => {
                write!(
                    f,
                    "needs the environment variables {} ({made_by} makes them)",
                    vars.join(", ")
                )
            }
            Problem::Unsupported(why) => f.write_str(why),
        }
    }
}

/// `n` bytes in the largest binary unit that keeps a digit before the point.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// A run configuration that cannot run: the option and what is wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ConfigError {
    /// The option at fault.
    pub field: Field,
    /// What is wrong with it.
    pub problem: Problem,
}

impl ConfigError {
    /// `field`'s value `value` lies outside `expected`.
    pub fn out_of_range(field: Field, value: impl fmt::Display, expected: &'static str) -> Self {
        ConfigError { field, problem: Problem::OutOfRange { value: value.to_string(), expected } }
    }

    /// `field` cannot be served as given, for the reason `why`.
    pub fn unsupported(field: Field, why: impl Into<String>) -> Self {
        ConfigError { field, problem: Problem::Unsupported(why.into()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field_first() {
        let cases = [
            (ConfigError::out_of_range(Field::BatchSize, 0, "at least 1"), "batch_size: 0 is"),
            (
                ConfigError {
                    field: Field::ModelSize,
                    problem: Problem::OutOfMemory {
                        device: Device::Cpu,
                        replicas: 2,
                        needs: 3 << 30,
                        free: 1 << 30,
                    },
                },
                "model_size: 2 replica(s) on cpu need 3.0 GiB",
            ),
            (
                ConfigError {
                    field: Field::Easgd,
                    problem: Problem::Needs { other: Field::Backend, to_be: "host" },
                },
                "easgd: needs backend to be host",
            ),
        ];
        for (error, start) in cases {
            let text = error.to_string();
            assert!(text.starts_with(start), "{text}");
        }
    }
}

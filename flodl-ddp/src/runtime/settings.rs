//! A run's settings by name, each unset until given: the one declaration of the options a
//! front end offers, read from a settings file (serde, kebab-case keys) and, with the `clap`
//! feature, from command-line flags of the same names (clap's `Args`).
//!
//! Settings from several sources merge with [`RunSettings::or`] (written once, by
//! [`partial!`](crate::partial), for every field); [`crate::Trainer::settings`] applies the
//! ones given, and [`crate::Trainer::spec`] resolves and checks them into the [`RunSpec`] with
//! [`RunSpec::check`], whose [`ConfigError`] names a [`Field`]; [`RunSettings::key`] turns that
//! field back into the key (and flag) that set it.
//!
//! Adding an option: a field here (its doc comment is the flag's help), its line in
//! [`crate::Trainer::settings`], its rule in [`RunSpec::check`] and, when it is checked, its
//! [`Field`] and that field's key in [`RunSettings::key`].
//!
//! [`RunSpec`]: crate::RunSpec
//! [`RunSpec::check`]: crate::RunSpec::check
//! [`ConfigError`]: crate::ConfigError

use std::path::PathBuf;

use flodl_tensor::Device;
use serde::{Deserialize, Serialize};

use crate::config_error::Field;
use crate::control::policy::{Backend, Policy};
use crate::control::schedule_kind::ScheduleKind;
use crate::control::speed_change::SpeedChange;
use crate::control::standby::Standby;
use crate::link::frame::WireFormat;
use crate::runtime::as_text;
use crate::runtime::engine::prefetch::Prefetch;
use crate::runtime::engine::staging::Staging;

/// Declares a struct whose fields are all `Option`s (a partial configuration) with its merge:
/// `a.or(b)` takes each field from `a`, else from `b`, for every field declared, so that no
/// merge of settings is ever written field by field.
#[macro_export]
macro_rules! partial {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field : $ty ),*
        }

        impl $name {
            /// Each setting given here, else `under`'s: a value from a higher source (a flag)
            /// beats the same key from a lower one (a file, the defaults).
            #[must_use]
            $vis fn or(self, under: Self) -> Self {
                Self { $( $field: self.$field.or(under.$field) ),* }
            }
        }
    };
}

partial! {
    /// The options of a run as a user names them, each unset (`None`: the trainer's default)
    /// until given.
    ///
    /// Keys are the fields' names in kebab-case (`batch-size = 64`); a value may be the flag's
    /// text (`slowdown = "1,2.5"`, `prefetch = "auto"`) or the native TOML value. Keys of other
    /// groups are let through (a front end's file holds its own keys too, and checks every key
    /// against its flags). With the `clap` feature the same fields are long flags
    /// (`--batch-size 64`).
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    #[cfg_attr(feature = "clap", derive(clap::Args))]
    #[serde(rename_all = "kebab-case")]
    pub struct RunSettings {
        /// Number of CPU ranks.
        #[cfg_attr(feature = "clap", arg(long, value_name = "N", conflicts_with = "devices"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub ranks: Option<usize>,
        /// Explicit rank devices, comma separated, e.g. `cpu,cpu,cuda:0`.
        #[cfg_attr(feature = "clap", arg(long, value_name = "LIST", value_delimiter = ','))]
        #[serde(default, skip_serializing_if = "Option::is_none", with = "as_text::list")]
        pub devices: Option<Vec<Device>>,
        /// When to average: sync, cadence or async.
        #[cfg_attr(feature = "clap", arg(long, value_name = "POLICY"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub policy: Option<Policy>,
        /// How to average: collective or host.
        #[cfg_attr(feature = "clap", arg(long, value_name = "BACKEND"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub backend: Option<Backend>,
        /// Number of epochs.
        #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub epochs: Option<usize>,
        /// Per-rank batch size.
        #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub batch_size: Option<usize>,
        /// Learning rate (the peak of the schedule).
        #[cfg_attr(feature = "clap", arg(long, value_name = "LR", allow_negative_numbers = true))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub lr: Option<f64>,
        /// LR schedule over the run: constant, cosine (down to 0), one-cycle, step (/10 at 50%
        /// and 75%) or exponential (down to 1%).
        #[cfg_attr(feature = "clap", arg(long, value_name = "SCHEDULE"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub schedule: Option<ScheduleKind>,
        /// Linear LR warmup over the first N epochs (fractions allowed), before the schedule.
        #[cfg_attr(feature = "clap", arg(long, value_name = "N", allow_negative_numbers = true))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub warmup_epochs: Option<f64>,
        /// Seed of the initial weights and of the data permutation.
        #[cfg_attr(feature = "clap", arg(long, value_name = "SEED"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub seed: Option<u64>,
        /// Per-rank slowdown factors to emulate unequal devices, e.g. `1,2.5`.
        #[cfg_attr(feature = "clap", arg(long, value_name = "LIST", value_delimiter = ','))]
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "as_text::list::deserialize"
        )]
        pub slowdown: Option<Vec<f64>>,
        /// Benches: a rank slower for part of the run, RANK:FACTOR@FROM-UNTIL (fractions of the
        /// run), e.g. `1:3@0.3-0.6`; several comma separated.
        #[cfg_attr(feature = "clap", arg(long, value_name = "LIST", value_delimiter = ','))]
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "as_text::list::deserialize"
        )]
        pub speed_change: Option<Vec<SpeedChange>>,
        /// Prepare batches ahead on a background thread per rank: auto (GPU ranks only), off, or
        /// a depth N (every rank, CPU ranks too).
        #[cfg_attr(feature = "clap", arg(long, value_name = "MODE"))]
        #[serde(default, skip_serializing_if = "Option::is_none", with = "as_text::optional")]
        pub prefetch: Option<Prefetch>,
        /// Stage each rank's training samples in a host cache filled ahead from the
        /// coordinator's advisories: auto (datasets read from storage, e.g. --records), off, or
        /// a budget per rank such as 64M (K, M, G: powers of 1024), with :lru to compare against
        /// LRU eviction.
        #[cfg_attr(feature = "clap", arg(long, value_name = "MODE"))]
        #[serde(default, skip_serializing_if = "Option::is_none", with = "as_text::optional")]
        pub staging: Option<Staging>,
        /// Seconds a rank may be silent (or miss a reduce) before it is declared dead and the
        /// others go on without it (default 30, at most the stall timeout).
        #[cfg_attr(feature = "clap", arg(long, value_name = "SECS", allow_negative_numbers = true))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub watchdog: Option<f64>,
        /// Ranks that may die before the run stops (unset: no limit; the run goes on while a
        /// rank is alive).
        #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub max_failures: Option<usize>,
        /// Cluster jobs (host backend): the rank whose process holds the first standby
        /// controller, which takes over when rank 0's process dies (default 1; after each
        /// takeover the next rank's process is the standby), or none.
        #[cfg_attr(feature = "clap", arg(long, value_name = "RANK"))]
        #[serde(default, skip_serializing_if = "Option::is_none", with = "as_text::optional")]
        pub standby: Option<Standby>,
        /// Cluster jobs: how model states travel between processes: f32, bf16 (half the
        /// bytes), or on the host backend int8 / q4 (deltas from the last consensus, blockwise
        /// quantized with error feedback: 0.27× / 0.14× of f32); the consensus stays f32 on the
        /// controller.
        #[cfg_attr(feature = "clap", arg(long, value_name = "FORMAT"))]
        #[serde(default, skip_serializing_if = "Option::is_none", with = "as_text::optional")]
        pub wire: Option<WireFormat>,
        /// Host backend: a rank trains on while its snapshot travels and merges the consensus
        /// when it arrives (`now + μ·(consensus − snapshot)`); the value is the mixing factor μ
        /// in (0, 1], 1 when the flag is given alone.
        #[cfg_attr(
            feature = "clap",
            arg(long, value_name = "MIX", num_args = 0..=1, default_missing_value = "1")
        )]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub overlap: Option<f32>,
        /// Host backend: the parameters are cut into F fragments of equal size (runs of
        /// values, a tensor split where a cut falls in it) and each reduce syncs one of them
        /// in turn, so an exchange carries 1/F of the model; 1 (the default) syncs the whole
        /// model at every reduce.
        #[cfg_attr(feature = "clap", arg(long, value_name = "F"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub fragments: Option<usize>,
        /// Cadence and Async: the share of a window's wall time the exchange may cost the
        /// ranks before ElChe lengthens the windows, from 0.01 to 0.5 (default 0.05). Lower
        /// means fewer, longer windows: fewer exchanges of a large model, more local steps
        /// between two averages.
        #[cfg_attr(feature = "clap", arg(long, value_name = "SHARE"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub overhead_target: Option<f64>,
        /// Evaluate on the test set every N epochs (the last epoch is always evaluated).
        #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub eval_every: Option<usize>,
        /// Save checkpoint bundles into this directory (`step-<N>.fdlck`, `latest.fdlck`; a
        /// `failure.fdlck` when the run cannot go on).
        #[cfg_attr(feature = "clap", arg(long, value_name = "DIR"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub checkpoint_dir: Option<PathBuf>,
        /// Checkpoint after every N epochs (0: only at the end; needs --checkpoint-dir; 1 unless
        /// --checkpoint-every-reduces is given).
        #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub checkpoint_every: Option<usize>,
        /// Checkpoint after every N reduces too (needs --checkpoint-dir; given without
        /// --checkpoint-every, it replaces the per-epoch default).
        #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub checkpoint_every_reduces: Option<usize>,
        /// Step bundles the checkpoint directory keeps (default 3).
        #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub keep_checkpoints: Option<usize>,
    }
}

impl RunSettings {
    /// The key (and flag) that sets `field`, in the words of these settings (the ranks are
    /// `ranks` when given by count, else `devices`); `None` for an option no setting reaches.
    /// The one map from the library's [`Field`] back to a front end's name for it.
    pub fn key(&self, field: Field) -> Option<&'static str> {
        Some(match field {
            Field::Devices if self.ranks.is_some() => "ranks",
            Field::Devices => "devices",
            Field::Backend => "backend",
            Field::Epochs => "epochs",
            Field::BatchSize => "batch-size",
            Field::LearningRate => "lr",
            Field::Schedule => "schedule",
            Field::WarmupEpochs => "warmup-epochs",
            Field::Slowdown => "slowdown",
            Field::SpeedChange => "speed-change",
            Field::Watchdog => "watchdog",
            Field::EvalEvery => "eval-every",
            Field::Checkpoint => "checkpoint-dir",
            Field::CheckpointEvery
                if self.checkpoint_every_reduces == Some(0)
                    || self.checkpoint_every.is_none()
                        && self.checkpoint_every_reduces.is_some() =>
            {
                "checkpoint-every-reduces"
            }
            Field::CheckpointEvery => "checkpoint-every",
            Field::KeepCheckpoints => "keep-checkpoints",
            Field::Wire => "wire",
            Field::Overlap => "overlap",
            Field::Fragments => "fragments",
            Field::OverheadTarget => "overhead-target",
            Field::Standby => "standby",
            _ => return None,
        })
    }

    /// Settings with every field set (to values that pass the checks): the one fixture of the
    /// tests that every field is a key and a flag (this crate's, and a front end's such as
    /// `fdl`'s), so a new field that one of them misses fails both by name.
    #[cfg(any(test, feature = "clap"))]
    #[doc(hidden)]
    pub fn every_field_set() -> RunSettings {
        RunSettings {
            ranks: Some(2),
            devices: Some(vec![Device::Cpu]),
            policy: Some(Policy::Sync),
            backend: Some(Backend::Host),
            epochs: Some(3),
            batch_size: Some(16),
            lr: Some(0.5),
            schedule: Some(ScheduleKind::Step),
            warmup_epochs: Some(0.5),
            seed: Some(9),
            slowdown: Some(vec![1.0, 1.5]),
            speed_change: Some(vec![SpeedChange { rank: 1, factor: 3.0, from: 0.25, until: 0.5 }]),
            prefetch: Some(Prefetch::Depth(3)),
            staging: Some(Staging::Off),
            watchdog: Some(4.5),
            max_failures: Some(1),
            standby: Some(Standby::Rank(2)),
            wire: Some(WireFormat::Bf16),
            overlap: Some(0.5),
            fragments: Some(2),
            overhead_target: Some(0.03),
            eval_every: Some(2),
            checkpoint_dir: Some("ck".into()),
            checkpoint_every: Some(2),
            checkpoint_every_reduces: Some(5),
            keep_checkpoints: Some(2),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

    /// Every field of the library, by an exhaustive match: a new `Field` does not compile here
    /// until it is listed, with the key that sets it or none.
    fn every_field() -> Vec<(Field, Option<&'static str>)> {
        let all = vec![
            (Field::Dataset, None),
            (Field::EvalEvery, Some("eval-every")),
            (Field::EvalRank, None),
            (Field::Standby, Some("standby")),
            (Field::BatchSize, Some("batch-size")),
            (Field::Epochs, Some("epochs")),
            (Field::Devices, Some("devices")),
            (Field::Backend, Some("backend")),
            (Field::LearningRate, Some("lr")),
            (Field::Schedule, Some("schedule")),
            (Field::WarmupEpochs, Some("warmup-epochs")),
            (Field::LrScaleRatio, None),
            (Field::Elche, None),
            (Field::Slowdown, Some("slowdown")),
            (Field::SpeedChange, Some("speed-change")),
            (Field::StallTimeout, None),
            (Field::SnapshotTimeout, None),
            (Field::Watchdog, Some("watchdog")),
            (Field::Gamma, None),
            (Field::Outer, None),
            (Field::Easgd, None),
            (Field::MaxGradNorm, None),
            (Field::Checkpoint, Some("checkpoint-dir")),
            (Field::CheckpointEvery, Some("checkpoint-every")),
            (Field::KeepCheckpoints, Some("keep-checkpoints")),
            (Field::ModelSize, None),
            (Field::Model, None),
            (Field::Wire, Some("wire")),
            (Field::Overlap, Some("overlap")),
            (Field::Fragments, Some("fragments")),
            (Field::OverheadTarget, Some("overhead-target")),
            (Field::Cluster, None),
        ];
        for (field, _) in &all {
            match field {
                Field::Dataset
                | Field::EvalEvery
                | Field::EvalRank
                | Field::Standby
                | Field::BatchSize
                | Field::Epochs
                | Field::Devices
                | Field::Backend
                | Field::LearningRate
                | Field::Schedule
                | Field::WarmupEpochs
                | Field::LrScaleRatio
                | Field::Elche
                | Field::Slowdown
                | Field::SpeedChange
                | Field::StallTimeout
                | Field::SnapshotTimeout
                | Field::Watchdog
                | Field::Gamma
                | Field::Outer
                | Field::Easgd
                | Field::MaxGradNorm
                | Field::Checkpoint
                | Field::CheckpointEvery
                | Field::KeepCheckpoints
                | Field::ModelSize
                | Field::Model
                | Field::Wire
                | Field::Overlap
                | Field::Fragments
                | Field::OverheadTarget
                | Field::Cluster => {}
            }
        }
        all
    }

    #[test]
    fn every_field_a_setting_reaches_maps_to_its_key() -> Result<()> {
        let all = RunSettings::every_field_set();
        let table: toml::Table = toml::from_str(&toml::to_string(&all)?)?;
        // Every field set is a key, and reads back the same.
        assert_eq!(table.len(), format!("{all:?}").matches(": Some(").count());
        assert_eq!(toml::from_str::<RunSettings>(&toml::to_string(&all)?)?, all);
        let unset = RunSettings::default();
        for (field, key) in every_field() {
            assert_eq!(unset.key(field), key, "{field}");
            if let Some(key) = key {
                assert!(table.contains_key(key), "{field}: {key} is no setting");
            }
        }
        let by_count = RunSettings { ranks: Some(2), ..RunSettings::default() };
        assert_eq!(by_count.key(Field::Devices), Some("ranks"));
        let reduces = RunSettings { checkpoint_every_reduces: Some(2), ..RunSettings::default() };
        assert_eq!(reduces.key(Field::CheckpointEvery), Some("checkpoint-every-reduces"));
        Ok(())
    }

    #[test]
    fn or_takes_each_setting_from_the_higher_source() {
        let flags = RunSettings { epochs: Some(5), ..RunSettings::default() };
        let file = RunSettings { epochs: Some(3), seed: Some(7), ..RunSettings::default() };
        let merged = flags.or(file).or(RunSettings::every_field_set());
        assert_eq!((merged.epochs, merged.seed, merged.lr), (Some(5), Some(7), Some(0.5)));
        assert_eq!(
            RunSettings::default().or(RunSettings::every_field_set()),
            RunSettings::every_field_set()
        );
        assert_eq!(
            RunSettings::every_field_set().or(RunSettings::default()),
            RunSettings::every_field_set()
        );
    }
}

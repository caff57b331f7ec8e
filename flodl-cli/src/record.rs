//! The run directory's file schemas: `metrics.jsonl` records and `summary.json`.

use serde::{Deserialize, Serialize};

use crate::config::{RunOptions, TrainConfig};

/// One line of `metrics.jsonl`, tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Record {
    /// An epoch was aggregated (and maybe evaluated).
    Epoch(EpochRecord),
    /// The replicas were averaged.
    Reduce(ReduceRecord),
}

/// One aggregated epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EpochRecord {
    /// Epoch number, 1-based.
    pub(crate) epoch: usize,
    /// Seconds since training started.
    pub(crate) t_s: f64,
    /// Wall time of the epoch in milliseconds.
    pub(crate) epoch_ms: f64,
    /// Mean training loss over the epoch's batches.
    pub(crate) train_loss: f64,
    /// Test-set evaluation, when this epoch was evaluated.
    pub(crate) eval: Option<EvalRecord>,
    /// Per-rank work in this epoch.
    pub(crate) ranks: Vec<RankEpoch>,
}

/// A test-set evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct EvalRecord {
    /// Mean loss on the test set.
    pub(crate) loss: f64,
    /// Fraction of correct predictions, in [0, 1].
    pub(crate) accuracy: f64,
}

/// One rank's share of an epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RankEpoch {
    /// Rank index.
    pub(crate) rank: usize,
    /// Samples this rank trained on.
    pub(crate) samples: u64,
    /// Samples per second.
    pub(crate) samples_per_s: f64,
    /// Fraction of the epoch's samples done by this rank.
    pub(crate) share: f64,
}

/// One averaging event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ReduceRecord {
    /// 1-based count of reduces so far.
    pub(crate) index: u64,
    /// Seconds since training started.
    pub(crate) t_s: f64,
    /// Time the reduce took, in milliseconds.
    pub(crate) sync_ms: f64,
    /// ElChe anchor (batches of the slowest rank per window) after this reduce.
    pub(crate) anchor: Option<u64>,
    /// Batches each rank did since the previous reduce.
    pub(crate) batches: Vec<u64>,
}

/// `summary.json`: what ran and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Summary {
    /// Run name (the run directory's name).
    pub(crate) name: String,
    /// Version of fdl that wrote the run.
    pub(crate) fdl_version: String,
    /// Start time, UTC, RFC 3339.
    pub(crate) started_at: String,
    /// The resolved configuration.
    pub(crate) config: TrainConfig,
    /// The resolved run options.
    pub(crate) options: RunOptions,
    /// Device of each rank (`cpu`, `cuda:0`).
    pub(crate) devices: Vec<String>,
    /// Epochs finished.
    pub(crate) epochs_completed: usize,
    /// Wall time of training in seconds (without data loading and the final evaluation).
    pub(crate) train_wall_s: f64,
    /// Mean training loss of the last epoch.
    pub(crate) final_train_loss: Option<f64>,
    /// Final test-set evaluation.
    pub(crate) test: Option<EvalRecord>,
    /// Number of reduces.
    pub(crate) syncs: u64,
    /// Mean reduce time in milliseconds.
    pub(crate) avg_sync_ms: Option<f64>,
    /// Per-rank totals.
    pub(crate) ranks: Vec<RankSummary>,
}

/// Per-rank totals of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RankSummary {
    /// Rank index.
    pub(crate) rank: usize,
    /// Device of the rank.
    pub(crate) device: String,
    /// Samples trained on.
    pub(crate) samples: u64,
    /// Mean samples per second.
    pub(crate) samples_per_s: f64,
    /// Fraction of all samples done by this rank.
    pub(crate) share: f64,
    /// Fraction of the training wall time the rank spent waiting, when known.
    pub(crate) idle: Option<f64>,
}

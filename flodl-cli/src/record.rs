//! The run directory's file schemas: `metrics.jsonl` records and `summary.json`.

use serde::{Deserialize, Serialize};

use std::path::PathBuf;

use flodl_ddp::{
    EpochMetrics, EvalMetrics, FaultEvent, GuardEvent, ReduceEvent, RejoinEvent, RunSpec,
    Straggler, TimeBreakdown,
};

use crate::args::RunFlags;

/// What a line of `metrics.jsonl` reports, tagged by `kind`: flodl-ddp's `Report` (`epoch`,
/// `reduce`, with the library's field names) plus the divergence guard's reading of each reduce
/// (`guard`), the rank deaths (`fault`) and the ranks that joined again (`rejoin`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Entry {
    /// An epoch finished.
    Epoch(EpochMetrics),
    /// A reduce finished.
    Reduce(ReduceEvent),
    /// The divergence guard read a reduce: its verdict is why windows stop growing or shrink.
    Guard(GuardEvent),
    /// A rank was declared dead.
    Fault(FaultEvent),
    /// A rank joined the run again after its death.
    Rejoin(RejoinEvent),
}

/// One line of `metrics.jsonl`: an entry plus, on epoch lines, when fdl received it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Line {
    /// The report.
    #[serde(flatten)]
    pub(crate) entry: Entry,
    /// Seconds since training started when fdl received the report (epoch lines; reduce and
    /// fault lines carry the library's own `at_ms`, a guard line its reduce's `round`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) t_s: Option<f64>,
    /// An epoch restored from the checkpoint the run resumed from (trained by an earlier run).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) restored: bool,
}

impl Line {
    /// Seconds since training started at which this happened.
    pub(crate) fn time_s(&self) -> Option<f64> {
        match &self.entry {
            Entry::Reduce(r) => Some(r.at_ms / 1000.0),
            Entry::Fault(f) => Some(f.at_ms / 1000.0),
            Entry::Rejoin(r) => Some(r.at_ms / 1000.0),
            Entry::Epoch(_) | Entry::Guard(_) => self.t_s,
        }
    }
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
    /// The resolved configuration: one table of the flags' names (a run directory written by
    /// an older `fdl` holds its own layout, shown as it is).
    pub(crate) config: serde_json::Value,
    /// The resolved run options (resume, run directory, dashboard).
    pub(crate) options: RunFlags,
    /// Device of each rank (`cpu`, `cuda:0`).
    pub(crate) devices: Vec<String>,
    /// Epochs finished.
    pub(crate) epochs_completed: usize,
    /// Training wall time in seconds: first batch to last epoch done (the library's `train_ms`).
    pub(crate) train_wall_s: f64,
    /// Wall time of the whole run in seconds (replica construction and final evaluation too).
    pub(crate) run_wall_s: f64,
    /// Mean training loss of the last epoch.
    pub(crate) final_train_loss: Option<f64>,
    /// Final test-set evaluation.
    pub(crate) test: Option<EvalMetrics>,
    /// The returned model evaluated on the first `--train-eval` training samples, when asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) train_eval: Option<EvalMetrics>,
    /// Number of reduces.
    pub(crate) syncs: u64,
    /// Mean reduce time in milliseconds.
    pub(crate) avg_sync_ms: Option<f64>,
    /// Per-rank totals.
    pub(crate) ranks: Vec<RankSummary>,
    /// The rank that held the run back most and what it lost its time to (flodl-ddp's
    /// `straggler` over the ranks' breakdowns), when there are two ranks with time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) held_back: Option<Straggler>,
    /// The bundle the run resumed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) resumed_from: Option<PathBuf>,
    /// Epochs restored from that bundle (trained by an earlier run).
    #[serde(default)]
    pub(crate) epochs_restored: usize,
    /// The newest checkpoint bundle the run left, when it saves checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) checkpoint: Option<PathBuf>,
    /// Ranks declared dead during the run, in order.
    #[serde(default)]
    pub(crate) faults: Vec<FaultEvent>,
    /// Ranks that joined the run again after their death, in order.
    #[serde(default)]
    pub(crate) rejoins: Vec<RejoinEvent>,
    /// The run specification every rank agreed on (flodl-ddp's `RunSpec`: devices, resolved
    /// schedule, timeouts, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) spec: Option<RunSpec>,
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
    /// Fraction of the training wall time the rank spent outside training steps (waiting for
    /// data, a reduce or the cohort), when known: from its breakdown when it has one.
    pub(crate) idle: Option<f64>,
    /// Where its training wall time went, summed over the epochs.
    #[serde(default)]
    pub(crate) time: TimeBreakdown,
    /// Time it waited for its batches' data over the epochs, in milliseconds (its breakdown's
    /// `data` part).
    #[serde(default)]
    pub(crate) data_starve_ms: f64,
    /// Its staging cache's hit ratio over the run, when it staged its data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) hit_ratio: Option<f64>,
    /// The bytes its model state moved over its connection (host backend across processes;
    /// none for a rank exchanging in memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) wire: Option<WireTotals>,
}

/// One rank's bytes on the wire over a run, from the reduce records (`wire` of each).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct WireTotals {
    /// Bytes it sent (its snapshots).
    pub(crate) sent_bytes: u64,
    /// Bytes it received (the consensus updates).
    pub(crate) received_bytes: u64,
    /// Mean bytes of one snapshot (over the reduces it sent one in).
    pub(crate) sent_per_reduce: f64,
    /// Mean bytes of one update (over the reduces that counted one: none for the first).
    pub(crate) received_per_reduce: f64,
}

impl WireTotals {
    /// Each rank's totals over the reduce records in `lines` (`None` for a rank with no bytes).
    pub(crate) fn of(lines: &[Line], world: usize) -> Vec<Option<WireTotals>> {
        let mut sums = vec![(0u64, 0u64, 0u64, 0u64); world];
        for line in lines {
            let Entry::Reduce(r) = &line.entry else { continue };
            for (sum, x) in sums.iter_mut().zip(&r.wire) {
                sum.0 += x.sent_bytes;
                sum.1 += x.received_bytes;
                sum.2 += u64::from(x.sent_bytes > 0);
                sum.3 += u64::from(x.received_bytes > 0);
            }
        }
        let mean = |b: u64, n: u64| if n > 0 { b as f64 / n as f64 } else { 0.0 };
        sums.into_iter()
            .map(|(sent, received, ns, nr)| {
                (ns + nr > 0).then(|| WireTotals {
                    sent_bytes: sent,
                    received_bytes: received,
                    sent_per_reduce: mean(sent, ns),
                    received_per_reduce: mean(received, nr),
                })
            })
            .collect()
    }
}

//! The dashboard's picture of the running job: what it was told, and the figures derived from it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use flodl_ddp::{Backend, EvalMetrics, FaultEvent, Policy, ReduceEvent};

use crate::record::{Entry, Line};
use crate::tally::RankTally;

/// What the dashboard knows of the run before it starts.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    /// Run name (its directory's name).
    pub(crate) name: String,
    /// Start time, UTC, RFC 3339.
    pub(crate) started_at: String,
    /// Device of each rank.
    pub(crate) devices: Vec<String>,
    /// When the replicas are averaged.
    pub(crate) policy: Policy,
    /// How they are averaged.
    pub(crate) backend: Backend,
    /// Epochs the run trains to.
    pub(crate) epochs: usize,
    /// Per-rank batch size.
    pub(crate) batch_size: usize,
    /// The bundle the run resumes from.
    pub(crate) resumed_from: Option<PathBuf>,
    /// Epochs restored from that bundle.
    pub(crate) epochs_restored: usize,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Every epoch trained.
    Completed,
    /// It stopped with this error.
    Failed(String),
}

/// Where the run is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Stage {
    /// Training.
    Running,
    /// Over, this long after the dashboard started.
    Ended {
        /// How.
        ending: Ending,
        /// Seconds since the start.
        after_s: f64,
    },
}

impl Stage {
    /// `running`, `completed` or `failed`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Stage::Running => "running",
            Stage::Ended { ending: Ending::Completed, .. } => "completed",
            Stage::Ended { ending: Ending::Failed(_), .. } => "failed",
        }
    }
}

/// Records kept at most; beyond it, every other reduce record of the older half is folded into
/// [`Folded`] (the page thins its charts to far fewer points anyway), so a long run's dashboard
/// stays within a bound.
const MAX_LINES: usize = 20_000;

/// The reduce records folded out of the kept lines: what the figures still count of them.
#[derive(Debug, Default)]
struct Folded {
    reduces: u64,
    sync_ms: f64,
    /// Bytes on each rank's connection, both ways, by rank.
    wire_bytes: Vec<u64>,
}

/// Adds a reduce's bytes on the wire, both ways, to `totals` (by rank).
fn add_wire(totals: &mut Vec<u64>, r: &ReduceEvent) {
    if totals.len() < r.wire.len() {
        totals.resize(r.wire.len(), 0);
    }
    for (t, x) in totals.iter_mut().zip(&r.wire) {
        *t += x.sent_bytes + x.received_bytes;
    }
}

/// The live record of a run: what was reported so far (older reduces thinned past
/// [`MAX_LINES`], their counts kept).
#[derive(Debug)]
pub(crate) struct LiveRun {
    meta: Meta,
    started: Instant,
    lines: Vec<Line>,
    folded: Folded,
    tally: RankTally,
    stage: Stage,
}

/// The figures of the run at one moment: what the page shows and `/metrics` exports.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Figures {
    /// Where the run is.
    pub(crate) stage: Stage,
    /// Seconds since training started (frozen at the end).
    pub(crate) elapsed_s: f64,
    /// Epochs finished, restored ones included.
    pub(crate) epochs_done: usize,
    /// Mean training loss of the last finished epoch.
    pub(crate) train_loss: Option<f64>,
    /// The newest test-set evaluation.
    pub(crate) eval: Option<EvalMetrics>,
    /// Reduces so far.
    pub(crate) reduces: u64,
    /// Their summed duration in milliseconds.
    pub(crate) sync_ms_total: f64,
    /// The newest reduce: ElChe's anchor, the window planned and trained per rank, its time.
    pub(crate) last_reduce: Option<ReduceEvent>,
    /// Ranks declared dead, in order.
    pub(crate) deaths: Vec<FaultEvent>,
    /// Per rank.
    pub(crate) ranks: Vec<RankFigures>,
}

/// One rank's figures.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RankFigures {
    /// Rank index.
    pub(crate) rank: usize,
    /// Its device.
    pub(crate) device: String,
    /// Not declared dead.
    pub(crate) alive: bool,
    /// Samples trained in this run so far.
    pub(crate) samples: u64,
    /// Those samples per second of wall time since the start.
    pub(crate) samples_per_s: f64,
    /// Samples per second of its compute in the last finished epoch.
    pub(crate) compute_per_s: Option<f64>,
    /// Its fraction of all samples trained in this run so far.
    pub(crate) share: f64,
    /// Batches ElChe planned for it in the newest reduce window.
    pub(crate) window_planned: Option<usize>,
    /// Batches it trained in that window.
    pub(crate) window_trained: Option<usize>,
    /// Its fraction of that window's batches.
    pub(crate) window_share: Option<f64>,
    /// Bytes its connection carried per second since the start, both ways (none in memory).
    pub(crate) link_bytes_per_s: Option<f64>,
}

impl LiveRun {
    /// A run that starts now.
    pub(crate) fn new(meta: Meta) -> Self {
        let tally = RankTally::new(meta.devices.len(), meta.batch_size);
        Self {
            meta,
            started: Instant::now(),
            lines: Vec::new(),
            folded: Folded::default(),
            tally,
            stage: Stage::Running,
        }
    }

    /// What the run is.
    pub(crate) fn meta(&self) -> &Meta {
        &self.meta
    }

    /// The records kept, in order (older reduces thinned past [`MAX_LINES`]).
    pub(crate) fn lines(&self) -> &[Line] {
        &self.lines
    }

    /// Takes in one record of the run (ignored once the run has ended).
    pub(crate) fn record(&mut self, line: Line) {
        if self.stage != Stage::Running {
            return;
        }
        match &line.entry {
            Entry::Reduce(r) => self.tally.reduce(r),
            Entry::Epoch(m) if !line.restored => self.tally.epoch(m),
            Entry::Epoch(_) | Entry::Fault(_) | Entry::Rejoin(_) | Entry::Guard(_) => {}
        }
        self.lines.push(line);
        if self.lines.len() > MAX_LINES {
            self.fold();
        }
    }

    /// Folds every other reduce record of the older half into [`Folded`].
    fn fold(&mut self) {
        let half = self.lines.len() / 2;
        let (mut index, mut nth_reduce) = (0, 0u64);
        let folded = &mut self.folded;
        self.lines.retain(|line| {
            index += 1;
            let Entry::Reduce(r) = &line.entry else { return true };
            nth_reduce += 1;
            if index > half || nth_reduce % 2 == 0 {
                return true;
            }
            folded.reduces += 1;
            folded.sync_ms += r.sync_ms;
            add_wire(&mut folded.wire_bytes, r);
            false
        });
    }

    /// Marks the run over (the first ending counts).
    pub(crate) fn end(&mut self, ending: Ending) {
        if self.stage == Stage::Running {
            self.stage = Stage::Ended { ending, after_s: self.started.elapsed().as_secs_f64() };
        }
    }

    /// The figures now.
    pub(crate) fn figures(&self) -> Figures {
        self.figures_at(self.started.elapsed())
    }

    /// The figures `since_start` after the start (the end time once the run is over).
    pub(crate) fn figures_at(&self, since_start: Duration) -> Figures {
        let elapsed_s = match &self.stage {
            Stage::Running => since_start.as_secs_f64(),
            Stage::Ended { after_s, .. } => *after_s,
        };
        let mut f = Figures {
            stage: self.stage.clone(),
            elapsed_s,
            epochs_done: 0,
            train_loss: None,
            eval: None,
            reduces: self.folded.reduces,
            sync_ms_total: self.folded.sync_ms,
            last_reduce: None,
            deaths: Vec::new(),
            ranks: Vec::new(),
        };
        let mut last_epoch = None;
        let mut last_reduce: Option<&ReduceEvent> = None;
        let mut wire_bytes = self.folded.wire_bytes.clone();
        for line in &self.lines {
            match &line.entry {
                Entry::Epoch(m) => {
                    f.epochs_done += 1;
                    f.train_loss = Some(m.avg_loss);
                    f.eval = m.eval.or(f.eval);
                    if !line.restored {
                        last_epoch = Some(m);
                    }
                }
                Entry::Reduce(r) => {
                    f.reduces += 1;
                    f.sync_ms_total += r.sync_ms;
                    add_wire(&mut wire_bytes, r);
                    last_reduce = Some(r);
                }
                Entry::Fault(d) => f.deaths.push(d.clone()),
                Entry::Rejoin(_) | Entry::Guard(_) => {}
            }
        }
        f.last_reduce = last_reduce.cloned();
        let counts = self.tally.counts();
        let total: u64 = counts.iter().sum();
        let window_total: usize = last_reduce.map_or(0, |r| r.steps.iter().sum());
        f.ranks = self
            .meta
            .devices
            .iter()
            .enumerate()
            .map(|(rank, device)| {
                let samples = counts.get(rank).copied().unwrap_or(0);
                let trained = last_reduce.and_then(|r| r.steps.get(rank).copied());
                RankFigures {
                    rank,
                    device: device.clone(),
                    alive: !f.deaths.iter().any(|d| d.rank == rank),
                    samples,
                    samples_per_s: if elapsed_s > 0.0 { samples as f64 / elapsed_s } else { 0.0 },
                    compute_per_s: last_epoch
                        .and_then(|m| m.ranks.iter().find(|r| r.rank == rank))
                        .map(|r| r.throughput),
                    share: if total > 0 { samples as f64 / total as f64 } else { 0.0 },
                    window_planned: last_reduce.and_then(|r| r.counts.get(rank).copied()),
                    window_trained: trained,
                    window_share: trained
                        .filter(|_| window_total > 0)
                        .map(|t| t as f64 / window_total as f64),
                    link_bytes_per_s: wire_bytes
                        .get(rank)
                        .filter(|&&b| b > 0 && elapsed_s > 0.0)
                        .map(|&b| b as f64 / elapsed_s),
                }
            })
            .collect();
        f
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use flodl_ddp::{FaultCause, RankEpochMetrics};

    pub(crate) fn meta() -> Meta {
        Meta {
            name: "live<run>".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            devices: vec!["cpu".into(), "cpu".into()],
            policy: Policy::Cadence,
            backend: Backend::Collective,
            epochs: 3,
            batch_size: 10,
            resumed_from: None,
            epochs_restored: 0,
        }
    }

    pub(crate) fn reduce(round: u64, steps: [usize; 2]) -> Line {
        let entry = Entry::Reduce(ReduceEvent {
            round,
            epoch: 0,
            at_ms: round as f64 * 100.0,
            anchor: 4 + round as usize,
            counts: vec![4, 12],
            steps: steps.to_vec(),
            walls_ms: Vec::new(),
            exposed_ms: Vec::new(),
            sync_ms: 2.0,
            wire: Vec::new(),
            ordered_ahead: Vec::new(),
        });
        Line { entry, t_s: None, restored: false }
    }

    pub(crate) fn epoch(epoch: usize, samples: [usize; 2], restored: bool) -> Line {
        let ranks = samples
            .iter()
            .enumerate()
            .map(|(rank, &samples)| RankEpochMetrics {
                rank,
                device: "cpu".into(),
                batches: samples / 10,
                samples,
                avg_loss: 1.0,
                compute_ms: 100.0,
                throughput: samples as f64 * 10.0,
                batch_share: 0.5,
                time: Default::default(),
                data_starve_ms: 0.0,
                cache: None,
                hit_ratio: None,
            })
            .collect();
        let eval =
            Some(EvalMetrics { loss: 0.5, accuracy: 0.8 + epoch as f64 / 100.0, samples: 9 });
        let entry = Entry::Epoch(flodl_ddp::EpochMetrics {
            epoch,
            avg_loss: 1.0 / (epoch + 1) as f64,
            epoch_ms: 1000.0,
            samples: samples.iter().sum(),
            throughput: 1.0,
            ranks,
            scalars: Default::default(),
            reduces: 1,
            sync_ms: 2.0,
            eval,
            at_ms: 1000.0 * (epoch + 1) as f64,
        });
        let t_s = (!restored).then_some(epoch as f64 + 1.0);
        Line { entry, t_s, restored }
    }

    pub(crate) fn death(rank: usize) -> Line {
        let entry = Entry::Fault(FaultEvent {
            rank,
            at_ms: 1500.0,
            cause: FaultCause::Failed { error: "boom".into() },
            survivors: vec![0],
            requeued_samples: 0,
        });
        Line { entry, t_s: None, restored: false }
    }

    /// Rank figures follow the newest window and the tally; a death marks its rank; the end
    /// freezes the clock and later records are ignored.
    #[test]
    fn figures_follow_the_records() {
        let mut live = LiveRun::new(meta());
        let f = live.figures_at(Duration::from_secs(1));
        assert_eq!((f.reduces, f.epochs_done, f.stage.label()), (0, 0, "running"));
        assert!(f.ranks.iter().all(|r| r.samples == 0 && r.window_share.is_none()));
        live.record(epoch(0, [100, 300], true));
        live.record(reduce(1, [4, 12]));
        let f = live.figures_at(Duration::from_secs(2));
        assert_eq!((f.reduces, f.epochs_done), (1, 1));
        assert_eq!(f.last_reduce.as_ref().map(|r| r.anchor), Some(5));
        // A restored epoch is not this run's work.
        let samples: Vec<u64> = f.ranks.iter().map(|r| r.samples).collect();
        assert_eq!(samples, [40, 120]);
        assert_eq!(f.ranks[1].window_share, Some(0.75));
        assert_eq!((f.ranks[1].window_planned, f.ranks[1].samples_per_s), (Some(12), 60.0));
        assert_eq!(f.ranks[0].compute_per_s, None);
        live.record(epoch(1, [50, 150], false));
        live.record(death(1));
        let f = live.figures_at(Duration::from_secs(4));
        assert_eq!(f.ranks[0].compute_per_s, Some(500.0));
        assert_eq!((f.ranks[0].alive, f.ranks[1].alive, f.deaths.len()), (true, false, 1));
        assert_eq!((f.ranks[0].share, f.train_loss), (0.25, Some(0.5)));
        assert_eq!(f.eval.map(|e| e.accuracy), Some(0.81));
        live.end(Ending::Failed("x".into()));
        live.record(reduce(2, [1, 1]));
        let (a, b) = (live.figures_at(Duration::from_secs(9)), live.figures_at(Duration::ZERO));
        assert_eq!((a.stage.label(), a.reduces), ("failed", 1));
        assert_eq!(a, b);
    }

    /// A run of many reduces keeps at most [`MAX_LINES`] records, yet counts every reduce and
    /// every millisecond of their sync time, and keeps its epochs and the newest reduce.
    #[test]
    fn records_stay_within_a_bound_and_counts_stay_whole() {
        let mut live = LiveRun::new(meta());
        let total = 3 * MAX_LINES + 7;
        let mut sync_ms = 0.0;
        for i in 0..total {
            let line = reduce(i as u64 + 1, [1, 3]);
            if let Entry::Reduce(r) = &line.entry {
                sync_ms += r.sync_ms;
            }
            live.record(line);
            if i % 1000 == 0 {
                live.record(epoch(i / 1000, [1, 1], false));
            }
            assert!(live.lines().len() <= MAX_LINES + 1);
        }
        let f = live.figures_at(Duration::from_secs(1));
        assert_eq!(f.reduces, total as u64);
        assert!((f.sync_ms_total - sync_ms).abs() <= 1e-6 * sync_ms.max(1.0));
        assert_eq!(f.epochs_done, total.div_ceil(1000));
        assert_eq!(f.last_reduce.as_ref().map(|r| r.round), Some(total as u64));
    }
}

//! What a run reports: per-epoch metrics, per-reduce events and user scalars.

use std::cell::RefCell;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::control::breakdown::{Activity, TimeBreakdown};

/// Aggregated metrics of one epoch, emitted once every sample of the epoch has been trained.
///
/// Serialises with serde; field names are stable (the CLI writes them to `metrics.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochMetrics {
    /// The epoch, from 0.
    pub epoch: usize,
    /// Mean training loss over every batch of the epoch (all ranks, batch-weighted; the batches
    /// of a dead rank that it never reported carry no loss and are left out).
    pub avg_loss: f64,
    /// Wall time of the epoch in milliseconds: first batch handed out to last batch done.
    pub epoch_ms: f64,
    /// Samples trained in the epoch, all ranks together.
    pub samples: usize,
    /// Aggregate training throughput of the epoch in samples per second (`samples / epoch_ms`).
    pub throughput: f64,
    /// One entry per rank, in rank order.
    pub ranks: Vec<RankEpochMetrics>,
    /// User scalars recorded with [`record_scalar`] during the epoch: the batch-weighted mean
    /// over ranks of each rank's mean.
    pub scalars: BTreeMap<String, f64>,
    /// Reduces (parameter averages) completed while this epoch was the oldest unfinished one.
    pub reduces: usize,
    /// Time spent in those reduces, in milliseconds (per reduce: the slowest rank's view).
    pub sync_ms: f64,
    /// Evaluation on the test dataset, when one is configured for this epoch.
    pub eval: Option<EvalMetrics>,
    /// When the epoch was complete, in milliseconds since the run started (its evaluation
    /// aside); in a resumed run, since the resumed run started.
    #[serde(default)]
    pub at_ms: f64,
}

/// One rank's share of an epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankEpochMetrics {
    /// The rank.
    pub rank: usize,
    /// The device it trains on, as `cpu` or `cuda:N`.
    pub device: String,
    /// Batches it trained in this epoch (a rank that died: those the consensus holds).
    pub batches: usize,
    /// Samples it trained in this epoch (a rank that died: those the consensus holds).
    pub samples: usize,
    /// Its mean training loss over the batches it reported (0 when none).
    pub avg_loss: f64,
    /// Time spent in its training steps (forward, backward, optimizer), in milliseconds.
    pub compute_ms: f64,
    /// Its training throughput in samples per second of compute (`samples / compute_ms`, over
    /// the samples it reported), including emulated slowdown.
    pub throughput: f64,
    /// Its fraction of the epoch's samples (the shares of all ranks sum to 1).
    pub batch_share: f64,
    /// Where its wall time went: the time between two of its chunk reports counts for the
    /// epoch of the later chunk, and the wait after its last chunk for the last epoch, so the
    /// parts of all epochs sum to its training wall time.
    #[serde(default)]
    pub time: TimeBreakdown,
    /// Time it waited for its batches' data (fetch and upload beyond its training steps), in
    /// milliseconds: the `data` part of [`RankEpochMetrics::time`].
    #[serde(default)]
    pub data_starve_ms: f64,
    /// Where its batches' samples came from, when it stages its data in a cache.
    #[serde(default)]
    pub cache: Option<CacheTally>,
    /// Its cache's hit ratio (hits over samples fetched), when it stages its data.
    #[serde(default)]
    pub hit_ratio: Option<f64>,
}

/// Samples a rank's staging cache served (hits) and read from the dataset (misses).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheTally {
    /// Samples served from the cache.
    pub hits: u64,
    /// Samples read from the dataset.
    pub misses: u64,
}

impl CacheTally {
    /// Adds `other`'s counts.
    pub fn merge(&mut self, other: &CacheTally) {
        self.hits += other.hits;
        self.misses += other.misses;
    }

    /// Hits over samples fetched (0 when nothing was fetched).
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.hits as f64, (self.hits + self.misses) as f64)
    }
}

/// Adds `add` to an optional tally (none stays none only when `add` is none).
pub(crate) fn merge_cache(into: &mut Option<CacheTally>, add: Option<&CacheTally>) {
    if let Some(a) = add {
        into.get_or_insert_with(CacheTally::default).merge(a);
    }
}

/// The result of evaluating the (averaged) model on a test dataset.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EvalMetrics {
    /// Mean loss per sample.
    pub loss: f64,
    /// Fraction of samples classified correctly, in [0, 1].
    pub accuracy: f64,
    /// Samples evaluated.
    pub samples: usize,
}

/// One reduce (parameter average across ranks), as reported while the run goes on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReduceEvent {
    /// Sequence number of the reduce, from 1.
    pub round: u64,
    /// The oldest epoch not yet finished when the reduce completed.
    pub epoch: usize,
    /// Milliseconds since the run started, at completion.
    pub at_ms: f64,
    /// ElChe's anchor (batches of the slowest rank per window) for the window that just ended.
    pub anchor: usize,
    /// Planned batches per rank for the window that just ended.
    pub counts: Vec<usize>,
    /// Batches each rank actually trained in it (its averaging weight before normalisation).
    pub steps: Vec<usize>,
    /// Each rank's training ms in it, as it reported them (ElChe's reading with `steps`; 0
    /// for a rank that reported none).
    #[serde(default)]
    pub walls_ms: Vec<f64>,
    /// What the reduce that opened the window cost each rank, ms: the exchange it could not
    /// train through, as it measured it (ElChe's reading; `null` for a rank with none).
    #[serde(default)]
    pub exposed_ms: Vec<Option<f64>>,
    /// Duration of the reduce in milliseconds (collective: slowest rank's all-reduce; host:
    /// snapshot request to update sent).
    pub sync_ms: f64,
    /// Host backend: each rank's bytes on the wire, by rank (zeros for a rank in the
    /// controller's own process, which exchanges in memory, and on the collective backend).
    #[serde(default)]
    pub wire: Vec<Exchange>,
    /// Host backend: the ranks whose snapshot was ordered before the reduce began (`Cadence`'s
    /// anchor, its window over while the others finished their batch), so it travelled
    /// meanwhile.
    #[serde(default)]
    pub ordered_ahead: Vec<usize>,
}

/// The bytes one rank's model state moved over its connection in one host reduce, as the
/// controller's end of the link counted them: its snapshot frame of this reduce and the update
/// frame it trained from (the previous reduce's), in the run's wire format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exchange {
    /// Bytes the rank sent (its snapshot frame).
    pub sent_bytes: u64,
    /// Bytes the rank received (the consensus update frame before it).
    pub received_bytes: u64,
}

/// The divergence guard's reading of one reduce (policies other than `Sync`, with a guard on).
///
/// The verdict is obeyed by ElChe when the next window is sized (the guard sees a reduce once
/// it has completed, after the next window's counts were proposed).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GuardEvent {
    /// The reduce's sequence number (as in [`ReduceEvent::round`]).
    pub round: u64,
    /// `max_r ‖W_pre − W_post‖ / ‖W_post‖` over the ranks that took part (parameters only).
    pub divergence: f64,
    /// The largest number of batches a rank trained in the window.
    pub k_max: u64,
    /// The guard's verdict.
    pub verdict: crate::control::verdict::Verdict,
}

/// Everything a run reports, in the order it happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Report {
    /// An epoch finished.
    Epoch(EpochMetrics),
    /// A reduce finished.
    Reduce(ReduceEvent),
}

thread_local! {
    static SCALARS: RefCell<BTreeMap<String, (f64, usize)>> = const { RefCell::new(BTreeMap::new()) };
}

/// Records one value of a named user scalar on the calling rank (call it from a replica's
/// training step); values are averaged per rank and across ranks into [`EpochMetrics::scalars`].
///
/// Non-finite values are ignored.
pub fn record_scalar(name: &str, value: f64) {
    if !value.is_finite() {
        return;
    }
    SCALARS.with(|s| {
        let mut map = s.borrow_mut();
        if let Some(entry) = map.get_mut(name) {
            entry.0 += value;
            entry.1 += 1;
        } else {
            map.insert(name.to_owned(), (value, 1));
        }
    });
}

/// Takes the calling thread's recorded scalars as `name → (sum, count)` and clears them.
pub(crate) fn drain_scalars() -> BTreeMap<String, (f64, usize)> {
    SCALARS.with(|s| std::mem::take(&mut *s.borrow_mut()))
}

/// Adds `scalars` (drained from another thread, as `name → (sum, count)`) to the calling
/// thread's: a cooperative rank takes over what its user's thread recorded.
pub(crate) fn absorb_scalars(scalars: BTreeMap<String, (f64, usize)>) {
    SCALARS.with(|s| {
        let mut map = s.borrow_mut();
        for (name, (sum, count)) in scalars {
            let entry = map.entry(name).or_insert((0.0, 0));
            entry.0 += sum;
            entry.1 += count;
        }
    });
}

/// One epoch's accumulation of what the ranks did: their finished work and the reduces.
#[derive(Debug, Clone, Default)]
pub struct EpochTally {
    ranks: Vec<RankTally>,
    reduces: usize,
    sync_ms: f64,
}

#[derive(Debug, Clone, Default)]
struct RankTally {
    batches: usize,
    samples: usize,
    loss_sum: f64,
    compute_ms: f64,
    time: TimeBreakdown,
    scalars: BTreeMap<String, (f64, usize)>,
    cache: Option<CacheTally>,
    // Of `batches` and `samples`, those of a dead rank that the consensus holds but that it
    // never reported (no loss, no compute time): left out of its means and throughput.
    unreported: (usize, usize),
}

/// What a rank reports about a finished piece of work (a chunk). It travels as the link's
/// `WorkReport` (its scalars' names bounded there), so it is not serde data itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkTally {
    /// Batches trained.
    pub batches: usize,
    /// Samples trained.
    pub samples: usize,
    /// Sum of the batches' mean losses.
    pub loss_sum: f64,
    /// Time in training steps, milliseconds (emulated slowdown included).
    pub compute_ms: f64,
    /// Where the rank's time went since its previous report: a closed span, whose parts sum
    /// to its wall.
    pub time: TimeBreakdown,
    /// User scalars as `name → (sum, count)`.
    pub scalars: BTreeMap<String, (f64, usize)>,
    /// Where its batches' samples came from, when the rank stages its data.
    pub cache: Option<CacheTally>,
}

impl EpochTally {
    /// An empty tally for `world` ranks.
    pub fn new(world: usize) -> Self {
        Self { ranks: vec![RankTally::default(); world], reduces: 0, sync_ms: 0.0 }
    }

    /// Counts `batches` batches (`samples` samples) of a dead rank that the consensus holds
    /// though the rank never reported them: they count for it, without loss or compute time.
    pub fn add_unreported(&mut self, rank: usize, batches: usize, samples: usize) {
        let Some(t) = self.ranks.get_mut(rank) else { return };
        t.batches += batches;
        t.samples += samples;
        t.unreported.0 += batches;
        t.unreported.1 += samples;
    }

    /// Adds a rank's finished work.
    pub fn add(&mut self, rank: usize, work: &WorkTally) {
        let Some(t) = self.ranks.get_mut(rank) else { return };
        t.batches += work.batches;
        t.samples += work.samples;
        t.loss_sum += work.loss_sum;
        t.compute_ms += work.compute_ms;
        t.time.merge(&work.time);
        merge_cache(&mut t.cache, work.cache.as_ref());
        for (name, (sum, count)) in &work.scalars {
            let e = t.scalars.entry(name.clone()).or_insert((0.0, 0));
            e.0 += sum;
            e.1 += count;
        }
    }

    /// Adds `ms` of `activity` to a rank's time (what the coordinator saw it do: the wait
    /// after its last chunk of the run).
    pub fn add_time(&mut self, rank: usize, activity: Activity, ms: f64) {
        if let Some(t) = self.ranks.get_mut(rank) {
            t.time.add(activity, ms);
        }
    }

    /// Counts a reduce that completed while this epoch was the oldest unfinished one.
    pub fn add_reduce(&mut self, sync_ms: f64) {
        self.reduces += 1;
        self.sync_ms += sync_ms;
    }

    /// The epoch's metrics (without evaluation), for ranks on `devices`.
    pub fn finish(&self, epoch: usize, epoch_ms: f64, devices: &[String]) -> EpochMetrics {
        let reported: usize = self.ranks.iter().map(|r| r.batches - r.unreported.0).sum();
        let samples: usize = self.ranks.iter().map(|r| r.samples).sum();
        let loss_sum: f64 = self.ranks.iter().map(|r| r.loss_sum).sum();
        let ranks = self
            .ranks
            .iter()
            .enumerate()
            .map(|(rank, t)| RankEpochMetrics {
                rank,
                device: devices.get(rank).cloned().unwrap_or_default(),
                batches: t.batches,
                samples: t.samples,
                avg_loss: ratio(t.loss_sum, (t.batches - t.unreported.0) as f64),
                compute_ms: t.compute_ms,
                throughput: ratio((t.samples - t.unreported.1) as f64 * 1000.0, t.compute_ms),
                batch_share: ratio(t.samples as f64, samples as f64),
                time: t.time,
                data_starve_ms: t.time.data_ms,
                cache: t.cache,
                hit_ratio: t.cache.map(|c| c.hit_ratio()),
            })
            .collect();
        let mut weighted: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for t in &self.ranks {
            for (name, (sum, count)) in &t.scalars {
                if *count == 0 {
                    continue;
                }
                let weight = (t.batches - t.unreported.0).max(1) as f64;
                let e = weighted.entry(name.clone()).or_insert((0.0, 0.0));
                e.0 += weight * sum / *count as f64;
                e.1 += weight;
            }
        }
        let scalars = weighted.into_iter().map(|(k, (s, w))| (k, ratio(s, w))).collect();
        EpochMetrics {
            epoch,
            avg_loss: ratio(loss_sum, reported as f64),
            epoch_ms,
            samples,
            throughput: ratio(samples as f64 * 1000.0, epoch_ms),
            ranks,
            scalars,
            reduces: self.reduces,
            sync_ms: self.sync_ms,
            eval: None,
            at_ms: 0.0,
        }
    }
}

/// `num / den`, or 0 when `den` is not positive.
fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 { num / den } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_weights_losses_by_batches_and_shares_sum_to_one() -> Result<(), String> {
        let mut t = EpochTally::new(2);
        let mut a = WorkTally {
            batches: 3,
            samples: 30,
            loss_sum: 3.0,
            compute_ms: 10.0,
            ..Default::default()
        };
        a.scalars.insert("x".into(), (6.0, 3));
        let mut b = WorkTally {
            batches: 1,
            samples: 10,
            loss_sum: 2.0,
            compute_ms: 5.0,
            ..Default::default()
        };
        b.scalars.insert("x".into(), (4.0, 1));
        t.add(0, &a);
        t.add(1, &b);
        t.add_reduce(1.5);
        let m = t.finish(0, 20.0, &["cpu".into(), "cpu".into()]);
        let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
        if !close(m.avg_loss, 5.0 / 4.0) || m.samples != 40 || !close(m.throughput, 2000.0) {
            return Err(format!("bad aggregate {m:?}"));
        }
        let share: f64 = m.ranks.iter().map(|r| r.batch_share).sum();
        if !close(share, 1.0) || !close(m.ranks[0].throughput, 3000.0) {
            return Err(format!("bad per-rank {m:?}"));
        }
        // rank means 2.0 (weight 3) and 4.0 (weight 1)
        if !close(m.scalars["x"], (3.0 * 2.0 + 4.0) / 4.0) || m.reduces != 1 {
            return Err(format!("bad scalars {m:?}"));
        }
        let json = serde_json::to_string(&Report::Epoch(m.clone())).map_err(|e| e.to_string())?;
        let back: Report = serde_json::from_str(&json).map_err(|e| e.to_string())?;
        if back != Report::Epoch(m) {
            return Err("serde round trip changed the metrics".into());
        }
        Ok(())
    }

    /// A dead rank's unreported batches count in batches, samples and shares, not in its loss
    /// or throughput.
    #[test]
    fn unreported_batches_count_without_loss() -> Result<(), String> {
        let mut t = EpochTally::new(2);
        let w = WorkTally {
            batches: 2,
            samples: 20,
            loss_sum: 4.0,
            compute_ms: 10.0,
            ..Default::default()
        };
        t.add(0, &w);
        t.add(1, &w);
        t.add_unreported(1, 3, 30);
        let m = t.finish(0, 10.0, &[]);
        let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
        let r = &m.ranks[1];
        if (r.batches, r.samples, m.samples) != (5, 50, 70)
            || !close(r.avg_loss, 2.0)
            || !close(m.avg_loss, 2.0)
            || !close(r.throughput, 2000.0)
            || !close(r.batch_share, 50.0 / 70.0)
        {
            return Err(format!("bad metrics {m:?}"));
        }
        Ok(())
    }

    /// A rank's epoch time is the sum of its reports' spans plus what the coordinator adds,
    /// and still sums to its wall part by part.
    #[test]
    fn epoch_time_sums_the_reported_spans() -> Result<(), String> {
        let span = |compute: f64, data: f64, wall: f64| {
            let mut t = TimeBreakdown::default();
            t.add(Activity::Compute, compute);
            t.add(Activity::Data, data);
            t.closed(wall)
        };
        let mut tally = EpochTally::new(2);
        for (rank, compute, data, wall) in
            [(0, 8.0, 1.0, 10.0), (0, 7.0, 0.5, 9.0), (1, 3.0, 6.0, 9.5)]
        {
            let w = WorkTally {
                compute_ms: compute,
                time: span(compute, data, wall),
                ..Default::default()
            };
            tally.add(rank, &w);
        }
        tally.add_time(1, Activity::Waiting, 9.5);
        tally.add_time(7, Activity::Waiting, 1.0);
        let m = tally.finish(0, 19.0, &[]);
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9;
        let (a, b) = (&m.ranks[0].time, &m.ranks[1].time);
        if !close(a.wall_ms(), 19.0)
            || !close(a.other_ms, 2.5)
            || !close(b.wall_ms(), 19.0)
            || !close(b.waiting_ms, 9.5)
            || !close(b.data_ms, 6.0)
        {
            return Err(format!("bad times {a:?} {b:?}"));
        }
        Ok(())
    }

    #[test]
    fn scalars_drain_per_thread() {
        record_scalar("a", 1.0);
        record_scalar("a", 3.0);
        record_scalar("a", f64::NAN);
        let d = drain_scalars();
        assert_eq!(d.get("a"), Some(&(4.0, 2)));
        assert!(drain_scalars().is_empty());
    }
}

//! Samples trained per rank so far, counted live from reduce events and made exact at each epoch.

use flodl_ddp::{EpochMetrics, ReduceEvent};

/// Per-rank sample counts of the running job: reduce events give them between epochs (steps
/// times the batch size), each finished epoch's exact totals replace the estimate.
///
/// Reduce events and epoch reports come on separate queues, so a reduce that completed before
/// an epoch ended may be read after that epoch's report, and the run's last reduce completes
/// after its last epoch (it is stamped with that epoch). Such a reduce's steps are already in
/// the epoch's exact totals: a reduce stamped with an epoch already reported is not counted
/// again (the final counts are then the epochs' exact totals).
#[derive(Debug, Clone)]
pub(crate) struct RankTally {
    batch_size: u64,
    /// From finished epochs, plus reduce events since the last epoch report.
    from_reduces: Vec<u64>,
    /// From finished epochs.
    from_epochs: Vec<u64>,
    /// The newest epoch reported (of this run).
    reported: Option<usize>,
}

impl RankTally {
    /// No samples yet for `world` ranks training batches of `batch_size`.
    pub(crate) fn new(world: usize, batch_size: usize) -> Self {
        Self {
            batch_size: batch_size as u64,
            from_reduces: vec![0; world],
            from_epochs: vec![0; world],
            reported: None,
        }
    }

    /// Counts a reduce's trained steps, unless its epoch was already reported.
    pub(crate) fn reduce(&mut self, event: &ReduceEvent) {
        if self.reported.is_some_and(|e| event.epoch <= e) {
            return;
        }
        for (r, steps) in event.steps.iter().enumerate() {
            if let Some(s) = self.from_reduces.get_mut(r) {
                *s += *steps as u64 * self.batch_size;
            }
        }
    }

    /// Counts a finished epoch (of this run, not a restored one).
    pub(crate) fn epoch(&mut self, m: &EpochMetrics) {
        for r in &m.ranks {
            if let Some(s) = self.from_epochs.get_mut(r.rank) {
                *s += r.samples as u64;
            }
        }
        self.reported = self.reported.max(Some(m.epoch));
        // Reduce events may straddle epochs; the epoch totals are exact, so restart from them.
        self.from_reduces.clone_from(&self.from_epochs);
    }

    /// Samples per rank so far.
    pub(crate) fn counts(&self) -> Vec<u64> {
        self.from_reduces.iter().zip(&self.from_epochs).map(|(a, b)| *a.max(b)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flodl_ddp::RankEpochMetrics;

    fn reduce(epoch: usize, steps: Vec<usize>) -> ReduceEvent {
        ReduceEvent {
            round: 1,
            epoch,
            at_ms: 0.0,
            anchor: 1,
            counts: steps.clone(),
            steps,
            walls_ms: Vec::new(),
            exposed_ms: Vec::new(),
            sync_ms: 0.0,
            wire: Vec::new(),
            ordered_ahead: Vec::new(),
        }
    }

    fn epoch(epoch: usize, samples: &[usize]) -> EpochMetrics {
        let ranks = samples
            .iter()
            .enumerate()
            .map(|(rank, &samples)| RankEpochMetrics {
                rank,
                device: "cpu".into(),
                batches: samples / 10,
                samples,
                avg_loss: 1.0,
                compute_ms: 1.0,
                throughput: 1.0,
                batch_share: 0.5,
                time: Default::default(),
                data_starve_ms: 0.0,
                cache: None,
                hit_ratio: None,
            })
            .collect();
        EpochMetrics {
            epoch,
            avg_loss: 1.0,
            epoch_ms: 1.0,
            samples: samples.iter().sum(),
            throughput: 1.0,
            ranks,
            scalars: Default::default(),
            reduces: 1,
            sync_ms: 0.0,
            eval: None,
            at_ms: 1.0,
        }
    }

    /// Reduces estimate, epochs correct, and the count never goes back.
    #[test]
    fn reduces_estimate_and_epochs_make_exact() {
        let mut t = RankTally::new(2, 10);
        t.reduce(&reduce(0, vec![3, 5]));
        assert_eq!(t.counts(), [30, 50]);
        t.reduce(&reduce(0, vec![1, 2, 9]));
        assert_eq!(t.counts(), [40, 70]);
        t.epoch(&epoch(0, &[35, 65]));
        assert_eq!(t.counts(), [35, 65]);
        t.reduce(&reduce(1, vec![1, 1]));
        assert_eq!(t.counts(), [45, 75]);
    }

    /// The final counts are the epochs' exact totals whatever order the two queues are read in:
    /// a reduce read after the report of its epoch (the run's last reduce always is) is in that
    /// report already.
    #[test]
    fn final_counts_are_exact_in_every_reading_order() {
        // A two-epoch run: reduces stamped 0, 0, 1, 1 and the last one after the last epoch
        // (stamped with it); the epochs' exact totals.
        let reduces = [(0, [2, 3]), (0, [1, 1]), (1, [2, 2]), (1, [1, 2])];
        let epochs = [(0, [35, 45]), (1, [30, 40])];
        let want = [65, 85];
        // Each reduce read before or after the report of its epoch (the last always after).
        for late in 0u8..8 {
            let mut t = RankTally::new(2, 10);
            let mut order: Vec<(usize, bool, usize)> = Vec::new(); // (position, is_epoch, index)
            for (i, (e, _)) in reduces.iter().enumerate() {
                let after = i == reduces.len() - 1 || late & (1 << i) != 0;
                order.push((2 * e + usize::from(after) * 2, false, i));
            }
            for (i, (e, _)) in epochs.iter().enumerate() {
                order.push((2 * e + 1, true, i));
            }
            order.sort_by_key(|&(pos, _, i)| (pos, i));
            for (_, is_epoch, i) in order {
                if is_epoch {
                    t.epoch(&epoch(epochs[i].0, &epochs[i].1));
                } else {
                    t.reduce(&reduce(reduces[i].0, reduces[i].1.to_vec()));
                }
            }
            assert_eq!(t.counts(), want, "reading order {late:03b}");
        }
    }
}

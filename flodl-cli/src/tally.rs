//! Samples trained per rank so far, counted live from reduce events and made exact at each epoch.

use flodl_ddp::{EpochMetrics, ReduceEvent};

/// Per-rank sample counts of the running job: reduce events give them between epochs (steps
/// times the batch size), each finished epoch's exact totals replace the estimate.
#[derive(Debug, Clone)]
pub(crate) struct RankTally {
    batch_size: u64,
    /// Counted from reduce events since the last epoch report.
    from_reduces: Vec<u64>,
    /// From finished epochs.
    from_epochs: Vec<u64>,
}

impl RankTally {
    /// No samples yet for `world` ranks training batches of `batch_size`.
    pub(crate) fn new(world: usize, batch_size: usize) -> Self {
        Self {
            batch_size: batch_size as u64,
            from_reduces: vec![0; world],
            from_epochs: vec![0; world],
        }
    }

    /// Counts a reduce's trained steps.
    pub(crate) fn reduce(&mut self, event: &ReduceEvent) {
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

    fn reduce(steps: Vec<usize>) -> ReduceEvent {
        ReduceEvent {
            round: 1,
            epoch: 0,
            at_ms: 0.0,
            anchor: 1,
            counts: steps.clone(),
            steps,
            sync_ms: 0.0,
        }
    }

    fn epoch(samples: &[usize]) -> EpochMetrics {
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
            epoch: 0,
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
        t.reduce(&reduce(vec![3, 5]));
        assert_eq!(t.counts(), [30, 50]);
        t.reduce(&reduce(vec![1, 2, 9]));
        assert_eq!(t.counts(), [40, 70]);
        t.epoch(&epoch(&[35, 65]));
        assert_eq!(t.counts(), [35, 65]);
        t.reduce(&reduce(vec![1, 1]));
        assert_eq!(t.counts(), [45, 75]);
    }
}

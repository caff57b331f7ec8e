//! Emulated device failures: a replica that fails at a chosen training batch, to watch the
//! survivors go on (or the run end with its failure bundle).

use std::fmt;
use std::str::FromStr;

use flodl_ddp::{Batch, BatchEval, Replica};
use flodl_tensor::{Stream, Tensor};
use serde::{Deserialize, Serialize};

/// Where an emulated failure strikes: rank `rank` fails on its `batch`-th training batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FailAt {
    /// The rank that fails.
    pub(crate) rank: usize,
    /// Its training batch that fails, from 1.
    pub(crate) batch: usize,
}

impl FromStr for FailAt {
    type Err = String;

    /// `RANK@BATCH`, e.g. `1@20`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("'{s}': expected RANK@BATCH, e.g. 1@20 (batches count from 1)");
        let (rank, batch) = s.split_once('@').ok_or_else(bad)?;
        let rank = rank.trim().parse().map_err(|_| bad())?;
        let batch = batch.trim().parse().map_err(|_| bad())?;
        if batch == 0 {
            return Err(bad());
        }
        Ok(FailAt { rank, batch })
    }
}

impl fmt::Display for FailAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.rank, self.batch)
    }
}

/// A replica that trains like `inner` until its emulated failure, then returns an error from
/// that batch's training step (the runtime declares the rank dead).
#[derive(Debug)]
pub(crate) struct Failing<R> {
    inner: R,
    /// The training batch (from 1) that fails; `None`: never.
    fail_at: Option<usize>,
    trained: usize,
}

impl<R> Failing<R> {
    /// `inner`, failing at the first of `plan`'s batches for `rank` (if any).
    pub(crate) fn new(inner: R, rank: usize, plan: &[FailAt]) -> Self {
        let fail_at = plan.iter().filter(|f| f.rank == rank).map(|f| f.batch).min();
        Failing { inner, fail_at, trained: 0 }
    }
}

impl<R: Replica> Replica for Failing<R> {
    fn train_step(&mut self, batch: &Batch) -> flodl_ddp::Result<f32> {
        self.trained += 1;
        if self.fail_at == Some(self.trained) {
            return Err(flodl_ddp::Error::replica(format!(
                "emulated device failure at batch {}",
                self.trained
            )));
        }
        self.inner.train_step(batch)
    }
    fn step(&mut self, lr: f32) -> flodl_ddp::Result<()> {
        self.inner.step(lr)
    }
    fn parameters(&self) -> &[Tensor] {
        self.inner.parameters()
    }
    fn parameters_mut(&mut self) -> &mut [Tensor] {
        self.inner.parameters_mut()
    }
    fn gradients(&self) -> &[Tensor] {
        self.inner.gradients()
    }
    fn gradients_mut(&mut self) -> &mut [Tensor] {
        self.inner.gradients_mut()
    }
    fn buffers(&self) -> &[Tensor] {
        self.inner.buffers()
    }
    fn buffers_mut(&mut self) -> &mut [Tensor] {
        self.inner.buffers_mut()
    }
    fn optimizer_state(&self) -> &[Tensor] {
        self.inner.optimizer_state()
    }
    fn optimizer_state_mut(&mut self) -> &mut [Tensor] {
        self.inner.optimizer_state_mut()
    }
    fn reset_optimizer(&mut self, stream: &Stream) -> flodl_ddp::Result<()> {
        self.inner.reset_optimizer(stream)
    }
    fn evaluate_batch(&mut self, batch: &Batch) -> flodl_ddp::Result<Option<BatchEval>> {
        self.inner.evaluate_batch(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_at_parses_rank_at_batch_and_round_trips() {
        for (text, want) in [
            ("1@20", Some(FailAt { rank: 1, batch: 20 })),
            (" 0 @ 1", Some(FailAt { rank: 0, batch: 1 })),
            ("1@0", None),
            ("1", None),
            ("a@2", None),
            ("1@-2", None),
        ] {
            let got = text.parse::<FailAt>().ok();
            assert_eq!(got, want, "{text}");
            if let Some(f) = got {
                assert_eq!(f.to_string().parse::<FailAt>(), Ok(f));
            }
        }
    }

    #[test]
    fn the_earliest_failure_of_the_rank_applies() {
        let plan = [FailAt { rank: 1, batch: 9 }, FailAt { rank: 1, batch: 4 }];
        assert_eq!(Failing::new((), 1, &plan).fail_at, Some(4));
        assert_eq!(Failing::new((), 0, &plan).fail_at, None);
    }
}

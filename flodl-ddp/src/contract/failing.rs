//! A fault-injection hook: a replica that fails on a chosen training step.

use flodl_tensor::{Stream, Tensor};

use crate::contract::replica::{Batch, BatchEval, Replica};
use crate::{Error, Result};

/// How an injected failure strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Failure {
    /// The training step returns [`Error::Replica`] ("device failure at training step N").
    #[default]
    Error,
    /// The training step panics.
    Panic,
}

/// A replica that trains like `inner` until its `at`-th training step (counted from 1), where it
/// fails as [`Failure`] says, so the runtime declares its rank dead. Every other method,
/// optimizer state and step counter included, is `inner`'s. Meant for fault-tolerance tests,
/// drills and demos (`fdl train --fail-rank`).
///
/// ```
/// use flodl_ddp::{Failure, FailingReplica, Mlp, MlpConfig, Optimizer, ReplicaContext, Trainer};
/// let mlp = MlpConfig::new(&[784, 64, 10], Optimizer::sgd(0.9));
/// // Rank 1 fails on its 100th batch; the others never do.
/// let trainer = Trainer::new(move |ctx: &ReplicaContext| {
///     let at = (ctx.rank == 1).then_some(100);
///     let inner = Mlp::new(&mlp, ctx.batch_size, ctx.seed, &ctx.stream)?;
///     Ok(FailingReplica::new(inner, at, Failure::Error))
/// });
/// # let _ = trainer;
/// ```
#[derive(Debug)]
pub struct FailingReplica<R> {
    inner: R,
    at: Option<usize>,
    failure: Failure,
    trained: usize,
}

impl<R> FailingReplica<R> {
    /// `inner`, failing at its `at`-th training step (never when `None`).
    pub fn new(inner: R, at: Option<usize>, failure: Failure) -> Self {
        FailingReplica { inner, at, failure, trained: 0 }
    }

    /// Training steps attempted so far (the failing one included).
    pub fn trained(&self) -> usize {
        self.trained
    }

    /// The wrapped replica.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}

impl<R: Replica> Replica for FailingReplica<R> {
    fn train_step(&mut self, batch: &Batch) -> Result<f32> {
        self.trained += 1;
        if self.at == Some(self.trained) {
            let what = format!("device failure at training step {}", self.trained);
            match self.failure {
                Failure::Error => return Err(Error::replica(what)),
                Failure::Panic => panic!("injected {what}"),
            }
        }
        self.inner.train_step(batch)
    }
    fn step(&mut self, lr: f32) -> Result<()> {
        self.inner.step(lr)
    }
    fn parameters(&self) -> &[Tensor] {
        self.inner.parameters()
    }
    fn parameters_mut(&mut self) -> &mut [Tensor] {
        self.inner.parameters_mut()
    }
    fn gradients_mut(&mut self) -> Option<&mut [Tensor]> {
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
    fn optimizer_steps(&self) -> u64 {
        self.inner.optimizer_steps()
    }
    fn set_optimizer_steps(&mut self, steps: u64) {
        self.inner.set_optimizer_steps(steps);
    }
    fn reset_optimizer(&mut self, stream: &Stream) -> Result<()> {
        self.inner.reset_optimizer(stream)
    }
    fn evaluate_batch(&mut self, batch: &Batch) -> Result<Option<BatchEval>> {
        self.inner.evaluate_batch(batch)
    }
}

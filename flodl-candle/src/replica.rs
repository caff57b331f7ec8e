//! The `Replica` tier: a candle model with its AdamW adapted to flodl-ddp's `Replica` contract.

use candle_core::Device;
use candle_nn::ParamsAdamW;
use flodl_ddp::{Batch, BatchEval, Error, Replica, ReplicaContext, Result};
use flodl_tensor::{Stream, Tensor};

use crate::adamw::AdamW;
use crate::model::CandleModel;
use crate::vars::candle_error;

/// How a candle model is optimised: AdamW's settings (its rate is replaced by the run's schedule
/// at every step) and the gradient clipping.
#[derive(Debug, Clone)]
pub struct Optim {
    /// AdamW's betas, epsilon and weight decay.
    pub adamw: ParamsAdamW,
    /// Clip the gradients' global norm to this before each step (`None`: no clipping).
    pub clip: Option<f64>,
}

impl Default for Optim {
    /// candle's AdamW defaults, no clipping.
    fn default() -> Self {
        Optim { adamw: ParamsAdamW::default(), clip: None }
    }
}

/// A pool of `threads` threads for candle's CPU kernels.
///
/// # Errors
/// [`Error::Replica`] when the pool's threads cannot start.
pub fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(Error::replica)
}

/// A rank's candle model with its AdamW, as a flodl [`Replica`]. The model trains in candle's
/// variables; the optimizer ([`AdamW`]) holds them as flodl tensors too, current after every
/// step (it steps on them and writes them back), so the runtime reads them at a reduce, a
/// snapshot or the end without a copy, and writes averages into them, pushed back into the
/// variables by [`import_parameters`](Replica::import_parameters). Its moments and step count
/// are the optimizer state a checkpoint saves and a resume restores. Its candle work runs on a
/// one-thread pool of its own (the rank is one CPU thread).
pub struct CandleReplica<M> {
    model: M,
    optimizer: AdamW,
    device: Device,
    /// Whether the gradients of a training step wait for the optimizer.
    stepped: bool,
    pool: rayon::ThreadPool,
}

impl<M> std::fmt::Debug for CandleReplica<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandleReplica")
            .field("params", &self.optimizer.params().len())
            .field("steps", &self.optimizer.steps())
            .finish_non_exhaustive()
    }
}

impl<M: CandleModel> CandleReplica<M> {
    /// The replica of `model` (built on candle's CPU device) for the rank in `ctx`.
    ///
    /// # Errors
    /// candle's, a tensor's or the pool's.
    pub fn new(model: M, optim: Optim, ctx: &ReplicaContext) -> Result<CandleReplica<M>> {
        let optimizer = AdamW::new(model.vars(), &optim, &ctx.stream)?;
        Ok(CandleReplica { model, optimizer, device: Device::Cpu, stepped: true, pool: pool(1)? })
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }
}

impl<M: CandleModel> Replica for CandleReplica<M> {
    fn train_step(&mut self, batch: &Batch) -> Result<f32> {
        let (model, device, optimizer) = (&self.model, &self.device, &mut self.optimizer);
        let loss = self.pool.install(|| -> Result<f32> {
            let loss = model.loss(batch, device)?;
            let grads = loss.backward().map_err(candle_error)?;
            optimizer.take_grads(model.vars(), &grads)?;
            loss.to_scalar::<f32>().map_err(candle_error)
        })?;
        self.stepped = false;
        Ok(loss)
    }

    fn step(&mut self, lr: f32) -> Result<()> {
        if std::mem::replace(&mut self.stepped, true) {
            return Err(Error::mismatch(
                "gradients at an optimizer step",
                "a backward pass's",
                "none",
            ));
        }
        let (optimizer, vars) = (&mut self.optimizer, self.model.vars());
        self.pool.install(|| {
            optimizer.step(lr)?;
            optimizer.write_vars(vars)
        })
    }

    fn parameters(&self) -> &[Tensor] {
        self.optimizer.params()
    }

    fn parameters_mut(&mut self) -> &mut [Tensor] {
        self.optimizer.params_mut()
    }

    fn gradients_mut(&mut self) -> Option<&mut [Tensor]> {
        Some(self.optimizer.grads_mut())
    }

    fn optimizer_state(&self) -> &[Tensor] {
        self.optimizer.state()
    }

    fn optimizer_state_mut(&mut self) -> &mut [Tensor] {
        self.optimizer.state_mut()
    }

    fn optimizer_steps(&self) -> u64 {
        self.optimizer.steps()
    }

    fn set_optimizer_steps(&mut self, steps: u64) {
        self.optimizer.set_steps(steps);
    }

    fn reset_optimizer(&mut self, _stream: &Stream) -> Result<()> {
        self.optimizer.reset()
    }

    fn import_parameters(&mut self) -> Result<()> {
        self.optimizer.write_vars(self.model.vars())
    }

    fn evaluate_batch(&mut self, batch: &Batch) -> Result<Option<BatchEval>> {
        let (model, device) = (&self.model, &self.device);
        self.pool.install(|| model.evaluate(batch, device).map(Some))
    }
}

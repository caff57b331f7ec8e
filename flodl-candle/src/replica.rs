//! The `Replica` tier: a candle model with its AdamW adapted to flodl-ddp's `Replica` contract.

use candle_core::Device;
use candle_core::backprop::GradStore;
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use flodl_ddp::{Batch, BatchEval, Error, Replica, ReplicaContext, Result};
use flodl_tensor::Tensor;

use crate::clip::clip_grad_norm;
use crate::model::CandleModel;
use crate::vars::{candle_error, read_var, write_var};

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
/// variables; `params` mirrors them as flodl tensors, refreshed only when the runtime reads them
/// ([`export_parameters`](Replica::export_parameters): at a reduce, a snapshot, the end) and
/// written back when it has averaged them ([`import_parameters`](Replica::import_parameters)).
/// Its candle work runs on a one-thread pool of its own (the rank is one CPU thread).
pub struct CandleReplica<M> {
    model: M,
    optimizer: AdamW,
    clip: Option<f64>,
    device: Device,
    /// The gradients of the last training step.
    grads: Option<GradStore>,
    /// The variables as flodl tensors, in the model's order.
    params: Vec<Tensor>,
    pool: rayon::ThreadPool,
}

impl<M> std::fmt::Debug for CandleReplica<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandleReplica")
            .field("params", &self.params.len())
            .field("clip", &self.clip)
            .finish_non_exhaustive()
    }
}

impl<M: CandleModel> CandleReplica<M> {
    /// The replica of `model` (built on candle's CPU device) for the rank in `ctx`.
    ///
    /// # Errors
    /// candle's, a tensor's or the pool's.
    pub fn new(model: M, optim: Optim, ctx: &ReplicaContext) -> Result<CandleReplica<M>> {
        let optimizer = AdamW::new(model.vars().to_vec(), optim.adamw).map_err(candle_error)?;
        let params = model
            .vars()
            .iter()
            .map(|v| {
                let mut t = Tensor::zeros(v.dims(), flodl_tensor::DType::F32, &ctx.stream)?;
                read_var(v, t.as_mut_slice::<f32>()?)?;
                Ok(t)
            })
            .collect::<Result<Vec<Tensor>>>()?;
        Ok(CandleReplica {
            model,
            optimizer,
            clip: optim.clip,
            device: Device::Cpu,
            grads: None,
            params,
            pool: pool(1)?,
        })
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }
}

impl<M: CandleModel> Replica for CandleReplica<M> {
    fn train_step(&mut self, batch: &Batch) -> Result<f32> {
        let (model, device) = (&self.model, &self.device);
        let (loss, grads) = self.pool.install(|| -> Result<(f32, GradStore)> {
            let loss = model.loss(batch, device)?;
            let grads = loss.backward().map_err(candle_error)?;
            Ok((loss.to_scalar::<f32>().map_err(candle_error)?, grads))
        })?;
        self.grads = Some(grads);
        Ok(loss)
    }

    fn step(&mut self, lr: f32) -> Result<()> {
        let mut grads = self.grads.take().ok_or_else(|| {
            Error::mismatch("gradients at an optimizer step", "a backward pass's", "none")
        })?;
        self.optimizer.set_learning_rate(f64::from(lr));
        let (optimizer, vars, clip) = (&mut self.optimizer, self.model.vars(), self.clip);
        self.pool.install(|| {
            if let Some(max) = clip {
                clip_grad_norm(&mut grads, vars, max)?;
            }
            optimizer.step(&grads).map_err(candle_error)
        })
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    fn parameters_mut(&mut self) -> &mut [Tensor] {
        &mut self.params
    }

    fn export_parameters(&mut self) -> Result<()> {
        for (v, t) in self.model.vars().iter().zip(&mut self.params) {
            read_var(v, t.as_mut_slice::<f32>()?)?;
        }
        Ok(())
    }

    fn import_parameters(&mut self) -> Result<()> {
        for (v, t) in self.model.vars().iter().zip(&self.params) {
            write_var(v, t.as_slice::<f32>()?)?;
        }
        Ok(())
    }

    fn evaluate_batch(&mut self, batch: &Batch) -> Result<Option<BatchEval>> {
        let (model, device) = (&self.model, &self.device);
        self.pool.install(|| model.evaluate(batch, device).map(Some))
    }
}

//! The `Replica` tier: the candle model adapted to flodl-ddp's `Replica` contract.

use candle_core::Device;
use candle_core::backprop::GradStore;
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use flodl_ddp::{Batch, BatchEval, Error, Replica, ReplicaContext, Result, Trainer};
use flodl_tensor::Tensor;

use crate::data::batch_tensors;
use crate::lenet::LeNet;
use crate::settings::{Outcome, Settings};
use crate::vars::{candle_error, read_var, write_var};

/// A rank's candle LeNet with its AdamW, as a flodl [`Replica`]. The model trains in candle's
/// variables; `params` mirrors them as flodl tensors, refreshed only when the runtime reads them
/// ([`export_parameters`](Replica::export_parameters): at a reduce, a snapshot, the end) and
/// written back when it has averaged them ([`import_parameters`](Replica::import_parameters)).
/// Its candle work runs on a one-thread pool of its own (the rank is one CPU thread).
pub struct CandleReplica {
    model: LeNet,
    optimizer: AdamW,
    device: Device,
    /// The gradients of the last training step.
    grads: Option<GradStore>,
    /// The variables as flodl tensors, in the model's order.
    params: Vec<Tensor>,
    pool: rayon::ThreadPool,
}

impl std::fmt::Debug for CandleReplica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandleReplica").field("params", &self.params.len()).finish_non_exhaustive()
    }
}

/// A pool of `threads` threads for candle's CPU kernels.
///
/// # Errors
/// [`Error::Replica`] when the pool's threads cannot start.
pub fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(Error::replica)
}

impl CandleReplica {
    /// The replica of the rank in `ctx`, training with AdamW (its rate comes from the run's
    /// schedule at every step).
    ///
    /// # Errors
    /// candle's, a tensor's or the pool's.
    pub fn new(ctx: &ReplicaContext) -> Result<CandleReplica> {
        let device = Device::Cpu;
        let model = LeNet::new(&device).map_err(candle_error)?;
        let optimizer =
            AdamW::new(model.vars().to_vec(), ParamsAdamW::default()).map_err(candle_error)?;
        let params = model
            .vars()
            .iter()
            .map(|v| {
                let mut t = Tensor::zeros(v.dims(), flodl_tensor::DType::F32, &ctx.stream)?;
                read_var(v, t.as_mut_slice::<f32>()?)?;
                Ok(t)
            })
            .collect::<Result<Vec<Tensor>>>()?;
        Ok(CandleReplica { model, optimizer, device, grads: None, params, pool: pool(1)? })
    }
}

impl Replica for CandleReplica {
    fn train_step(&mut self, batch: &Batch) -> Result<f32> {
        let (model, device) = (&self.model, &self.device);
        let (loss, grads) = self.pool.install(|| -> Result<(f32, GradStore)> {
            let (x, y) = batch_tensors(batch, device)?;
            let loss = model.loss(&x, &y).map_err(candle_error)?;
            let grads = loss.backward().map_err(candle_error)?;
            Ok((loss.to_scalar::<f32>().map_err(candle_error)?, grads))
        })?;
        self.grads = Some(grads);
        Ok(loss)
    }

    fn step(&mut self, lr: f32) -> Result<()> {
        let grads = self.grads.take().ok_or_else(|| {
            Error::mismatch("gradients at an optimizer step", "a backward pass's", "none")
        })?;
        self.optimizer.set_learning_rate(f64::from(lr));
        let optimizer = &mut self.optimizer;
        self.pool.install(|| optimizer.step(&grads)).map_err(candle_error)
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
        self.pool.install(|| {
            let (x, y) = batch_tensors(batch, device)?;
            let eval = || -> candle_core::Result<BatchEval> {
                let logits = model.forward(&x)?;
                let losses = candle_nn::ops::log_softmax(&logits, 1)?
                    .gather(&y.unsqueeze(1)?, 1)?
                    .sum_all()?
                    .to_scalar::<f32>()?;
                let correct = logits
                    .argmax(1)?
                    .eq(&y)?
                    .to_dtype(candle_core::DType::F32)?
                    .sum_all()?
                    .to_scalar::<f32>()?;
                Ok(BatchEval {
                    loss_sum: -f64::from(losses),
                    correct: correct as usize,
                    samples: batch.len(),
                })
            };
            eval().map(Some).map_err(candle_error)
        })
    }
}

/// Trains the model through the `Replica` tier and evaluates the averaged result.
///
/// # Errors
/// The run's or the evaluation's.
pub fn train(settings: &Settings) -> anyhow::Result<Outcome> {
    let state = settings.configure(Trainer::new(CandleReplica::new)).run()?.join()?;
    crate::cooperative::outcome(&state, settings)
}

//! The cooperative tier: candle's own training loop on a rank, flodl-ddp around it.

use std::time::Instant;

use candle_core::Device;
use flodl_ddp::{Result, Worker};

use crate::adamw::AdamW;
use crate::model::CandleModel;
use crate::replica::{Optim, pool};
use crate::vars::{CandleParams, candle_error};

/// What one rank's loop did: its steps, and the time they spent in candle (forward, backward,
/// clipping, AdamW), measured on the loop's side of the worker.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoopTally {
    /// Steps trained.
    pub steps: usize,
    /// Seconds inside candle.
    pub candle_s: f64,
}

/// One rank's loop, as a user writes it: candle forward, backward, clipping and AdamW (the
/// replica tier's [`AdamW`]) on a one-thread pool; the worker hands out the batches and the
/// rates, and takes the variables at reduces (the model's weights are overwritten with the
/// run's initial state before the first step, and with averages at reduces: the optimizer
/// reads them back before each step).
///
/// # Errors
/// candle's, the pool's and the worker's.
pub fn train_loop<M: CandleModel>(
    mut worker: Worker,
    model: &M,
    optim: Optim,
) -> Result<LoopTally> {
    pool(1)?.install(move || {
        let device = Device::Cpu;
        let mut optimizer =
            AdamW::new(model.vars(), &optim, &flodl_tensor::Stream::cpu_with_threads(1))?;
        let mut params = CandleParams { vars: model.vars() };
        let mut tally = LoopTally::default();
        while let Some(step) = worker.next_step(&mut params)? {
            let t = Instant::now();
            let loss = model.loss(step.batch(), &device)?;
            let grads = loss.backward().map_err(candle_error)?;
            let loss = loss.to_scalar::<f32>().map_err(candle_error)?;
            let forward_backward = t.elapsed();
            let lr = step.finish(loss)?;
            let t = Instant::now();
            optimizer.read_vars(model.vars())?;
            optimizer.take_grads(model.vars(), &grads)?;
            optimizer.step(lr)?;
            optimizer.write_vars(model.vars())?;
            tally.candle_s += (forward_backward + t.elapsed()).as_secs_f64();
            tally.steps += 1;
        }
        Ok(tally)
    })
}

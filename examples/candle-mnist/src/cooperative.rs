//! The cooperative tier: candle's own training loop on every rank, flodl-ddp around it.

use std::time::Instant;

use anyhow::Context as _;
use candle_core::Device;
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use flodl_ddp::{TimeBreakdown, TrainedState, Trainer, Worker};

use crate::data::{accuracy, batch_tensors};
use crate::lenet::LeNet;
use crate::replica::pool;
use crate::settings::{Outcome, Settings};
use crate::vars::{CandleParams, candle_error, host_tensors, write_var};

/// What one rank's loop did: its steps, and the time they spent in candle (batch to tensors,
/// forward, backward, AdamW), measured on the loop's side of the worker.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoopTally {
    /// Steps trained.
    pub steps: usize,
    /// Seconds inside candle.
    pub candle_s: f64,
}

/// One rank's loop, as a user writes it: candle forward, backward and AdamW, on a one-thread
/// pool; the worker hands out the batches and takes the variables at reduces.
///
/// # Errors
/// candle's, the pool's and the worker's.
pub fn rank_loop(mut worker: Worker) -> flodl_ddp::Result<LoopTally> {
    pool(1)?.install(move || {
        let device = Device::Cpu;
        // Overwritten with the run's initial state before the first step.
        let model = LeNet::new(&device).map_err(candle_error)?;
        let mut optimizer =
            AdamW::new(model.vars().to_vec(), ParamsAdamW::default()).map_err(candle_error)?;
        let mut params = CandleParams { vars: model.vars() };
        let mut tally = LoopTally::default();
        while let Some(step) = worker.next_step(&mut params)? {
            let t = Instant::now();
            let (x, y) = batch_tensors(step.batch(), &device)?;
            let loss = model.loss(&x, &y).map_err(candle_error)?;
            let grads = loss.backward().map_err(candle_error)?;
            let loss = loss.to_scalar::<f32>().map_err(candle_error)?;
            let forward_backward = t.elapsed();
            let lr = step.finish(loss)?;
            let t = Instant::now();
            optimizer.set_learning_rate(f64::from(lr));
            optimizer.step(&grads).map_err(candle_error)?;
            tally.candle_s += (forward_backward + t.elapsed()).as_secs_f64();
            tally.steps += 1;
        }
        Ok(tally)
    })
}

/// Trains the model through the cooperative tier and evaluates the averaged result.
///
/// # Errors
/// The run's, a rank loop's, or the evaluation's.
pub fn train(settings: &Settings) -> anyhow::Result<Outcome> {
    let model = LeNet::new(&Device::Cpu)?;
    let initial = host_tensors(model.vars())?;
    let mut run = settings.configure(Trainer::cooperative()).run_cooperative(initial)?;
    let loops: Vec<_> = run
        .workers
        .drain(..)
        .map(|w| std::thread::Builder::new().name("candle-rank".into()).spawn(|| rank_loop(w)))
        .collect::<std::io::Result<_>>()?;
    let state = run.handle.join();
    let mut candle_s = Vec::with_capacity(loops.len());
    for (rank, h) in loops.into_iter().enumerate() {
        let tally = h
            .join()
            .map_err(|_| anyhow::anyhow!("rank {rank}'s loop panicked"))?
            .with_context(|| format!("rank {rank}'s loop"))?;
        candle_s.push(tally.candle_s);
    }
    Ok(Outcome { candle_s, ..outcome(&state?, settings)? })
}

/// The outcome of a finished flodl run: its averaged model evaluated on the test set.
///
/// # Errors
/// candle's or the evaluation's.
pub fn outcome(state: &TrainedState, settings: &Settings) -> anyhow::Result<Outcome> {
    let device = Device::Cpu;
    let model = LeNet::new(&device)?;
    if model.vars().len() != state.params.len() {
        anyhow::bail!(
            "the run holds {} parameters, the model {}",
            state.params.len(),
            model.vars().len()
        );
    }
    for (v, p) in model.vars().iter().zip(&state.params) {
        write_var(v, &p.data)?;
    }
    Ok(Outcome {
        accuracy: accuracy(&model, settings.test.as_ref(), &device)?,
        train_s: state.train_ms / 1000.0,
        samples_per_s: state.throughput(),
        reduces: state.reduces,
        ranks: rank_times(state),
        candle_s: Vec::new(),
    })
}

/// Each rank's time breakdown summed over the run's epochs, in rank order.
fn rank_times(state: &TrainedState) -> Vec<TimeBreakdown> {
    let mut ranks: Vec<TimeBreakdown> = Vec::new();
    for r in state.epochs.iter().flat_map(|e| &e.ranks) {
        if ranks.len() <= r.rank {
            ranks.resize(r.rank + 1, TimeBreakdown::default());
        }
        ranks[r.rank].merge(&r.time);
    }
    ranks
}

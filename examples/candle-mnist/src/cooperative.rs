//! The cooperative tier: candle's own training loop on every rank, flodl-ddp around it.

use anyhow::Context as _;
use candle_core::Device;
use flodl_candle::{LoopTally, Optim, candle_error, host_tensors, train_loop, write_var};
use flodl_ddp::{TimeBreakdown, TrainedState, Trainer, Worker};

use crate::data::accuracy;
use crate::lenet::LeNet;
use crate::settings::{Outcome, Settings};

/// One rank's loop, as a user writes it: flodl-candle's [`train_loop`] (candle forward,
/// backward and AdamW on a one-thread pool) over a LeNet whose weights the run's initial state
/// overwrites before the first step.
///
/// # Errors
/// candle's, the pool's and the worker's.
pub fn rank_loop(worker: Worker) -> flodl_ddp::Result<LoopTally> {
    let model = LeNet::new(&Device::Cpu).map_err(candle_error)?;
    train_loop(worker, &model, Optim::default())
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

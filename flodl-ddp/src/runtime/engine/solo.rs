//! The single-device driver: one rank, no coordinator, no averaging.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::control::breakdown::Activity;
use crate::control::metrics::{EpochTally, WorkTally, drain_scalars};
use crate::link::failure::RankFailure;
use crate::link::wire::Chunk;
use crate::runtime::engine::ledger::Ledger;
use crate::runtime::engine::outlets::{Outlets, TrainedState, panic_message, trained_state};
use crate::runtime::engine::rank::{Trained, Worker};
use crate::runtime::engine::run_config::RunConfig;
use crate::runtime::engine::staging;
use crate::{Error, Result};

/// Starts the single rank on its own thread.
pub(crate) fn spawn(
    cfg: Arc<RunConfig>,
    outlets: Outlets,
) -> Result<JoinHandle<Result<TrainedState>>> {
    std::thread::Builder::new()
        .name("flodl-rank-0".into())
        .spawn(move || match catch_unwind(AssertUnwindSafe(|| run(&cfg, &outlets))) {
            Ok(r) => r,
            Err(p) => Err(Error::Rank {
                rank: 0,
                failure: RankFailure::panicked(panic_message(p.as_ref())),
            }),
        })
        .map_err(|source| Error::Spawn { what: "the rank's thread", source })
}

/// Trains every epoch in permutation order, one batch after the other (an epoch is one chunk
/// for the prefetcher, the next epoch's prepared while the last batches train).
fn run(cfg: &Arc<RunConfig>, outlets: &Outlets) -> Result<TrainedState> {
    let start = Instant::now();
    let mut worker = Worker::build(0, cfg.clone(), None)?;
    let _ = outlets.started.try_send(());
    let devices = [cfg.spec.devices[0].to_string()];
    let bs = cfg.spec.batch_size;
    let mut epochs = Vec::with_capacity(cfg.spec.epochs);
    let train_start = Instant::now();
    let mut train_ms = 0.0;
    let mut step = 0u64;
    let mut ledger = Ledger::default();
    ledger.start();
    for epoch in 0..cfg.spec.epochs {
        let t0 = Instant::now();
        let mut work = WorkTally::default();
        let chunk = |epoch| Chunk { epoch, offset: 0, len: cfg.batches_per_epoch() * bs };
        let next = (epoch + 1 < cfg.spec.epochs).then(|| chunk(epoch + 1));
        // The whole run is known: this epoch, then the next, is the stage advisory.
        let advised: Vec<Chunk> = std::iter::once(chunk(epoch)).chain(next).collect();
        worker.stage(&advised, 0);
        for b in 0..cfg.batches_per_epoch() {
            let t = Instant::now();
            let Trained { loss, ms, cache } = loop {
                if outlets.cancel.load(Ordering::Acquire) {
                    return Err(Error::Aborted);
                }
                // `None`: a prefetched batch not ready yet (waited for up to a deadline).
                if let Some(trained) = worker.train_chunk_batch(chunk(epoch), b, next, step)? {
                    break trained;
                }
            };
            // The call's time beyond the training step went to the batch's fetch and upload.
            ledger.charge_ms(Activity::Compute, ms);
            ledger.charge_ms(Activity::Data, t.elapsed().as_secs_f64() * 1000.0 - ms);
            staging::tally(&mut work.cache, cache);
            step += 1;
            work.batches += 1;
            work.samples += bs;
            work.loss_sum += f64::from(loss);
            work.compute_ms += ms;
        }
        work.scalars = drain_scalars();
        work.time = ledger.close();
        let mut tally = EpochTally::new(1);
        tally.add(0, &work);
        let mut metrics = tally.finish(epoch, t0.elapsed().as_secs_f64() * 1000.0, &devices);
        metrics.at_ms = start.elapsed().as_secs_f64() * 1000.0;
        train_ms = train_start.elapsed().as_secs_f64() * 1000.0;
        if cfg.evaluates(epoch) {
            metrics.eval = ledger.time(Activity::Evaluation, || worker.evaluate())?;
        }
        if let Some(callback) = &cfg.on_epoch {
            callback(&metrics);
        }
        // Capacity is the number of epochs: this never drops.
        let _ = outlets.epochs.try_send(metrics.clone());
        epochs.push(metrics);
    }
    let state = worker.snapshot()?;
    let wall_ms = start.elapsed().as_secs_f64() * 1000.0;
    trained_state(&worker.shapes(), state, epochs, 0, wall_ms, train_ms, Vec::new())
}

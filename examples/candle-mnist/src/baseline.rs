//! candle's own single-process training loop: the throughput reference.

use std::time::Instant;

use candle_core::Device;
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use flodl_data::HostBatch;

use crate::data::{accuracy, tensors};
use crate::lenet::LeNet;
use crate::replica::pool;
use crate::settings::{Outcome, Settings};

/// Trains the model with candle alone on `threads` threads (a rayon pool of that size): the
/// same batches in the same order as one flodl rank would see them (the run's permutation of
/// every epoch), AdamW following the settings' schedule.
///
/// # Errors
/// candle's, a fetch's or the pool's.
pub fn train(settings: &Settings, threads: usize) -> anyhow::Result<Outcome> {
    let pool = pool(threads)?;
    pool.install(|| {
        let device = Device::Cpu;
        let model = LeNet::new(&device)?;
        let params = ParamsAdamW { lr: f64::from(settings.lr), ..Default::default() };
        let mut optimizer = AdamW::new(model.vars().to_vec(), params)?;
        let data = settings.train.as_ref();
        let mut host = HostBatch::new(data.layout(), flodl_tensor::Device::Cpu);
        let bs = settings.batch_size;
        let t0 = Instant::now();
        let mut samples = 0;
        let schedule = settings.schedule();
        let mut step = 0;
        for epoch in 0..settings.epochs {
            let perm = flodl_data::epoch_permutation(data.len(), settings.seed, epoch as u64);
            for picks in perm.chunks_exact(bs) {
                data.fetch(picks, &mut host)?;
                let (x, y) = tensors(host.f32(0)?, host.i32(1)?, &device)?;
                let loss = model.loss(&x, &y)?;
                optimizer.set_learning_rate(schedule.lr(step));
                optimizer.backward_step(&loss)?;
                samples += bs;
                step += 1;
            }
        }
        let train_s = t0.elapsed().as_secs_f64();
        Ok(Outcome {
            accuracy: accuracy(&model, settings.test.as_ref(), &device)?,
            train_s,
            samples_per_s: samples as f64 / train_s,
            reduces: 0,
        })
    })
}

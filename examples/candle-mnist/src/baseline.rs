//! candle's own training loops, without flodl: the throughput references.

use std::time::Instant;

use anyhow::Context as _;
use candle_core::Device;
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use flodl_data::{Dataset, HostBatch};

use crate::data::{accuracy, tensors};
use crate::lenet::LeNet;
use crate::settings::{Outcome, Settings};
use flodl_candle::pool;

/// Trains the model with candle alone on `threads` threads (a rayon pool of that size): the
/// same batches in the same order as one flodl rank would see them (the run's permutation of
/// every epoch), AdamW following the settings' schedule.
///
/// # Errors
/// candle's, a fetch's or the pool's.
pub fn train(settings: &Settings, threads: usize) -> anyhow::Result<Outcome> {
    let pool = pool(threads)?;
    pool.install(|| {
        let lap = train_share(settings, 0, 1)?;
        let train_s = lap.seconds();
        Ok(Outcome {
            accuracy: accuracy(&lap.model, settings.test.as_ref(), &Device::Cpu)?,
            train_s,
            samples_per_s: lap.samples as f64 / train_s,
            reduces: 0,
            ranks: Vec::new(),
            candle_s: Vec::new(),
        })
    })
}

/// The physical ceiling of any `loops`-rank data-parallel scheme: `loops` independent candle
/// loops at the same time, each on a thread of its own (a one-thread pool), each training its
/// share of every epoch's batches (batch `i` goes to loop `i % loops`), nothing shared between
/// them. The throughput is all their samples over the span from the first start to the last
/// end; the accuracy is the first loop's model's (it saw only its share).
///
/// # Errors
/// A loop's (candle's, a fetch's, the pool's), or a loop that panicked.
pub fn independent(settings: &Settings, loops: usize) -> anyhow::Result<Outcome> {
    let loops = loops.max(1);
    let handles: Vec<_> = (0..loops)
        .map(|i| {
            let settings = settings.clone();
            std::thread::Builder::new()
                .name(format!("candle-loop-{i}"))
                .spawn(move || pool(1)?.install(|| train_share(&settings, i, loops)))
        })
        .collect::<std::io::Result<_>>()?;
    let mut laps = Vec::with_capacity(loops);
    for (i, h) in handles.into_iter().enumerate() {
        let lap = h.join().map_err(|_| anyhow::anyhow!("candle loop {i} panicked"))?;
        laps.push(lap.with_context(|| format!("candle loop {i}"))?);
    }
    let start = laps.iter().map(|l| l.start).min();
    let end = laps.iter().map(|l| l.end).max();
    let (Some(start), Some(end), Some(first)) = (start, end, laps.first()) else {
        anyhow::bail!("no candle loop ran");
    };
    let train_s = end.saturating_duration_since(start).as_secs_f64();
    let samples: usize = laps.iter().map(|l| l.samples).sum();
    Ok(Outcome {
        accuracy: accuracy(&first.model, settings.test.as_ref(), &Device::Cpu)?,
        train_s,
        samples_per_s: samples as f64 / train_s,
        reduces: 0,
        ranks: Vec::new(),
        candle_s: Vec::new(),
    })
}

/// One candle loop's training: its model and when it ran.
struct Lap {
    model: LeNet,
    samples: usize,
    start: Instant,
    end: Instant,
}

impl Lap {
    fn seconds(&self) -> f64 {
        self.end.saturating_duration_since(self.start).as_secs_f64()
    }
}

/// candle's loop over share `share` of `shares` of every epoch's batches (batch `i` when
/// `i % shares == share`), on the calling thread's rayon pool.
fn train_share(settings: &Settings, share: usize, shares: usize) -> anyhow::Result<Lap> {
    let device = Device::Cpu;
    let model = LeNet::new(&device)?;
    let params = ParamsAdamW { lr: f64::from(settings.lr), ..Default::default() };
    let mut optimizer = AdamW::new(model.vars().to_vec(), params)?;
    let data: &dyn Dataset = settings.train.as_ref();
    let mut host = HostBatch::new(data.layout(), flodl_tensor::Device::Cpu);
    let bs = settings.batch_size;
    let start = Instant::now();
    let mut samples = 0;
    let schedule = settings.schedule();
    let per_epoch = data.len() / bs.max(1);
    for epoch in 0..settings.epochs {
        let perm = flodl_data::epoch_permutation(data.len(), settings.seed, epoch as u64);
        let batches = perm.chunks_exact(bs).enumerate().skip(share).step_by(shares.max(1));
        for (i, picks) in batches {
            data.fetch(picks, &mut host)?;
            let (x, y) = tensors(host.f32(0)?, host.i32(1)?, &device)?;
            let loss = model.loss(&x, &y)?;
            // The rate of the batch's place in the run, as flodl's cohort step counts it.
            optimizer.set_learning_rate(schedule.lr((epoch * per_epoch + i) as u64));
            optimizer.backward_step(&loss)?;
            samples += bs;
        }
    }
    Ok(Lap { model, samples, start, end: Instant::now() })
}

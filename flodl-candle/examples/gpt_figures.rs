//! The transformer's figures, side by side in one run: a single-process run against the 2-rank
//! Cadence run (rank 1 slowed 2.5×) on the same windows (the same tokens), both through the
//! `Replica` adapter; validation loss of each (nats/byte, bits/byte, and their relative gap),
//! tokens/s per rank, and where a rank's step time goes (candle's work, the adapter's glue:
//! `export_parameters`/`import_parameters`, and the runtime's data, reduce and waiting).
//!
//! `cargo run --release -p flodl-candle --example gpt_figures -- [tiny|default|large] [WINDOWS]
//! [BATCH]` (defaults: default 2048 16).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flodl_candle::CandleReplica;
use flodl_candle::gpt::{Gpt, GptSize, gpt_optim, gpt_schedule};
use flodl_data::{Dataset, Shakespeare, Subset, TextSplit, unigram_entropy};
use flodl_ddp::{
    Batch, BatchEval, Devices, Policy, Replica, ReplicaContext, TimeBreakdown, TrainedState,
    Trainer,
};
use flodl_tensor::{Stream, Tensor};

const EVAL_WINDOWS: usize = 256;
const LR: f64 = 3e-3;
const SLOW: f64 = 2.5;

/// Seconds a rank spent in candle (train_step, step) and in the adapter's glue (export, import).
#[derive(Debug, Default, Clone, Copy)]
struct Split {
    candle: Duration,
    glue: Duration,
}

type Splits = Arc<Mutex<Vec<Split>>>;

/// A replica whose calls are timed, by kind.
struct Timed<R> {
    inner: R,
    rank: usize,
    splits: Splits,
}

impl<R: Replica> Timed<R> {
    fn time<T>(&mut self, glue: bool, f: impl FnOnce(&mut R) -> T) -> T {
        let t = Instant::now();
        let out = f(&mut self.inner);
        let d = t.elapsed();
        let mut s = self.splits.lock().unwrap_or_else(|e| e.into_inner());
        if s.len() <= self.rank {
            s.resize(self.rank + 1, Split::default());
        }
        if glue {
            s[self.rank].glue += d;
        } else {
            s[self.rank].candle += d;
        }
        out
    }
}

impl<R: Replica> Replica for Timed<R> {
    fn train_step(&mut self, batch: &Batch) -> flodl_ddp::Result<f32> {
        self.time(false, |r| r.train_step(batch))
    }
    fn step(&mut self, lr: f32) -> flodl_ddp::Result<()> {
        self.time(false, |r| r.step(lr))
    }
    fn parameters(&self) -> &[Tensor] {
        self.inner.parameters()
    }
    fn parameters_mut(&mut self) -> &mut [Tensor] {
        self.inner.parameters_mut()
    }
    fn reset_optimizer(&mut self, stream: &Stream) -> flodl_ddp::Result<()> {
        self.inner.reset_optimizer(stream)
    }
    fn evaluate_batch(&mut self, batch: &Batch) -> flodl_ddp::Result<Option<BatchEval>> {
        self.inner.evaluate_batch(batch)
    }
    fn export_parameters(&mut self) -> flodl_ddp::Result<()> {
        self.time(true, |r| r.export_parameters())
    }
    fn import_parameters(&mut self) -> flodl_ddp::Result<()> {
        self.time(true, |r| r.import_parameters())
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let size = match args.first() {
        Some(name) => GptSize::parse(name).ok_or_else(|| anyhow::anyhow!("no size {name}"))?,
        None => GptSize::Default,
    };
    let windows: usize = args.get(1).map_or(Ok(2048), |s| s.parse())?;
    let batch: usize = args.get(2).map_or(Ok(16), |s| s.parse())?;
    let config = size.config();
    let train: Arc<dyn Dataset> = Arc::new(Subset::first(
        Shakespeare::vendored(TextSplit::Train)?.windows(config.context)?,
        windows,
    ));
    let valid = Subset::first(
        Shakespeare::vendored(TextSplit::Valid)?.windows(config.context)?,
        EVAL_WINDOWS,
    );
    let targets: Vec<u8> = (0..valid.len())
        .filter_map(|i| valid.inner().window(i))
        .flat_map(|w| &w[1..])
        .copied()
        .collect();
    let bound = unigram_entropy(&targets);
    let valid: Arc<dyn Dataset> = Arc::new(valid);
    let steps = (windows / batch) as u64;
    println!(
        "gpt {} ({:.2}M parameters, context {}), {} training windows ({} tokens), batch {batch}, \
         1 epoch, AdamW lr {LR} warmup {} then cosine; {} validation bytes, unigram bound {bound}",
        size.name(),
        config.parameter_count() as f64 / 1e6,
        config.context,
        windows,
        windows * config.context,
        steps / 10,
        targets.len()
    );
    let run = |ranks: usize| -> anyhow::Result<(TrainedState, Vec<Split>, f64)> {
        let splits: Splits = Arc::default();
        let s = splits.clone();
        let factory = move |ctx: &ReplicaContext| {
            let inner = CandleReplica::new(Gpt::new(config, ctx.seed)?, gpt_optim(), ctx)?;
            Ok(Timed { inner, rank: ctx.rank, splits: s.clone() })
        };
        let slowdown = if ranks == 1 { vec![1.0] } else { vec![1.0, SLOW] };
        let t = Instant::now();
        let state = Trainer::new(factory)
            .dataset(train.clone())
            .test_dataset(valid.clone(), 1)
            .devices(Devices::Cpu(ranks))
            .slowdown(slowdown)
            .policy(Policy::Cadence)
            .batch_size(batch)
            .epochs(1)
            .seed(5)
            .schedule(gpt_schedule(LR, steps, steps / 10))
            // A step of the default model takes ~18 s on a loaded core, 45 s at 2.5x: past the
            // default 30 s a silent rank is declared dead.
            .stall_timeout(Duration::from_secs(600))
            .run()?
            .join()?;
        let splits = splits.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok((state, splits, t.elapsed().as_secs_f64()))
    };
    let mut losses = Vec::new();
    for (name, ranks) in [("single process", 1), ("2 ranks, Cadence, rank 1 at 2.5x", 2)] {
        let (state, splits, wall) = run(ranks)?;
        let eval = state.final_eval().ok_or_else(|| anyhow::anyhow!("no evaluation"))?;
        losses.push(eval.loss);
        println!(
            "\n{name}: validation {:.4} nats/byte ({:.4} bits/byte), next-byte accuracy {:.1}%, \
             {wall:.1} s wall, {} reduces",
            eval.loss,
            eval.loss / std::f64::consts::LN_2,
            eval.accuracy * 100.0,
            state.reduces
        );
        println!(
            "| rank | windows | tokens/s (compute) | candle ms | glue ms (export+import) | glue share of a step | data | reduce | waiting | eval |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for rank in 0..ranks {
            let mut time = TimeBreakdown::default();
            let (mut samples, mut compute_ms) = (0, 0.0);
            for r in state.epochs.iter().flat_map(|e| &e.ranks).filter(|r| r.rank == rank) {
                time.merge(&r.time);
                samples += r.samples;
                compute_ms += r.compute_ms;
            }
            let s = splits.get(rank).copied().unwrap_or_default();
            let (candle, glue) = (s.candle.as_secs_f64() * 1e3, s.glue.as_secs_f64() * 1e3);
            println!(
                "| {rank} | {samples} | {:.0} | {candle:.0} | {glue:.1} | {:.2}% | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
                (samples * config.context) as f64 * 1e3 / compute_ms.max(1e-9),
                100.0 * glue / (candle + glue).max(1e-9),
                time.data_ms,
                time.reduce_ms,
                time.waiting_ms,
                time.evaluation_ms
            );
        }
    }
    if let [solo, pair] = losses[..] {
        println!(
            "\nrelative gap of the 2-rank run's validation loss to the single process's: {:+.2}% \
             (bar: within 2%)",
            100.0 * (pair - solo) / solo
        );
    }
    Ok(())
}

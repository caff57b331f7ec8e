//! The transformer's figures, side by side in one run: a single-process run against the 2-rank
//! Cadence run (rank 1 slowed 2.5×) on the same windows (the same tokens), both through the
//! `Replica` adapter, and optionally the 2-rank run with an outer optimizer (`slowmo` or
//! `nesterov`); validation loss of each after every epoch (nats/byte, bits/byte, the relative gap
//! to the single process), the wall time each run took to reach the single process's final loss
//! within 2%, tokens/s per rank, where a rank's step time goes (candle's work, the runtime's
//! data, reduce and waiting), and the adapter's glue per step (gradients out of candle, the
//! stepped weights back into its variables) against a whole step, timed on the same model.
//!
//! `cargo run --release -p flodl-candle --example gpt_figures -- [tiny|default|large] [WINDOWS]
//! [BATCH] [EPOCHS] [none|slowmo|nesterov] [EVAL_WINDOWS] [ANCHOR|elche]` (defaults: default
//! 2048 16 1 none 256 and the transformer's fixed window, `gpt_elche`; `elche` is ElChe's own
//! cadence, a number another fixed anchor); `WINDOWS` 0 times the glue alone.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flodl_candle::CandleReplica;
use flodl_candle::gpt::{Gpt, GptSize, gpt_elche, gpt_optim, gpt_schedule};
use flodl_data::{Dataset, Shakespeare, Subset, TextSplit, unigram_entropy};
use flodl_ddp::control::outer::OuterKind;
use flodl_ddp::{
    Batch, BatchEval, Devices, Policy, Replica, ReplicaContext, TimeBreakdown, TrainedState,
    Trainer,
};
use flodl_tensor::{Stream, Tensor};

const LR: f64 = 3e-3;
const SLOW: f64 = 2.5;

/// Seconds a rank spent in candle (train_step, step: the per-step glue of gradients out and
/// weights back is inside them) and in the adapter's export and import at reduces.
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
    fn optimizer_state(&self) -> &[Tensor] {
        self.inner.optimizer_state()
    }
    fn optimizer_state_mut(&mut self) -> &mut [Tensor] {
        self.inner.optimizer_state_mut()
    }
    fn optimizer_steps(&self) -> u64 {
        self.inner.optimizer_steps()
    }
    fn set_optimizer_steps(&mut self, steps: u64) {
        self.inner.set_optimizer_steps(steps);
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
    let epochs: usize = args.get(3).map_or(Ok(1), |s| s.parse())?;
    let outer = match args.get(4).map(String::as_str) {
        None | Some("none") => None,
        Some("slowmo") => Some(OuterKind::slow_momentum()),
        Some("nesterov") => Some(OuterKind::nesterov()),
        Some(other) => anyhow::bail!("no outer optimizer {other} (none, slowmo, nesterov)"),
    };
    let eval_windows: usize = args.get(5).map_or(Ok(256), |s| s.parse())?;
    let knobs = match args.get(6).map(String::as_str) {
        None => gpt_elche(),
        Some("elche") => flodl_ddp::ElCheKnobs::default(),
        Some(n) => {
            let anchor: usize = n.parse()?;
            flodl_ddp::ElCheKnobs { anchor, max_anchor: anchor, ..Default::default() }
        }
    };
    println!("ElChe: anchor {}, at most {}", knobs.anchor, knobs.max_anchor);
    let config = size.config();
    let train: Arc<dyn Dataset> = Arc::new(Subset::first(
        Shakespeare::vendored(TextSplit::Train)?.windows(config.context)?,
        windows,
    ));
    let valid = Subset::first(
        Shakespeare::vendored(TextSplit::Valid)?.windows(config.context)?,
        eval_windows,
    );
    let targets: Vec<u8> = (0..valid.len())
        .filter_map(|i| valid.inner().window(i))
        .flat_map(|w| &w[1..])
        .copied()
        .collect();
    let bound = unigram_entropy(&targets);
    let valid: Arc<dyn Dataset> = Arc::new(valid);
    let steps = (epochs * windows / batch) as u64;
    println!(
        "gpt {} ({:.2}M parameters, context {}), {} training windows ({} tokens) x {epochs} \
         epochs, batch {batch}, AdamW lr {LR} warmup {} then cosine; {} validation bytes, \
         unigram bound {bound}",
        size.name(),
        config.parameter_count() as f64 / 1e6,
        config.context,
        windows,
        windows * config.context,
        steps / 10,
        targets.len()
    );
    glue(config, &Shakespeare::vendored(TextSplit::Train)?.windows(config.context)?, batch)?;
    if windows == 0 {
        return Ok(());
    }
    let run = |ranks: usize,
               outer: Option<OuterKind>|
     -> anyhow::Result<(TrainedState, Vec<Split>, f64)> {
        let splits: Splits = Arc::default();
        let s = splits.clone();
        let factory = move |ctx: &ReplicaContext| {
            let inner = CandleReplica::new(Gpt::new(config, ctx.seed)?, gpt_optim(), ctx)?;
            Ok(Timed { inner, rank: ctx.rank, splits: s.clone() })
        };
        let slowdown = if ranks == 1 { vec![1.0] } else { vec![1.0, SLOW] };
        let t = Instant::now();
        let mut trainer = Trainer::new(factory);
        if let Some(kind) = outer {
            trainer = trainer.outer(kind);
        }
        let state = trainer
            .dataset(train.clone())
            .test_dataset(valid.clone(), 1)
            .devices(Devices::Cpu(ranks))
            .slowdown(slowdown)
            .policy(Policy::Cadence)
            .elche(knobs.clone())
            .batch_size(batch)
            .epochs(epochs)
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
    let mut target = None;
    let mut runs = vec![
        ("single process".to_owned(), 1, None),
        ("2 ranks, Cadence, rank 1 at 2.5x".to_owned(), 2, None),
    ];
    if let Some(kind) = outer {
        runs.push((format!("2 ranks, Cadence, rank 1 at 2.5x, outer {kind:?}"), 2, Some(kind)));
    }
    for (name, ranks, outer) in runs {
        let (state, splits, wall) = run(ranks, outer)?;
        let eval = state.final_eval().ok_or_else(|| anyhow::anyhow!("no evaluation"))?;
        losses.push(eval.loss);
        // The single process's final loss within 2%: the target every run is timed to.
        let target = *target.get_or_insert(eval.loss * 1.02);
        println!("\n{name}: validation after each epoch (nats/byte, at s since the start):");
        for e in &state.epochs {
            if let Some(v) = &e.eval {
                println!("  epoch {}: {:.4} at {:.1} s", e.epoch, v.loss, e.at_ms / 1e3);
            }
        }
        let reached = state
            .epochs
            .iter()
            .find(|e| e.eval.as_ref().is_some_and(|v| v.loss <= target))
            .map_or_else(|| "not reached".to_owned(), |e| format!("{:.1} s", e.at_ms / 1e3));
        println!(
            "  wall to {target:.4} nats/byte (the single process's final loss + 2%): {reached}"
        );
        println!(
            "\n{name}: validation {:.4} nats/byte ({:.4} bits/byte), next-byte accuracy {:.1}%, \
             {wall:.1} s wall, {} reduces",
            eval.loss,
            eval.loss / std::f64::consts::LN_2,
            eval.accuracy * 100.0,
            state.reduces
        );
        println!(
            "| rank | windows | tokens/s (compute) | candle ms (train_step + step, the per-step glue in it) | export+import ms (at reduces) | their share | data | reduce | waiting | eval |"
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
    if let [solo, rest @ ..] = &losses[..] {
        for pair in rest {
            println!(
                "\nrelative gap of a 2-rank run's validation loss to the single process's: \
                 {:+.2}% (bar: within 2%)",
                100.0 * (pair - solo) / solo
            );
        }
    }
    Ok(())
}

/// The adapter's glue per step, against a whole step on one thread: gradients copied out of
/// candle and the stepped weights written back into its variables (what `CandleReplica` adds to
/// candle's own forward, backward and AdamW), timed on the model over a real batch.
fn glue(
    config: flodl_candle::gpt::GptConfig,
    train: &flodl_data::ByteWindows,
    batch: usize,
) -> anyhow::Result<()> {
    use flodl_candle::{AdamW, CandleModel};
    let pool = flodl_candle::pool(1)?;
    pool.install(|| -> anyhow::Result<()> {
        let model = Gpt::new(config, 5)?;
        let stream = Stream::cpu_with_threads(1);
        let mut adamw = AdamW::new(model.vars(), &gpt_optim(), &stream)?;
        let tokens: Vec<i32> = (0..batch)
            .filter_map(|i| train.window(i))
            .flat_map(|w| w.iter().map(|&b| i32::from(b)))
            .collect();
        let b = Batch::new(vec![Tensor::from_slice(
            &tokens,
            &[batch, config.context + 1],
            &stream,
        )?])?;
        let device = candle_core::Device::Cpu;
        let (mut whole, mut copies) = (Duration::ZERO, Duration::ZERO);
        let reps = 3;
        for _ in 0..reps {
            let t = Instant::now();
            let loss = model.loss(&b, &device)?;
            let grads = loss.backward().map_err(flodl_candle::candle_error)?;
            let c = Instant::now();
            adamw.take_grads(model.vars(), &grads)?;
            let mut glue = c.elapsed();
            adamw.step(1e-4)?;
            let c = Instant::now();
            adamw.write_vars(model.vars())?;
            glue += c.elapsed();
            whole += t.elapsed();
            copies += glue;
        }
        println!(
            "glue per step (gradients out, weights back, {:.1} MB each way): {:.1} ms of a {:.0} ms \
             step ({:.2}%)",
            config.parameter_count() as f64 * 4.0 / 1e6,
            copies.as_secs_f64() * 1e3 / f64::from(reps),
            whole.as_secs_f64() * 1e3 / f64::from(reps),
            100.0 * copies.as_secs_f64() / whole.as_secs_f64()
        );
        Ok(())
    })
}

//! `flodl-tch-gpt`: trains the tch transformer on Shakespeare across flodl ranks.
//!
//!     cargo run --release --manifest-path flodl-tch/Cargo.toml -p flodl-tch-gpt -- --size tiny

use anyhow::bail;
use clap::Parser;
use flodl_ddp::Policy;
use flodl_ddp::control::outer::OuterKind;
use flodl_tch_gpt::config::{GPT_ANCHOR, GptConfig, Size};
use flodl_tch_gpt::train::{Settings, train};

#[derive(Debug, Parser)]
#[command(about = "A byte-level GPT in tch, trained on Shakespeare across flodl-ddp ranks")]
struct Args {
    /// Model size.
    #[arg(long, value_enum, default_value = "tiny")]
    size: Size,
    /// Ranks (one libtorch CPU thread each).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Slowdown of the last rank.
    #[arg(long, default_value_t = 2.5)]
    slow: f64,
    /// Passes over the training windows.
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    /// Windows per batch.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Training windows (the first N; all of the 36 training plays by default).
    #[arg(long)]
    train_windows: Option<usize>,
    /// Validation windows (the first N of the 2 held-out plays).
    #[arg(long, default_value_t = 512)]
    valid_windows: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Warmup steps.
    #[arg(long, default_value_t = 20)]
    warmup: u64,
    /// `sync`, `cadence` or `async`.
    #[arg(long, default_value = "cadence")]
    policy: String,
    /// Rank 1 fails at this training step of its own (a death drill).
    #[arg(long)]
    fail_at: Option<usize>,
    #[arg(long, default_value_t = 28)]
    seed: u64,
    /// Batches of the slowest rank per averaging window, fixed (0: ElChe's own cadence, which
    /// widens the window up to an epoch; the default's reason is at `GPT_ANCHOR`).
    #[arg(long, default_value_t = GPT_ANCHOR)]
    anchor: usize,
    /// Outer step on each average: SlowMo's learning rate (momentum `--outer-momentum`).
    #[arg(long)]
    outer_lr: Option<f32>,
    /// Outer momentum (with `--outer-lr`).
    #[arg(long, default_value_t = 0.0)]
    outer_momentum: f32,
    /// Prints when the validation loss (evaluated after each epoch) first reached this many
    /// nats per byte: the wall time to a target loss.
    #[arg(long)]
    target_loss: Option<f64>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let policy = match args.policy.as_str() {
        "sync" => Policy::Sync,
        "cadence" => Policy::Cadence,
        "async" => Policy::Async,
        other => bail!("unknown policy `{other}` (sync, cadence, async)"),
    };
    let mut slowdown = vec![1.0; args.ranks];
    if let Some(last) = slowdown.last_mut() {
        *last = args.slow;
    }
    let config = GptConfig::of(args.size);
    let settings = Settings {
        config,
        ranks: args.ranks,
        slowdown,
        policy,
        epochs: args.epochs,
        batch_size: args.batch,
        train_windows: args.train_windows,
        valid_windows: Some(args.valid_windows),
        lr: args.lr,
        warmup: args.warmup,
        fail: args.fail_at.map(|at| (1, at)),
        seed: args.seed,
        anchor: (args.anchor > 0).then_some(args.anchor),
        outer: args
            .outer_lr
            .map(|lr| OuterKind::SlowMomentum { lr, momentum: args.outer_momentum }),
        ..Settings::tiny()
    };
    println!("{:?}, {} parameters", config, config.parameters());
    let out = train(&settings)?;
    for (epoch, (loss, at)) in out.valid_losses.iter().zip(&out.valid_at_s).enumerate() {
        println!(
            "epoch {epoch}: validation {loss:.4} nats/byte ({:.3} bits/byte), complete at {at:.2} s",
            loss / std::f64::consts::LN_2
        );
    }
    if let Some(target) = args.target_loss {
        match out.valid_losses.iter().zip(&out.valid_at_s).find(|(loss, _)| **loss <= target) {
            Some((loss, at)) => {
                println!("target {target:.4} nats/byte reached at {at:.2} s (validation {loss:.4})")
            }
            None => println!("target {target:.4} nats/byte not reached"),
        }
    }
    println!(
        "{} windows/epoch, {:.1} s, {:.0} tokens/s, {} reduces, {} deaths; unigram bound {:.4} nats/byte",
        out.train_windows,
        out.train_s,
        out.tokens_per_s,
        out.reduces,
        out.faults.len(),
        out.unigram_bound
    );
    for (rank, f) in out.ranks.iter().enumerate() {
        println!(
            "rank {rank}: {:.0} tokens/s of its compute; ms compute {:.0}, data {:.0}, reduce \
             (export + import included) {:.0}, waiting {:.0}",
            f.tokens_per_s, f.compute_ms, f.data_ms, f.reduce_ms, f.waiting_ms
        );
    }
    Ok(())
}

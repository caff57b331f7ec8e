//! `flodl-candle-mnist`: trains the candle LeNet-5 on MNIST through flodl-ddp's two tiers, and
//! measures throughput beside candle's own loop.
//!
//!     cargo run --release -p flodl-candle-mnist -- --run accuracy
//!     cargo run --release -p flodl-candle-mnist -- --run throughput

use std::sync::Arc;

use anyhow::bail;
use clap::{Parser, ValueEnum};
use flodl_candle_mnist::settings::{Outcome, Settings};
use flodl_candle_mnist::{baseline, cooperative, replica};
use flodl_data::{Dataset, Mnist, Split, Subset, Verify};
use flodl_ddp::{Backend, Policy};

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Run {
    /// Both tiers to accuracy, with the ranks of `--slow`.
    Accuracy,
    /// The cooperative tier only.
    Cooperative,
    /// The `Replica` tier only.
    Replica,
    /// Throughput: candle on 1 thread, candle on `--ranks` threads, then both flodl tiers on
    /// `--ranks` equal ranks of one thread each.
    Throughput,
}

#[derive(Debug, Parser)]
#[command(about = "A candle LeNet-5 on MNIST, trained across flodl-ddp ranks")]
struct Args {
    #[arg(long, value_enum, default_value = "accuracy")]
    run: Run,
    /// Passes over the training set (6: both tiers end above 98.8% on the full set).
    #[arg(long, default_value_t = 6)]
    epochs: usize,
    /// Ranks (CPU threads).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Slowdown of the last rank in accuracy runs (throughput runs use equal ranks).
    #[arg(long, default_value_t = 2.0)]
    slow: f64,
    /// Training samples (the first N; all 60000 by default).
    #[arg(long)]
    train: Option<usize>,
    /// Test samples (the first N; all 10000 by default).
    #[arg(long)]
    test: Option<usize>,
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// AdamW's learning rate.
    #[arg(long, default_value_t = 0.002)]
    lr: f32,
    /// sync, cadence or async.
    #[arg(long, default_value = "cadence")]
    policy: String,
    /// collective or host.
    #[arg(long, default_value = "collective")]
    backend: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let policy = match args.policy.as_str() {
        "sync" => Policy::Sync,
        "cadence" => Policy::Cadence,
        "async" => Policy::Async,
        other => bail!("unknown policy {other}"),
    };
    let backend = match args.backend.as_str() {
        "collective" => Backend::Collective,
        "host" => Backend::Host,
        other => bail!("unknown backend {other}"),
    };
    let dir = flodl_data::mnist::vendored_dir();
    let limit = |d: Mnist, n: Option<usize>| -> Arc<dyn Dataset> {
        match n {
            Some(n) => Arc::new(Subset::first(Arc::new(d), n)),
            None => Arc::new(d),
        }
    };
    let train = limit(Mnist::load(&dir, Split::Train, Verify::Skip)?, args.train);
    let test = limit(Mnist::load(&dir, Split::Test, Verify::Skip)?, args.test);
    let mut slowdown = vec![1.0; args.ranks];
    if let Some(last) = slowdown.last_mut() {
        *last = args.slow;
    }
    let settings = Settings {
        train,
        test,
        epochs: args.epochs,
        batch_size: args.batch,
        lr: args.lr,
        ranks: args.ranks,
        slowdown,
        policy,
        backend,
        seed: 42,
    };
    println!(
        "{} training / {} test samples, {} epochs, batch {}, {policy:?} on {backend:?}",
        settings.train.len(),
        settings.test.len(),
        settings.epochs,
        settings.batch_size
    );
    match args.run {
        Run::Accuracy => {
            report("cooperative tier", &settings, cooperative::train(&settings)?);
            report("Replica tier", &settings, replica::train(&settings)?);
        }
        Run::Cooperative => report("cooperative tier", &settings, cooperative::train(&settings)?),
        Run::Replica => report("Replica tier", &settings, replica::train(&settings)?),
        Run::Throughput => throughput(Settings { slowdown: vec![1.0; args.ranks], ..settings })?,
    }
    Ok(())
}

/// Prints one run's outcome.
fn report(what: &str, settings: &Settings, o: Outcome) {
    println!(
        "{what:<28} ranks {} slowdown {:?}: test accuracy {:.2}%, {} epochs in {:.1} s \
         ({:.0} samples/s, {} reduces)",
        settings.ranks,
        settings.slowdown,
        100.0 * o.accuracy,
        settings.epochs,
        o.train_s,
        o.samples_per_s,
        o.reduces
    );
}

/// The throughput figures, in one run, with the ratios the issue asks about.
fn throughput(settings: Settings) -> anyhow::Result<()> {
    let n = settings.ranks;
    let one = baseline::train(&settings, 1)?;
    report("candle, 1 thread", &Settings { ranks: 1, ..settings.clone() }, one);
    let all = baseline::train(&settings, n)?;
    report(&format!("candle, {n} threads"), &Settings { ranks: 1, ..settings.clone() }, all);
    let coop = cooperative::train(&settings)?;
    report("flodl cooperative tier", &settings, coop);
    let rep = replica::train(&settings)?;
    report("flodl Replica tier", &settings, rep);
    for (what, o) in [("cooperative", coop), ("Replica", rep)] {
        println!(
            "{what}: {:.2}x candle on 1 thread, {:.2}x candle on {n} threads",
            o.samples_per_s / one.samples_per_s,
            o.samples_per_s / all.samples_per_s
        );
    }
    Ok(())
}

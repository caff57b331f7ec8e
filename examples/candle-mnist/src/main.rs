//! `flodl-candle-mnist`: trains the candle LeNet-5 on MNIST through flodl-ddp's two tiers, and
//! measures throughput beside candle's own loop.
//!
//!     cargo run --release -p flodl-candle-mnist -- --run accuracy
//!     cargo run --release -p flodl-candle-mnist -- --run throughput

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Parser, ValueEnum};
use flodl_candle_mnist::settings::{Outcome, Settings};
use flodl_candle_mnist::{baseline, cooperative, cpu, replica};
use flodl_data::{Dataset, Mnist, Split, Subset, Verify};
use flodl_ddp::{Activity, Backend, Policy};

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Run {
    /// Both tiers to accuracy, with the ranks of `--slow`.
    Accuracy,
    /// The cooperative tier only.
    Cooperative,
    /// The `Replica` tier only.
    Replica,
    /// candle's own loop on `--threads` threads.
    Candle,
    /// `--ranks` independent candle loops side by side, each on one thread and its share of
    /// the data: the ceiling of any data-parallel scheme on this machine.
    Independent,
    /// Throughput: candle on 1 thread, candle on `--ranks` threads, `--ranks` independent
    /// candle loops, then both flodl tiers on `--ranks` equal ranks of one thread each; every
    /// measurement in a process of its own, with candle's thread settings fitting it.
    Throughput,
}

impl Run {
    /// The run's name on the command line.
    fn name(self) -> &'static str {
        match self {
            Run::Accuracy => "accuracy",
            Run::Cooperative => "cooperative",
            Run::Replica => "replica",
            Run::Candle => "candle",
            Run::Independent => "independent",
            Run::Throughput => "throughput",
        }
    }
}

#[derive(Debug, Clone, Parser)]
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
    /// Threads of candle's own loop (`--run candle`).
    #[arg(long, default_value_t = 1)]
    threads: usize,
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
    /// Ends the output with the machine-readable line of the throughput run's measurements.
    #[arg(long, hide = true)]
    outcome: bool,
}

/// The prefix of the line that carries a measurement's throughput to the throughput run.
const OUTCOME: &str = "outcome samples/s ";

/// How long the throughput run waits for one of its measurements.
const MEASURE_DEADLINE: Duration = Duration::from_secs(4 * 3600);

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.run == Run::Throughput {
        return throughput(&args);
    }
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
    if !args.outcome {
        header(&settings);
    }
    let cpu0 = cpu::process_seconds();
    let (what, outcome) = match args.run {
        Run::Accuracy => {
            report("cooperative tier", &settings, &cooperative::train(&settings)?);
            report("Replica tier", &settings, &replica::train(&settings)?);
            return Ok(());
        }
        Run::Cooperative => ("flodl cooperative tier".into(), cooperative::train(&settings)?),
        Run::Replica => ("flodl Replica tier".into(), replica::train(&settings)?),
        Run::Candle => (
            format!("candle, {} thread(s)", args.threads),
            baseline::train(&settings, args.threads)?,
        ),
        Run::Independent => (
            format!("candle x{} independent", args.ranks),
            baseline::independent(&settings, args.ranks)?,
        ),
        Run::Throughput => bail!("the throughput run measures in processes of its own"),
    };
    report(&what, &settings, &outcome);
    if let (Some(a), Some(b)) = (cpu0, cpu::process_seconds()) {
        let bs = settings.batch_size.max(1);
        let samples = settings.train.len() / bs * bs * settings.epochs;
        println!(
            "  cpu {:.1} s over the whole run (model, training, evaluation): {:.2} ms per \
             training sample",
            b - a,
            1000.0 * (b - a) / samples.max(1) as f64
        );
    }
    if args.outcome {
        println!("{OUTCOME}{}", outcome.samples_per_s);
    }
    Ok(())
}

/// Prints what a run trains.
fn header(settings: &Settings) {
    println!(
        "{} training / {} test samples, {} epochs, batch {}, {:?} on {:?}",
        settings.train.len(),
        settings.test.len(),
        settings.epochs,
        settings.batch_size,
        settings.policy,
        settings.backend
    );
}

/// Prints one run's outcome, and where each rank's time went.
fn report(what: &str, settings: &Settings, o: &Outcome) {
    let ranks = if o.ranks.is_empty() {
        String::new()
    } else {
        format!(" ranks {} slowdown {:?}:", settings.ranks, settings.slowdown)
    };
    println!(
        "{what:<28}{ranks} test accuracy {:.2}%, {} epochs in {:.1} s ({:.0} samples/s, {} \
         reduces)",
        100.0 * o.accuracy,
        settings.epochs,
        o.train_s,
        o.samples_per_s,
        o.reduces
    );
    for (rank, t) in o.ranks.iter().enumerate() {
        let parts: Vec<String> = Activity::ALL
            .iter()
            .filter(|&&a| t.get(a) > 0.0)
            .map(|&a| format!("{a} {:.2} s ({:.1}%)", t.get(a) / 1000.0, 100.0 * t.share(a)))
            .collect();
        println!("  rank {rank}: {}", parts.join(", "));
        if let Some(&candle_s) = o.candle_s.get(rank) {
            println!(
                "    its loop inside candle {candle_s:.2} s: the hand-offs took {:.2} s of its \
                 compute",
                t.compute_ms / 1000.0 - candle_s
            );
        }
    }
}

/// The throughput figures, in one run, with the ratios the issue asks about. Every measurement
/// runs in a process of its own: candle's CPU kernels take their thread counts from the
/// process's environment (`RAYON_NUM_THREADS` for matrix products, `CANDLE_NUM_THREADS` for
/// the process-wide pool of its large element-wise operations), which a one-thread rank or
/// loop needs at 1 and candle on `n` threads at `n`.
fn throughput(args: &Args) -> anyhow::Result<()> {
    let n = args.ranks;
    let train = args.train.map_or("all".into(), |t| t.to_string());
    println!(
        "throughput: {train} training samples, {} epochs, batch {}, {} on {}, {n} equal ranks; \
         each measurement a process of its own",
        args.epochs, args.batch, args.policy, args.backend
    );
    let one = measure(args, Run::Candle, 1)?;
    let all = measure(args, Run::Candle, n)?;
    let ceiling = measure(args, Run::Independent, 1)?;
    let coop = measure(args, Run::Cooperative, 1)?;
    let rep = measure(args, Run::Replica, 1)?;
    let figures = [
        (format!("candle x{n} independent"), ceiling),
        ("cooperative".into(), coop),
        ("Replica".into(), rep),
    ];
    for (what, x) in figures {
        println!(
            "{what}: {:.2}x candle on 1 thread, {:.2}x candle on {n} threads, {:.0}% of the \
             independent loops",
            x / one,
            x / all,
            100.0 * x / ceiling
        );
    }
    Ok(())
}

/// Runs `run` in a process of its own, with candle's kernels on `threads` threads, relays its
/// report and returns its throughput in samples per second.
///
/// # Errors
/// When the process cannot start, fails, outlives [`MEASURE_DEADLINE`] or reports no
/// throughput.
fn measure(args: &Args, run: Run, threads: usize) -> anyhow::Result<f64> {
    let exe = std::env::current_exe().context("the example's own executable")?;
    let mut cmd = Command::new(exe);
    let flags = [
        ("--run", run.name().to_string()),
        ("--epochs", args.epochs.to_string()),
        ("--ranks", args.ranks.to_string()),
        ("--threads", threads.to_string()),
        ("--slow", "1".into()),
        ("--batch", args.batch.to_string()),
        ("--lr", args.lr.to_string()),
        ("--policy", args.policy.clone()),
        ("--backend", args.backend.clone()),
    ];
    for (flag, value) in flags {
        cmd.arg(flag).arg(value);
    }
    for (flag, value) in [("--train", args.train), ("--test", args.test)] {
        if let Some(v) = value {
            cmd.arg(flag).arg(v.to_string());
        }
    }
    let threads = threads.to_string();
    cmd.arg("--outcome")
        .env("RAYON_NUM_THREADS", &threads)
        .env("CANDLE_NUM_THREADS", &threads)
        .stdout(Stdio::piped());
    let mut child = cmd.spawn().context("starting a measurement")?;
    // Read on a thread of its own, so that a chatty child never fills the pipe and stalls.
    let reader = child.stdout.take().map(|mut stdout| {
        std::thread::spawn(move || {
            let mut out = String::new();
            stdout.read_to_string(&mut out).map(|_| out)
        })
    });
    let deadline = Instant::now() + MEASURE_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            child.kill()?;
            bail!("the {} measurement ran past {MEASURE_DEADLINE:?}", run.name());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = match reader {
        Some(r) => r.join().map_err(|_| anyhow::anyhow!("the output reader panicked"))??,
        None => String::new(),
    };
    let mut samples_per_s = None;
    for line in out.lines() {
        match line.strip_prefix(OUTCOME) {
            Some(v) => samples_per_s = v.trim().parse::<f64>().ok(),
            None => println!("{line}"),
        }
    }
    if !status.success() {
        bail!("the {} measurement failed: {status}", run.name());
    }
    samples_per_s.with_context(|| format!("the {} measurement reported no throughput", run.name()))
}

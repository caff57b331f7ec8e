//! Recovery from a rank's death, in every policy × backend, on CPU ranks.
//!
//! ```text
//! cargo run --release -p flodl-ddp --example fault -- [--samples 20000] [--epochs 3]
//!     [--ranks 3] [--kill-step 150] [--watchdog 30]
//! ```
//!
//! Workload: the first `--samples` MNIST training samples, the 10k test set, MLP 784-256-128-10,
//! batch 64 per rank, SGD lr 0.05 momentum 0.9, `--ranks` single-thread CPU ranks. Each mode is
//! run twice: once undisturbed, once with rank 1's replica returning an error at its
//! `--kill-step`-th training step. For the second run the recovery time is the time from the
//! coordinator declaring the death ([`FaultEvent::at_ms`]) to the next completed reduce
//! ([`ReduceEvent::at_ms`]); since that may be a reduce already under way without needing the
//! dead rank, the time to the first reduce the dead rank took no part in (its `steps` entry 0,
//! all survivors) is printed too. Printed: per mode both times and the test accuracy with and
//! without the death, then the medians over the modes and the accuracy drops.

use std::sync::Arc;
use std::time::Duration;

use flodl_data::{Dataset, Mnist, Split, Subset, Verify};
use flodl_ddp::{
    Backend, DdpHandle, Devices, FailingReplica, Failure, FaultEvent, Mlp, MlpConfig, Optimizer,
    Policy, ReduceEvent, ReplicaContext, Result, TrainedState, Trainer,
};

struct Args {
    samples: usize,
    epochs: usize,
    ranks: usize,
    kill_step: usize,
    watchdog: u64,
}

fn parse() -> std::result::Result<Args, String> {
    let mut args = Args { samples: 20_000, epochs: 3, ranks: 3, kill_step: 150, watchdog: 30 };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let value: usize = it
            .next()
            .ok_or(format!("{a} needs a value"))?
            .parse()
            .map_err(|e| format!("{a}: {e}"))?;
        match a.as_str() {
            "--samples" => args.samples = value,
            "--epochs" => args.epochs = value,
            "--ranks" => args.ranks = value,
            "--kill-step" => args.kill_step = value,
            "--watchdog" => args.watchdog = value as u64,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.ranks < 2 {
        return Err("--ranks must be at least 2 (rank 1 dies)".into());
    }
    Ok(args)
}

/// What one run left: its state, its deaths and its reduces.
struct Outcome {
    state: TrainedState,
    faults: Vec<FaultEvent>,
    reduces: Vec<ReduceEvent>,
}

fn drain(mut handle: DdpHandle) -> Result<Outcome> {
    let mut reduces = Vec::new();
    while handle.next_metrics(Duration::from_secs(600)).is_some() {
        reduces.extend(handle.poll_reduce_events());
    }
    reduces.extend(handle.poll_reduce_events());
    let faults = handle.poll_fault_events();
    Ok(Outcome { state: handle.join()?, faults, reduces })
}

fn run(
    args: &Args,
    train: &Arc<dyn Dataset>,
    test: &Arc<dyn Dataset>,
    policy: Policy,
    backend: Backend,
    kill: bool,
) -> Result<Outcome> {
    let cfg = MlpConfig::new(&[784, 256, 128, 10], Optimizer::sgd(0.9));
    let kill_step = args.kill_step;
    let factory = move |ctx: &ReplicaContext| -> Result<FailingReplica<Mlp>> {
        let fail_at = (kill && ctx.rank == 1).then_some(kill_step);
        let inner = Mlp::new(&cfg, ctx.batch_size, ctx.seed, &ctx.stream)?;
        Ok(FailingReplica::new(inner, fail_at, Failure::Error))
    };
    let handle = Trainer::new(factory)
        .dataset(train.clone())
        .test_dataset(test.clone(), args.epochs)
        .batch_size(64)
        .epochs(args.epochs)
        .devices(Devices::Cpu(args.ranks))
        .policy(policy)
        .backend(backend)
        .learning_rate(0.05)
        .watchdog(Duration::from_secs(args.watchdog))
        .run()?;
    drain(handle)
}

fn accuracy(state: &TrainedState) -> f64 {
    state.final_eval().map_or(f64::NAN, |e| e.accuracy)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let dir = flodl_data::mnist::vendored_dir();
    let mnist = Arc::new(Mnist::load(&dir, Split::Train, Verify::Skip)?);
    let samples = args.samples.min(mnist.len());
    let train: Arc<dyn Dataset> = Arc::new(Subset::first(mnist, samples));
    let test: Arc<dyn Dataset> = Arc::new(Mnist::load(&dir, Split::Test, Verify::Skip)?);
    println!(
        "{samples} samples, {} epochs, {} CPU ranks, rank 1 fails at its step {}, watchdog {} s",
        args.epochs, args.ranks, args.kill_step, args.watchdog
    );
    println!(
        "{:<20} {:>12} {:>12} {:>9} {:>13} {:>15} {:>9}",
        "mode", "acc (clean)", "acc (death)", "drop", "recovery ms", "survivors ms", "death ms"
    );
    let mut recoveries = Vec::new();
    let mut survivors = Vec::new();
    let mut drops = Vec::new();
    for policy in [Policy::Sync, Policy::Cadence, Policy::Async] {
        for backend in [Backend::Collective, Backend::Host] {
            let mode = format!("{policy:?}-{backend:?}");
            let clean = run(&args, &train, &test, policy, backend, false)?;
            let hurt = run(&args, &train, &test, policy, backend, true)?;
            let death =
                hurt.faults.iter().find(|f| f.rank == 1).ok_or_else(|| {
                    format!("{mode}: rank 1 never died (is --kill-step too large?)")
                })?;
            let after = |survivors_only: bool| {
                hurt.reduces
                    .iter()
                    .filter(|r| !survivors_only || r.steps.get(1).is_none_or(|&s| s == 0))
                    .map(|r| r.at_ms)
                    .filter(|&at| at >= death.at_ms)
                    .reduce(f64::min)
                    .map(|at| at - death.at_ms)
            };
            let (recovery, regrouped) = (after(false), after(true));
            let (a0, a1) = (accuracy(&clean.state), accuracy(&hurt.state));
            let drop = a0 - a1;
            println!(
                "{mode:<20} {:>12.4} {:>12.4} {:>+9.4} {:>13} {:>15} {:>9.0}",
                a0,
                a1,
                drop,
                recovery.map_or("none".into(), |r| format!("{r:.1}")),
                regrouped.map_or("none".into(), |r| format!("{r:.1}")),
                death.at_ms
            );
            if let Some(r) = recovery {
                recoveries.push(r);
            }
            if let Some(r) = regrouped {
                survivors.push(r);
            }
            drops.push(drop);
        }
    }
    println!(
        "median recovery {:.1} ms over {} modes (to the first survivors-only reduce: {:.1} ms over \
         {}); accuracy drop: median {:+.4}, worst {:+.4}",
        median(recoveries.clone()),
        recoveries.len(),
        median(survivors.clone()),
        survivors.len(),
        median(drops.clone()),
        drops.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    );
    Ok(())
}

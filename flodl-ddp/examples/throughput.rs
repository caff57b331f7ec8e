//! Throughput and accuracy of the DDP modes on MNIST with the reference MLP, on CPU ranks.
//!
//! ```text
//! cargo run --release -p flodl-ddp --example throughput -- [--epochs 5] [--slow 2.5]
//!     [--runs solo,equal,skew] [--modes cadence-collective,...] [--lr 0.05]
//!     [--lr-scale-ratio 0] [--max-anchor N] [--repeats 1] [--prefetch auto,2] [--json]
//!     [--hidden 256,128] [--samples N]
//! ```
//!
//! Workload: MNIST (60k train, 10k test), MLP 784-256-128-10 (`--hidden 4096,4096`: the
//! 20M-parameter MLP, 80 MB of state per exchange), batch 64 per rank, SGD lr 0.05 momentum 0.9,
//! one thread per rank; `--samples N` trains on the first N training samples only (a short run
//! of the large MLP). `solo` runs rank 0 alone (factor 1) and rank 1 alone
//! (factor `--slow`); `equal` runs two equal ranks; `skew` runs two ranks with rank 1 slowed by
//! `--slow`, and compares the aggregate with 0.9 × (solo 0 + solo 1) of the same invocation.
//! With `skew`, each round also runs the **co-run ceiling**: the same two ranks (rank 1 slowed)
//! training side by side in this process, each its own single-rank job that never averages,
//! the slow one on the share of the samples its solo speed covers in the fast one's time (so
//! both end together); its aggregate is the sum of the two jobs' throughputs. On a small
//! machine the solo sum is no ceiling (a sleeping slow rank frees its core for the other), the
//! co-run is: a skew mode's loss against the solo sum splits into contention (solo sum → co-run)
//! and flodl's own cost (co-run → achieved).
//! Each line reports samples/s over the training wall time, the test accuracy after the last
//! epoch and each rank's time breakdown (compute, data, reduce, waiting, evaluation,
//! checkpoint, other, as shares of its training wall); `--json` prints one JSON object per run
//! instead. `--repeats N` runs the whole set N times round-robin (so a drift of the machine's
//! load touches every run alike) and ends with, per skew mode, the median over the repeats of
//! the aggregate over (solo 0 + solo 1) of the same repeat, of the slow rank's non-compute
//! share, of the efficiency (the aggregate over the ranks' compute rates in the run) and of the
//! contention (those rates over the solo runs' rates). `--prefetch auto,2` runs every two-rank
//! run once per prefetch setting (`auto`: none on CPU ranks, `off`, or a depth), side by side
//! in each repeat, and summarises each apart.

use std::sync::Arc;
use std::time::Duration;

use flodl_data::{Dataset, Mnist, Split, Subset, Verify};
use flodl_ddp::{
    Activity, Backend, Devices, ElCheKnobs, Mlp, MlpConfig, Optimizer, Policy, Prefetch,
    TimeBreakdown, TrainedState, Trainer,
};

struct Args {
    epochs: usize,
    slow: f64,
    runs: Vec<String>,
    modes: Vec<(Policy, Backend)>,
    json: bool,
    lr: f32,
    lr_scale_ratio: f64,
    max_anchor: Option<usize>,
    repeats: usize,
    prefetch: Vec<Prefetch>,
    hidden: Vec<usize>,
    samples: Option<usize>,
}

fn parse_mode(s: &str) -> Option<(Policy, Backend)> {
    let (p, b) = s.split_once('-')?;
    Some((p.parse().ok()?, b.parse().ok()?))
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        epochs: 5,
        slow: 2.5,
        runs: vec!["solo".into(), "equal".into(), "skew".into()],
        modes: vec![
            (Policy::Cadence, Backend::Collective),
            (Policy::Cadence, Backend::Host),
            (Policy::Async, Backend::Collective),
            (Policy::Async, Backend::Host),
        ],
        json: false,
        lr: 0.05,
        lr_scale_ratio: 0.0,
        max_anchor: None,
        repeats: 1,
        prefetch: vec![Prefetch::Auto],
        hidden: vec![256, 128],
        samples: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--epochs" => args.epochs = value()?.parse().map_err(|e| format!("--epochs: {e}"))?,
            "--slow" => args.slow = value()?.parse().map_err(|e| format!("--slow: {e}"))?,
            "--runs" => args.runs = value()?.split(',').map(str::to_owned).collect(),
            "--modes" => {
                args.modes = value()?
                    .split(',')
                    .map(|m| parse_mode(m).ok_or(format!("unknown mode {m}")))
                    .collect::<Result<_, _>>()?
            }
            "--json" => args.json = true,
            "--repeats" => {
                args.repeats = value()?.parse().map_err(|e| format!("--repeats: {e}"))?
            }
            "--max-anchor" => {
                args.max_anchor = Some(value()?.parse().map_err(|e| format!("--max-anchor: {e}"))?)
            }
            "--prefetch" => {
                args.prefetch = value()?
                    .split(',')
                    .map(|p| p.parse().map_err(|e| format!("--prefetch: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--hidden" => {
                args.hidden = value()?
                    .split(',')
                    .map(|h| h.parse().map_err(|e| format!("--hidden {h}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--samples" => {
                args.samples = Some(value()?.parse().map_err(|e| format!("--samples: {e}"))?)
            }
            "--lr" => args.lr = value()?.parse().map_err(|e| format!("--lr: {e}"))?,
            "--lr-scale-ratio" => {
                args.lr_scale_ratio =
                    value()?.parse().map_err(|e| format!("--lr-scale-ratio: {e}"))?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// One measured run.
struct Run {
    name: String,
    state: TrainedState,
}

fn train(
    name: &str,
    devices: usize,
    (policy, backend): (Policy, Backend),
    slowdown: Vec<f64>,
    prefetch: Prefetch,
    args: &Args,
    data: (&Arc<dyn Dataset>, &Arc<dyn Dataset>),
) -> Result<Run, Box<dyn std::error::Error>> {
    let widths: Vec<usize> =
        std::iter::once(784).chain(args.hidden.iter().copied()).chain([10]).collect();
    let mlp = MlpConfig::new(&widths, Optimizer::sgd(0.9));
    let mut knobs = ElCheKnobs::default();
    if let Some(m) = args.max_anchor {
        knobs.max_anchor = m;
    }
    let state = Trainer::new(Mlp::factory(mlp))
        .elche(knobs)
        .dataset(data.0.clone())
        .test_dataset(data.1.clone(), args.epochs)
        .batch_size(64)
        .epochs(args.epochs)
        .devices(Devices::Cpu(devices))
        .policy(policy)
        .backend(backend)
        .learning_rate(args.lr)
        .lr_scale_ratio(args.lr_scale_ratio)
        .slowdown(slowdown)
        .prefetch(prefetch)
        .stall_timeout(Duration::from_secs(300))
        .run()?
        .join()?;
    Ok(Run { name: name.to_owned(), state })
}

/// Each rank's time over the run, all epochs summed.
fn breakdowns(s: &TrainedState) -> Vec<TimeBreakdown> {
    let ranks = s.epochs.iter().map(|e| e.ranks.len()).max().unwrap_or(0);
    let mut out = vec![TimeBreakdown::default(); ranks];
    for e in &s.epochs {
        for r in &e.ranks {
            out[r.rank].merge(&r.time);
        }
    }
    out
}

/// Each rank's compute throughput over the run, in samples per ms of its own steps (as if it
/// ran alone at the speed it had).
fn compute_rates(s: &TrainedState) -> Vec<f64> {
    let ranks = s.epochs.first().map_or(0, |e| e.ranks.len());
    (0..ranks)
        .map(|r| {
            let (n, ms) = s.epochs.iter().fold((0.0, 0.0), |(n, ms), e| {
                (n + e.ranks[r].samples as f64, ms + e.ranks[r].compute_ms)
            });
            if ms > 0.0 { n / ms } else { 0.0 }
        })
        .collect()
}

/// The aggregate over the sum of the ranks' compute rates: the fraction of the ranks' speed
/// the run delivered, a figure that does not move with the machine's load.
fn efficiency(s: &TrainedState) -> f64 {
    s.throughput() / 1000.0 / compute_rates(s).iter().sum::<f64>().max(1e-9)
}

/// A breakdown as shares in percent, in `Activity::ALL` order.
fn shares_of(t: &TimeBreakdown) -> Vec<f64> {
    Activity::ALL.iter().map(|&a| (t.share(a) * 1000.0).round() / 10.0).collect()
}

fn report(run: &Run, json: bool, target: Option<f64>) {
    let s = &run.state;
    let time: Vec<Vec<f64>> = breakdowns(s).iter().map(shares_of).collect();
    let acc = s.final_eval().map_or(f64::NAN, |e| e.accuracy);
    let shares: Vec<f64> = s.epochs.last().map_or_else(Vec::new, |e| {
        e.ranks.iter().map(|r| (r.batch_share * 1000.0).round() / 1000.0).collect()
    });
    let compute = compute_rates(s);
    let efficiency = efficiency(s);
    let compute: Vec<f64> = compute.iter().map(|k| (k * 10.0).round() / 10.0).collect();
    if json {
        println!(
            "{{\"run\":\"{}\",\"samples_per_s\":{:.1},\"train_ms\":{:.1},\"test_accuracy\":{:.5},\"reduces\":{},\"shares\":{:?},\"rank_compute_ksps\":{:?},\"efficiency\":{:.3},\"target_samples_per_s\":{},\"time_pct\":{:?}}}",
            run.name,
            s.throughput(),
            s.train_ms,
            acc,
            s.reduces,
            shares,
            compute,
            efficiency,
            target.map_or("null".to_owned(), |t| format!("{t:.1}")),
            time
        );
    } else {
        let verdict = target.map_or(String::new(), |t| {
            let ok = if s.throughput() >= t { "ok" } else { "BELOW" };
            format!("  target {t:>8.0} {ok}")
        });
        println!(
            "{:<28} {:>7.0} samples/s  acc {:>6.2}%  reduces {:>4}  shares {:?}  rank compute k/s {:?}  eff {:.2}{}",
            run.name,
            s.throughput(),
            acc * 100.0,
            s.reduces,
            shares,
            compute,
            efficiency,
            verdict
        );
        if time.len() > 1 {
            let names: Vec<&str> = Activity::ALL.iter().map(|a| a.name()).collect();
            println!("{:<28} time % [{}] per rank {:?}", "", names.join(" "), time);
        }
    }
}

/// The median of `v` (NaN when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse()?;
    let dir = flodl_data::mnist::vendored_dir();
    let mnist = Mnist::load(&dir, Split::Train, Verify::Skip)?;
    let train_set: Arc<dyn Dataset> = match args.samples {
        Some(n) => Arc::new(Subset::first(mnist, n)),
        None => Arc::new(mnist),
    };
    let test_set: Arc<dyn Dataset> = Arc::new(Mnist::load(&dir, Split::Test, Verify::Skip)?);
    let data = (&train_set, &test_set);
    // Per skew mode and prefetch setting: (aggregate / (solo 0 + solo 1), slow rank's
    // non-compute share) per repeat.
    let variants = args.modes.len() * args.prefetch.len();
    let mut skew_figures: Vec<Vec<SkewFigure>> = vec![Vec::new(); variants];
    for repeat in 0..args.repeats {
        if args.repeats > 1 {
            println!("-- repeat {}/{}", repeat + 1, args.repeats);
        }
        let figures = round(&args, data)?;
        for (all, f) in skew_figures.iter_mut().zip(figures) {
            all.extend(f);
        }
    }
    if args.repeats > 1 {
        let named = args.modes.iter().flat_map(|m| args.prefetch.iter().map(move |pf| (m, pf)));
        for ((&(p, b), &pf), figures) in named.zip(&skew_figures) {
            if figures.is_empty() {
                continue;
            }
            let ratio = median(figures.iter().map(|f| f.ratio).collect());
            let slow = median(figures.iter().map(|f| f.slow_non_compute).collect());
            let efficiency = median(figures.iter().map(|f| f.efficiency).collect());
            let contention = median(figures.iter().map(|f| f.contention).collect());
            let corun = median(figures.iter().map(|f| f.corun_ratio).collect());
            let of_corun = median(figures.iter().map(|f| f.of_corun).collect());
            // Per rank and activity, the median share over the repeats.
            let ranks = figures.iter().map(|f| f.time_pct.len()).min().unwrap_or(0);
            let time: Vec<Vec<f64>> = (0..ranks)
                .map(|r| {
                    (0..Activity::ALL.len())
                        .map(|a| median(figures.iter().map(|f| f.time_pct[r][a]).collect()))
                        .collect()
                })
                .collect();
            println!(
                "skew x{} {}-{}{}: median over {} repeats: aggregate / (solo 0 + solo 1) {:.3}, slow rank non-compute {:.1}%",
                args.slow,
                p.name(),
                b.name(),
                variant(pf, &args),
                figures.len(),
                ratio,
                slow * 100.0
            );
            println!(
                "    efficiency {efficiency:.3} (aggregate / the ranks' compute rates in the run); compute rates side by side / alone {contention:.3}"
            );
            println!(
                "    of the co-run ceiling {of_corun:.3}; the loss against the solo sum splits into contention (solo sum -> co-run) {:.1}% and flodl's own cost (co-run -> achieved) {:.1}% of the solo sum",
                (1.0 - corun) * 100.0,
                (corun - ratio) * 100.0
            );
            let names: Vec<&str> = Activity::ALL.iter().map(|a| a.name()).collect();
            println!("    median time % [{}] per rank {:?}", names.join(" "), time);
        }
    }
    Ok(())
}

/// A skew run's figures: its aggregate over (solo 0 + solo 1), its slow rank's non-compute
/// share, its efficiency and contention, and each rank's time breakdown in percent
/// (`Activity::ALL` order).
#[derive(Debug, Clone)]
struct SkewFigure {
    ratio: f64,
    slow_non_compute: f64,
    /// The run's [`efficiency`].
    efficiency: f64,
    /// The ranks' compute rates in the run over their rates alone (the solo runs): what
    /// running side by side costs the steps themselves (shared caches, memory bandwidth, the
    /// coordinator's thread on the same cores).
    contention: f64,
    /// The co-run ceiling's aggregate over (solo 0 + solo 1).
    corun_ratio: f64,
    /// The run's aggregate over the co-run ceiling's: its efficiency against what the machine
    /// can give these two ranks side by side.
    of_corun: f64,
    time_pct: Vec<Vec<f64>>,
}

/// A run name's suffix naming its prefetch setting, when several are compared.
fn variant(prefetch: Prefetch, args: &Args) -> String {
    if args.prefetch.len() > 1 { format!(" prefetch {prefetch}") } else { String::new() }
}

/// The co-run ceiling: rank 0 and rank 1 (slowed) each trained as its own single-rank job, side
/// by side and never averaging, rank 1 on `share` of the samples (its solo speed over rank 0's,
/// so both end about together). Returns the sum of the two jobs' throughputs.
fn co_run(
    args: &Args,
    data: (&Arc<dyn Dataset>, &Arc<dyn Dataset>),
    share: f64,
) -> Result<f64, Box<dyn std::error::Error>> {
    let part = ((data.0.len() as f64 * share).round() as usize).clamp(64, data.0.len());
    let slow_set: Arc<dyn Dataset> = Arc::new(Subset::first(data.0.clone(), part));
    let mode = (Policy::Sync, Backend::Collective);
    let (fast, slow) = std::thread::scope(|scope| {
        let fast = scope.spawn(|| {
            train("co-run rank0", 1, mode, vec![1.0], Prefetch::Auto, args, data)
                .map_err(|e| e.to_string())
        });
        let slow = scope.spawn(|| {
            let name = format!("co-run rank1 (x{}, {part} samples)", args.slow);
            train(&name, 1, mode, vec![args.slow], Prefetch::Auto, args, (&slow_set, data.1))
                .map_err(|e| e.to_string())
        });
        (fast.join(), slow.join())
    });
    let fast = fast.map_err(|_| "the co-run rank 0 panicked")??;
    let slow = slow.map_err(|_| "the co-run rank 1 panicked")??;
    report(&fast, args.json, None);
    report(&slow, args.json, None);
    let (a, b) = (fast.state.train_ms, slow.state.train_ms);
    let aggregate = fast.state.throughput() + slow.state.throughput();
    let overlap = a.min(b) / a.max(b).max(1e-9);
    if args.json {
        println!(
            "{{\"run\":\"co-run ceiling\",\"samples_per_s\":{aggregate:.1},\"overlap\":{overlap:.3}}}"
        );
    } else {
        println!(
            "{:<28} {:>7.0} samples/s  (the two jobs' sum; they overlapped {:.0}% of the longer one's time)",
            "co-run ceiling",
            aggregate,
            100.0 * overlap
        );
    }
    Ok(aggregate)
}

/// One pass over the runs asked for; per skew mode and prefetch setting, its aggregate over (solo 0 + solo 1) and
/// its slow rank's non-compute share.
fn round(
    args: &Args,
    data: (&Arc<dyn Dataset>, &Arc<dyn Dataset>),
) -> Result<Vec<Option<SkewFigure>>, Box<dyn std::error::Error>> {
    let mut figures = vec![None; args.modes.len() * args.prefetch.len()];
    let auto = Prefetch::Auto;
    let has = |r: &str| args.runs.iter().any(|x| x == r);
    let mut solo = [None, None];
    let mut solo_compute = 0.0;
    if has("solo") || has("skew") {
        let fast = train(
            "solo rank0",
            1,
            (Policy::Sync, Backend::Collective),
            vec![1.0],
            auto,
            args,
            data,
        )?;
        report(&fast, args.json, Some(34_000.0));
        let name = format!("solo rank1 (x{})", args.slow);
        let slowdown = vec![args.slow];
        let slow =
            train(&name, 1, (Policy::Sync, Backend::Collective), slowdown, auto, args, data)?;
        report(&slow, args.json, None);
        solo = [Some(fast.state.throughput()), Some(slow.state.throughput())];
        solo_compute =
            [&fast, &slow].iter().filter_map(|r| compute_rates(&r.state).first().copied()).sum();
    }
    if has("equal") {
        for &(p, b) in &args.modes {
            for &pf in &args.prefetch {
                let name = format!("equal {}-{}{}", p.name(), b.name(), variant(pf, args));
                let run = train(&name, 2, (p, b), vec![1.0, 1.0], pf, args, data)?;
                let target = (p == Policy::Cadence).then_some(60_000.0);
                report(&run, args.json, target);
            }
        }
    }
    let mut corun = f64::NAN;
    if has("skew")
        && let [Some(a), Some(c)] = solo
    {
        corun = co_run(args, data, c / a)?;
    }
    if has("skew") {
        let target = match solo {
            [Some(a), Some(b)] => Some(0.9 * (a + b)),
            _ => None,
        };
        for (i, &(p, b)) in args.modes.iter().enumerate() {
            for (j, &pf) in args.prefetch.iter().enumerate() {
                let name =
                    format!("skew x{} {}-{}{}", args.slow, p.name(), b.name(), variant(pf, args));
                let run = train(&name, 2, (p, b), vec![1.0, args.slow], pf, args, data)?;
                report(&run, args.json, target);
                if let [Some(a), Some(c)] = solo {
                    let slow =
                        breakdowns(&run.state).get(1).map_or(f64::NAN, |t| t.non_compute_share());
                    figures[i * args.prefetch.len() + j] = Some(SkewFigure {
                        ratio: run.state.throughput() / (a + c),
                        corun_ratio: corun / (a + c),
                        of_corun: run.state.throughput() / corun,
                        slow_non_compute: slow,
                        efficiency: efficiency(&run.state),
                        contention: compute_rates(&run.state).iter().sum::<f64>()
                            / f64::max(solo_compute, 1e-9),
                        time_pct: breakdowns(&run.state).iter().map(shares_of).collect(),
                    });
                }
            }
        }
    }
    Ok(figures)
}

//! Throughput and accuracy of the DDP modes on MNIST with the reference MLP, on CPU ranks, at
//! several skews and rank counts, against the co-run ceiling.
//!
//! ```text
//! cargo run --release -p flodl-ddp --example throughput -- [--epochs 5] [--slow 2.5]
//!     [--skews 1.5,2.5,5,10] [--ranks 2,3,4] [--runs solo,equal,skew,mixed]
//!     [--modes cadence-collective,...,sync-collective] [--lr 0.05] [--lr-scale-ratio 0]
//!     [--max-anchor N] [--repeats 1] [--prefetch auto,2] [--json] [--hidden 256,128]
//!     [--samples N] [--speed-change 1:3@0.3-0.6]
//! ```
//!
//! A mode is `POLICY-BACKEND`, and on the host backend may add `/fF` (`--fragments F`) and
//! `/o` (`--overlap`, μ = 1): `cadence-host/f4/o` syncs the model in 4 fragments, the exchange
//! overlapped with the next window.
//!
//! Workload: MNIST (60k train, 10k test), MLP 784-256-128-10 (`--hidden 4096,4096`: the
//! 20M-parameter MLP, 80 MB of state per exchange), batch 64 per rank, SGD lr 0.05 momentum 0.9,
//! one thread per rank; `--samples N` trains on the first N training samples only.
//!
//! `skew` runs, for each rank count N of `--ranks` and each skew S of `--skews` (`--slow S`:
//! one skew), N ranks with rank 0 at full speed and the others spread evenly up to S
//! (`1, 1 + (S-1)/(N-1), ..., S`), under each mode, and compares the aggregate with
//! - the **solo sum**: each rank's factor trained alone (`solo`, once per factor and round);
//! - the **co-run ceiling**: the same N ranks training side by side in this process, each its
//!   own single-rank job that never averages, rank r on the share of the samples its solo speed
//!   covers in rank 0's time (so all end together); its aggregate is the sum of the jobs'
//!   throughputs. On a small machine the solo sum is no ceiling (a sleeping slow rank frees its
//!   core for the others), the co-run is: a mode's loss against the solo sum splits into
//!   contention (solo sum -> co-run) and flodl's own cost (co-run -> achieved).
//!
//! `equal` runs two equal ranks. `mixed` runs, for each rank count and mode, the ranks of the
//! first skew with `--speed-change` (default `1:3@0.3-0.6`: rank 1 three times slower from 30%
//! to 60% of the run, then back), prints the windows around each change and how many windows
//! ElChe took to absorb it (from the window the change falls in, counted 1, to the first whose
//! plan gives the rank a share within 25% of its share at the speeds in force; also counted from
//! the window the rank itself first ran at the new speed in, found from its own ms per batch).
//!
//! Each line reports samples/s over the training wall time, the test accuracy after the last
//! epoch and each rank's time breakdown (compute, data, reduce, exchange, waiting, evaluation,
//! checkpoint, other, as shares of its training wall); `--json` prints one JSON object per run
//! instead. `--repeats N` runs the whole set N times round-robin (so a drift of the machine's
//! load touches every run alike) and ends with, per skew run, the medians over the repeats of
//! the aggregate over the co-run ceiling and over the solo sum of the same repeat, of the
//! slowest rank's non-compute share, of the efficiency (the aggregate over the ranks' compute
//! rates in the run), of the contention (those rates over the solo runs' rates) and of each
//! rank's time shares, then one markdown table of them. `--prefetch auto,2` runs every skew
//! run once per prefetch setting (`auto`: none on CPU ranks, `off`, or a depth).

use std::sync::Arc;
use std::time::Duration;

use flodl_data::{Dataset, Mnist, Split, Subset, Verify};
use flodl_ddp::{
    Activity, Backend, Devices, ElCheKnobs, Mlp, MlpConfig, Optimizer, Policy, Prefetch,
    ReduceEvent, SpeedChange, TimeBreakdown, TrainedState, Trainer,
};

struct Args {
    epochs: usize,
    slow: f64,
    runs: Vec<String>,
    modes: Vec<Mode>,
    json: bool,
    lr: f32,
    lr_scale_ratio: f64,
    max_anchor: Option<usize>,
    repeats: usize,
    prefetch: Vec<Prefetch>,
    hidden: Vec<usize>,
    samples: Option<usize>,
    /// The skews to run (`--skews`; `--slow X` is one skew).
    skews: Vec<f64>,
    /// The rank counts to run the skews with (`--ranks`).
    ranks: Vec<usize>,
    /// The mixed run's speed changes (`--speed-change`).
    speed_change: Vec<SpeedChange>,
}

/// A mode of the runs: a policy on a backend, with the host backend's exchange options.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Mode {
    policy: Policy,
    backend: Backend,
    /// `--fragments` (1: the whole model at every reduce).
    fragments: usize,
    /// `--overlap` with μ = 1.
    overlap: bool,
}

impl Mode {
    /// A policy on a backend, whole and not overlapped.
    fn plain(policy: Policy, backend: Backend) -> Mode {
        Mode { policy, backend, fragments: 1, overlap: false }
    }

    /// The mode as `--modes` spells it.
    fn name(&self) -> String {
        let mut name = format!("{}-{}", self.policy.name(), self.backend.name());
        if self.fragments > 1 {
            name.push_str(&format!("/f{}", self.fragments));
        }
        if self.overlap {
            name.push_str("/o");
        }
        name
    }
}

fn parse_mode(s: &str) -> Option<Mode> {
    let mut parts = s.split('/');
    let (p, b) = parts.next()?.split_once('-')?;
    let mut mode = Mode::plain(p.parse().ok()?, b.parse().ok()?);
    for part in parts {
        match part {
            "o" => mode.overlap = true,
            f => mode.fragments = f.strip_prefix('f')?.parse().ok()?,
        }
    }
    Some(mode)
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        epochs: 5,
        slow: 2.5,
        runs: vec!["solo".into(), "equal".into(), "skew".into()],
        modes: vec![
            Mode::plain(Policy::Cadence, Backend::Collective),
            Mode::plain(Policy::Cadence, Backend::Host),
            Mode::plain(Policy::Async, Backend::Collective),
            Mode::plain(Policy::Async, Backend::Host),
        ],
        json: false,
        lr: 0.05,
        lr_scale_ratio: 0.0,
        max_anchor: None,
        repeats: 1,
        prefetch: vec![Prefetch::Auto],
        hidden: vec![256, 128],
        samples: None,
        skews: Vec::new(),
        ranks: vec![2],
        speed_change: Vec::new(),
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
            "--skews" => {
                args.skews = value()?
                    .split(',')
                    .map(|x| x.parse().map_err(|e| format!("--skews {x}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--ranks" => {
                args.ranks = value()?
                    .split(',')
                    .map(|x| match x.parse() {
                        Ok(n) if n >= 2 => Ok(n),
                        _ => Err(format!("--ranks {x}: 2 or more")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--speed-change" => {
                args.speed_change = value()?
                    .split(',')
                    .map(|x| x.parse().map_err(|e| format!("--speed-change: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--lr" => args.lr = value()?.parse().map_err(|e| format!("--lr: {e}"))?,
            "--lr-scale-ratio" => {
                args.lr_scale_ratio =
                    value()?.parse().map_err(|e| format!("--lr-scale-ratio: {e}"))?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.skews.is_empty() {
        args.skews = vec![args.slow];
    }
    if args.speed_change.is_empty() {
        args.speed_change = vec!["1:3@0.3-0.6".parse()?];
    }
    Ok(args)
}

/// One measured run.
struct Run {
    name: String,
    state: TrainedState,
    /// Its windows, in order (reduce events), when asked for.
    windows: Vec<ReduceEvent>,
}

/// How a run's ranks are set: their slowdowns and the speed changes on top of them.
struct Ranks<'a> {
    slowdown: Vec<f64>,
    changes: &'a [SpeedChange],
}

impl Ranks<'_> {
    /// `slowdown` as it is, no speed change.
    fn steady(slowdown: Vec<f64>) -> Ranks<'static> {
        Ranks { slowdown, changes: &[] }
    }
}

fn train(
    name: &str,
    mode: Mode,
    ranks: Ranks<'_>,
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
    let mut trainer = Trainer::new(Mlp::factory(mlp))
        .elche(knobs)
        .dataset(data.0.clone())
        .test_dataset(data.1.clone(), args.epochs)
        .batch_size(64)
        .epochs(args.epochs)
        .devices(Devices::Cpu(ranks.slowdown.len()))
        .policy(mode.policy)
        .backend(mode.backend)
        .fragments(mode.fragments)
        .learning_rate(args.lr)
        .lr_scale_ratio(args.lr_scale_ratio)
        .slowdown(ranks.slowdown)
        .speed_changes(ranks.changes.to_vec())
        .prefetch(prefetch)
        .stall_timeout(Duration::from_secs(300));
    if mode.overlap {
        trainer = trainer.overlap(1.0);
    }
    let mut handle = trainer.run()?;
    // The reduce events queue is bounded: read it while the run goes on.
    let mut windows = Vec::new();
    while !handle.is_finished() {
        windows.extend(handle.poll_reduce_events());
        std::thread::sleep(Duration::from_millis(20));
    }
    windows.extend(handle.poll_reduce_events());
    let state = handle.join()?;
    Ok(Run { name: name.to_owned(), state, windows })
}

/// `n` ranks at skew `skew`: rank 0 at full speed, the others spread evenly up to `skew`.
fn spread(n: usize, skew: f64) -> Vec<f64> {
    (0..n).map(|i| 1.0 + (skew - 1.0) * i as f64 / (n - 1).max(1) as f64).collect()
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

/// Where a skew run's figures go: its rank count, skew, mode and prefetch setting.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Key {
    ranks: usize,
    skew: f64,
    mode: Mode,
    prefetch: Prefetch,
}

impl Key {
    fn name(&self, args: &Args) -> String {
        format!(
            "{} ranks x{} {}{}",
            self.ranks,
            self.skew,
            self.mode.name(),
            variant(self.prefetch, args)
        )
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
    let mut all: Vec<(Key, SkewFigure)> = Vec::new();
    for repeat in 0..args.repeats {
        if args.repeats > 1 {
            println!("-- repeat {}/{}", repeat + 1, args.repeats);
        }
        all.extend(round(&args, data)?);
    }
    let mut keys: Vec<Key> = Vec::new();
    for (k, _) in &all {
        if !keys.contains(k) {
            keys.push(*k);
        }
    }
    let names: Vec<&str> = Activity::ALL.iter().map(|a| a.name()).collect();
    let mut table = Vec::new();
    for key in keys {
        let figures: Vec<&SkewFigure> =
            all.iter().filter(|(k, _)| *k == key).map(|(_, f)| f).collect();
        let med = |f: fn(&SkewFigure) -> f64| median(figures.iter().map(|x| f(x)).collect());
        let ratio = med(|f| f.ratio);
        let corun = med(|f| f.corun_ratio);
        let of_corun = med(|f| f.of_corun);
        let slow = med(|f| f.slow_non_compute);
        let efficiency = med(|f| f.efficiency);
        let contention = med(|f| f.contention);
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
            "{}: median over {} repeats: aggregate / solo sum {ratio:.3}, of the co-run ceiling {of_corun:.3}, co-run / solo sum {corun:.3}, slowest rank non-compute {:.1}%",
            key.name(&args),
            figures.len(),
            slow * 100.0
        );
        println!(
            "    efficiency {efficiency:.3} (aggregate / the ranks' compute rates in the run); compute rates side by side / alone {contention:.3}"
        );
        println!("    median time % [{}] per rank {:?}", names.join(" "), time);
        let at = |r: usize, a: Activity| {
            let i = Activity::ALL.iter().position(|x| *x == a).unwrap_or(0);
            time.get(r).map_or(f64::NAN, |t| t[i])
        };
        let last = ranks.saturating_sub(1);
        table.push(format!(
            "| {} | {}x | {} | {of_corun:.3} | {ratio:.3} | {corun:.3} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} / {:.1} |",
            key.ranks,
            key.skew,
            key.mode.name(),
            at(0, Activity::Waiting),
            at(0, Activity::Reduce),
            at(0, Activity::Data),
            at(last, Activity::Waiting),
            at(last, Activity::Reduce),
            at(last, Activity::Data),
        ));
    }
    if !table.is_empty() {
        println!(
            "\n| ranks | skew | mode | aggregate / co-run | aggregate / solo sum | co-run / solo sum | fast rank waiting / reduce / data % | slowest rank waiting / reduce / data % |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for row in table {
            println!("{row}");
        }
    }
    Ok(())
}

/// A skew run's figures: its aggregate over the solo sum, its slowest rank's non-compute
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
    /// The co-run ceiling's aggregate over the solo sum.
    corun_ratio: f64,
    /// The run's aggregate over the co-run ceiling's: its efficiency against what the machine
    /// can give these ranks side by side.
    of_corun: f64,
    time_pct: Vec<Vec<f64>>,
}

/// A run name's suffix naming its prefetch setting, when several are compared.
fn variant(prefetch: Prefetch, args: &Args) -> String {
    if args.prefetch.len() > 1 { format!(" prefetch {prefetch}") } else { String::new() }
}

/// The co-run ceiling: each rank (at its `slowdown`) trained as its own single-rank job, all
/// side by side and never averaging, rank `r` on `shares[r]` of the samples (its solo speed
/// over rank 0's, so all end about together). Returns the sum of the jobs' throughputs.
fn co_run(
    args: &Args,
    data: (&Arc<dyn Dataset>, &Arc<dyn Dataset>),
    slowdown: &[f64],
    shares: &[f64],
) -> Result<f64, Box<dyn std::error::Error>> {
    let mode = Mode::plain(Policy::Sync, Backend::Collective);
    let sets: Vec<(usize, Arc<dyn Dataset>)> = shares
        .iter()
        .map(|share| {
            let part = ((data.0.len() as f64 * share).round() as usize).clamp(64, data.0.len());
            (part, Arc::new(Subset::first(data.0.clone(), part)) as Arc<dyn Dataset>)
        })
        .collect();
    let runs: Vec<Result<Run, String>> = std::thread::scope(|scope| {
        let jobs: Vec<_> = sets
            .iter()
            .zip(slowdown)
            .enumerate()
            .map(|(r, ((part, set), &f))| {
                scope.spawn(move || {
                    let name = format!("co-run rank{r} (x{f:.2}, {part} samples)");
                    train(&name, mode, Ranks::steady(vec![f]), Prefetch::Auto, args, (set, data.1))
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap_or_else(|_| Err("a co-run job panicked".to_owned())))
            .collect()
    });
    let runs: Vec<Run> = runs.into_iter().collect::<Result<_, _>>()?;
    for run in &runs {
        report(run, args.json, None);
    }
    let aggregate: f64 = runs.iter().map(|r| r.state.throughput()).sum();
    let walls: Vec<f64> = runs.iter().map(|r| r.state.train_ms).collect();
    let overlap = walls.iter().copied().fold(f64::INFINITY, f64::min)
        / walls.iter().copied().fold(0.0, f64::max).max(1e-9);
    if args.json {
        println!(
            "{{\"run\":\"co-run ceiling\",\"samples_per_s\":{aggregate:.1},\"overlap\":{overlap:.3}}}"
        );
    } else {
        println!(
            "{:<28} {:>7.0} samples/s  (the jobs' sum; they all ran together {:.0}% of the longest one's time)",
            "co-run ceiling",
            aggregate,
            100.0 * overlap
        );
    }
    Ok(aggregate)
}

/// Solo throughputs by slowdown factor, measured once per round.
#[derive(Default)]
struct Solos(Vec<(f64, f64, f64)>);

impl Solos {
    /// The solo throughput and compute rate of one rank at `factor`, run now unless this round
    /// has it already.
    fn get(
        &mut self,
        factor: f64,
        args: &Args,
        data: (&Arc<dyn Dataset>, &Arc<dyn Dataset>),
    ) -> Result<(f64, f64), Box<dyn std::error::Error>> {
        if let Some(&(_, t, c)) = self.0.iter().find(|(f, _, _)| *f == factor) {
            return Ok((t, c));
        }
        let name = format!("solo (x{factor:.2})");
        let mode = Mode::plain(Policy::Sync, Backend::Collective);
        let run = train(&name, mode, Ranks::steady(vec![factor]), Prefetch::Auto, args, data)?;
        let target = (factor == 1.0).then_some(34_000.0);
        report(&run, args.json, target);
        let t = run.state.throughput();
        let c = compute_rates(&run.state).first().copied().unwrap_or(0.0);
        self.0.push((factor, t, c));
        Ok((t, c))
    }
}

/// One pass over the runs asked for; per skew run, its key and figures.
fn round(
    args: &Args,
    data: (&Arc<dyn Dataset>, &Arc<dyn Dataset>),
) -> Result<Vec<(Key, SkewFigure)>, Box<dyn std::error::Error>> {
    let mut figures = Vec::new();
    let has = |r: &str| args.runs.iter().any(|x| x == r);
    let mut solos = Solos::default();
    if has("solo") {
        for &skew in &args.skews {
            solos.get(1.0, args, data)?;
            solos.get(skew, args, data)?;
        }
    }
    if has("equal") {
        for &mode in &args.modes {
            for &pf in &args.prefetch {
                let name = format!("equal {}{}", mode.name(), variant(pf, args));
                let run = train(&name, mode, Ranks::steady(vec![1.0, 1.0]), pf, args, data)?;
                let target = (mode.policy == Policy::Cadence).then_some(60_000.0);
                report(&run, args.json, target);
            }
        }
    }
    if has("skew") {
        for &n in &args.ranks {
            for &skew in &args.skews {
                let slowdown = spread(n, skew);
                let solo: Vec<(f64, f64)> =
                    slowdown.iter().map(|&f| solos.get(f, args, data)).collect::<Result<_, _>>()?;
                let solo_sum: f64 = solo.iter().map(|s| s.0).sum();
                let solo_compute: f64 = solo.iter().map(|s| s.1).sum();
                let shares: Vec<f64> = solo.iter().map(|s| s.0 / solo[0].0).collect();
                println!("-- {n} ranks at x{skew}: slowdowns {slowdown:?}");
                let corun = co_run(args, data, &slowdown, &shares)?;
                for &mode in &args.modes {
                    for &prefetch in &args.prefetch {
                        let key = Key { ranks: n, skew, mode, prefetch };
                        let ranks = Ranks::steady(slowdown.clone());
                        let run = train(&key.name(args), mode, ranks, prefetch, args, data)?;
                        report(&run, args.json, Some(0.95 * corun));
                        let times = breakdowns(&run.state);
                        let figure = SkewFigure {
                            ratio: run.state.throughput() / solo_sum,
                            corun_ratio: corun / solo_sum,
                            of_corun: run.state.throughput() / corun,
                            slow_non_compute: times
                                .last()
                                .map_or(f64::NAN, |t| t.non_compute_share()),
                            efficiency: efficiency(&run.state),
                            contention: compute_rates(&run.state).iter().sum::<f64>()
                                / f64::max(solo_compute, 1e-9),
                            time_pct: times.iter().map(shares_of).collect(),
                        };
                        figures.push((key, figure));
                    }
                }
            }
        }
    }
    if has("mixed") {
        for &n in &args.ranks {
            let skew = args.skews[0];
            for &mode in &args.modes {
                let changes: Vec<String> =
                    args.speed_change.iter().map(|c| c.to_string()).collect();
                let name =
                    format!("mixed {n} ranks x{skew} {} [{}]", mode.name(), changes.join(","));
                let slowdown = spread(n, skew);
                let ranks = Ranks { slowdown: slowdown.clone(), changes: &args.speed_change };
                let run = train(&name, mode, ranks, Prefetch::Auto, args, data)?;
                report(&run, args.json, None);
                let batches = data.0.len() / 64;
                absorption(&run, &slowdown, &args.speed_change, args.epochs, batches);
            }
        }
    }
    Ok(figures)
}

/// A rank's share of a window's planned batches.
fn plan_share(w: &ReduceEvent, rank: usize) -> f64 {
    let total: usize = w.counts.iter().sum();
    w.counts.get(rank).map_or(f64::NAN, |&c| c as f64 / total.max(1) as f64)
}

/// Prints the mixed run's windows around each speed change and how many windows ElChe took
/// to absorb it: counted from the window the change falls in (1) to the first window whose
/// plan gives the changed rank a share within 25% of its share at the speeds now in force
/// (`(1/f_r) / sum(1/f)`), and from the window the rank itself first ran at the new speed in;
/// also the share ElChe settled at (the median over the second half of the phase the change
/// opens).
fn absorption(
    run: &Run,
    slowdown: &[f64],
    changes: &[SpeedChange],
    epochs: usize,
    batches_per_epoch: usize,
) {
    let total = (epochs * batches_per_epoch).max(1) as f64;
    // Each window's end as a fraction of the run's cohort steps.
    let mut done = 0usize;
    let ends: Vec<f64> = run
        .windows
        .iter()
        .map(|w| {
            done += w.steps.iter().sum::<usize>();
            done as f64 / total
        })
        .collect();
    let starts: Vec<f64> = std::iter::once(0.0).chain(ends.iter().copied()).collect();
    for c in changes {
        for (edge, phase_end) in [(c.from, c.until), (c.until, 1.0)] {
            let inverse: Vec<f64> = slowdown
                .iter()
                .enumerate()
                .map(|(r, f)| 1.0 / (f * SpeedChange::factor_at(changes, r, edge)))
                .collect();
            let target = inverse[c.rank] / inverse.iter().sum::<f64>();
            let settle_from = (edge + phase_end) / 2.0;
            let settled = median(
                (0..run.windows.len())
                    .filter(|&i| starts[i] >= settle_from && ends[i] <= phase_end)
                    .map(|i| plan_share(&run.windows[i], c.rank))
                    .collect(),
            );
            let Some(first) = ends.iter().position(|&e| e > edge) else { continue };
            let absorbed_at = (first..run.windows.len())
                .take_while(|&i| starts[i] < phase_end)
                .find(|&i| (plan_share(&run.windows[i], c.rank) / target - 1.0).abs() <= 0.25);
            let absorbed = absorbed_at.map(|i| i - first + 1);
            // The first window the rank ran at the new speed: its own reading (ms per batch,
            // from the event's walls) past the geometric middle of the old and the new speed,
            // against its median over the three windows before the change. Without walls (an
            // older run's events), by the rank's cohort step: a rank knows the cohort step of
            // its last reduce plus its own steps since, so it changes speed once that count
            // passes the edge (on the collective backend it may learn the step a window late).
            let ms_per_batch = |i: usize| {
                let w = &run.windows[i];
                let (wall, n) = (w.walls_ms.get(c.rank).copied()?, w.steps.get(c.rank).copied()?);
                (wall > 0.0 && n > 0).then(|| wall / n as f64)
            };
            let step = if edge == c.from { c.factor } else { 1.0 / c.factor };
            let before: Vec<f64> =
                (first.saturating_sub(3)..first).filter_map(ms_per_batch).collect();
            let by_reading = (!before.is_empty())
                .then(|| {
                    let base = median(before);
                    (first..run.windows.len()).find(|&i| {
                        ms_per_batch(i).is_some_and(|ms| {
                            let moved = (ms / base).ln() / step.ln();
                            moved > 0.5
                        })
                    })
                })
                .flatten();
            let felt = by_reading.unwrap_or_else(|| {
                (first..run.windows.len())
                    .find(|&i| {
                        let own = run.windows[i].steps.get(c.rank).copied().unwrap_or(0);
                        starts[i] + own as f64 / total > edge
                    })
                    .unwrap_or(first)
            });
            let shown: Vec<String> = (first.saturating_sub(1)..(first + 7).min(run.windows.len()))
                .map(|i| {
                    let w = &run.windows[i];
                    let ms = w.at_ms - if i == 0 { 0.0 } else { run.windows[i - 1].at_ms };
                    let own = ms_per_batch(i).map_or(String::new(), |b| format!(" {b:.2}ms/b"));
                    format!(
                        "#{} {:?} {:.0}ms {:.3}{own}",
                        w.round,
                        w.counts,
                        ms,
                        plan_share(w, c.rank)
                    )
                })
                .collect();
            let what = if edge == c.from { "slows" } else { "recovers" };
            println!(
                "    rank {} {what} at {edge} of the run (in window #{}, the rank from #{}{}): plan share target {target:.3}, settled at {settled:.3}; absorbed (within 25% of the target) in {} windows ({} from the rank's)",
                c.rank,
                run.windows.get(first).map_or(0, |w| w.round),
                run.windows.get(felt).map_or(0, |w| w.round),
                if by_reading.is_some() { ", by its reading" } else { ", by its step" },
                absorbed.map_or("no".to_owned(), |k| k.to_string()),
                absorbed_at.map_or("no".to_owned(), |i| (i + 1).saturating_sub(felt).to_string())
            );
            println!("      window plan wall share: {}", shown.join(" | "));
        }
    }
}

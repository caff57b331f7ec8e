//! `fdl train`: one training run from a resolved configuration, written to a run directory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flodl_data::mnist::{self, Mnist, Split, Verify};
use flodl_data::{Dataset, Subset};
use flodl_ddp::checkpoint::{LATEST, SaveInterval};
use flodl_ddp::control::schedule::Schedule;
use flodl_ddp::{
    Backend, Devices, FaultEvent, Mlp, MlpConfig, Optimizer, Policy, Prefetch, ReplicaContext,
    TrainedState, Trainer,
};
use flodl_tensor::Device;

use crate::args::TrainArgs;
use crate::config::{self, RankSpec, RunFlags, RunOptions, TrainConfig};
use crate::progress::{Display, Progress};
use crate::record::{Entry, Line, RankSummary, Summary};
use crate::report;
use crate::resume::{self, ResumePoint};
use crate::run_dir::{self, RunDir};

/// `fdl train`.
///
/// # Errors
/// Bad configuration, missing or corrupt data, an unwritable run directory, a failed run.
pub(crate) fn run(args: &TrainArgs) -> Result<()> {
    let run_flags = RunFlags {
        eval_every: args.eval_every,
        checkpoint_dir: args.checkpoint_dir.clone(),
        checkpoint_every: args.checkpoint_every,
        checkpoint_every_reduces: args.checkpoint_every_reduces,
        keep_checkpoints: args.keep_checkpoints,
        resume: args.resume.clone(),
        out: args.out.clone(),
        name: args.name.clone(),
    };
    let (cfg, opts) = config::resolve(&args.flags, &run_flags)?;
    if args.dry_run {
        let both = serde_json::json!({ "config": cfg, "options": opts });
        println!("{}", serde_json::to_string_pretty(&both)?);
        return Ok(());
    }
    let plan = Plan::new(&cfg)?;
    let resume = opts.resume.as_deref().map(ResumePoint::locate).transpose()?;
    if let Some(dir) = &opts.checkpoint_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create checkpoint directory {}", dir.display()))?;
    }
    let data = Data::load(&cfg)?;
    let (started_at, stamp) = run_dir::utc_now();
    let path = run_path(&opts, &stamp);
    let mut dir = RunDir::create(&path)?;
    let display = Display::detect(args.quiet);
    if display != Display::Silent {
        println!(
            "training {} on {} rank(s) [{}], {} / {}, {} epochs; run directory {}",
            describe_model(&cfg),
            plan.devices.len(),
            plan.device_names().join(", "),
            cfg.policy,
            cfg.backend,
            cfg.epochs,
            path.display()
        );
        if let Some(point) = &resume {
            println!(
                "resuming from {} (step {}, {} of {} epochs done)",
                point.bundle.display(),
                point.step,
                point.epochs_done,
                cfg.epochs
            );
        }
    }
    let outcome =
        match execute(&cfg, &plan, &data, &opts, resume.as_ref(), display, |l| dir.append(l)) {
            Ok(outcome) => outcome,
            Err(e) => {
                // A run refused before its first record leaves no empty run directory behind.
                dir.discard_if_empty();
                return Err(e);
            }
        };
    let name = path.file_name().map_or_else(|| "run".to_owned(), |n| n.to_string_lossy().into());
    let summary = summarise(name, started_at, &cfg, &opts, &plan, &outcome);
    dir.write_summary(&summary)?;
    let report_path = run_dir::write_report(dir.path(), &report::render(&summary, &outcome.lines))?;
    let restored = match summary.epochs_restored {
        0 => String::new(),
        n => format!(" ({n} restored from the checkpoint)"),
    };
    match summary.test {
        Some(t) => println!(
            "test accuracy {:.2}% (loss {:.4}) after {} epochs{restored}, {:.1} s of training, {} syncs",
            t.accuracy * 100.0,
            t.loss,
            summary.epochs_completed,
            summary.train_wall_s,
            summary.syncs
        ),
        None => println!(
            "trained {} epochs{restored} in {:.1} s, {} syncs",
            summary.epochs_completed, summary.train_wall_s, summary.syncs
        ),
    }
    if !summary.faults.is_empty() {
        println!("{} rank(s) died during the run (see summary.json)", summary.faults.len());
    }
    if let Some(ckpt) = &summary.checkpoint {
        println!("checkpoint: {}", ckpt.display());
    }
    println!("report: {}", report_path.display());
    Ok(())
}

/// The devices, policy and backend of a run, parsed and resolved.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// One device per rank.
    pub(crate) devices: Vec<Device>,
    /// When to average.
    pub(crate) policy: Policy,
    /// How to average.
    pub(crate) backend: Backend,
    /// Batch prefetching.
    pub(crate) prefetch: Prefetch,
}

impl Plan {
    /// Parses and checks the rank devices, policy and backend of `cfg`.
    ///
    /// # Errors
    /// An unknown device, policy or backend name; slowdown factors other than one per rank.
    pub(crate) fn new(cfg: &TrainConfig) -> Result<Self> {
        let devices = match &cfg.ranks {
            RankSpec::Auto if flodl_tensor::cuda_device_count() > 0 => Devices::AllGpus,
            RankSpec::Auto => Devices::Cpu(2),
            RankSpec::CpuRanks(n) => Devices::Cpu(*n),
            RankSpec::Devices(list) => Devices::List(
                list.iter()
                    .map(|d| {
                        d.parse::<Device>().map_err(|_| {
                            anyhow::anyhow!(
                                "devices: unknown device '{d}' (use cpu, cuda or cuda:N)"
                            )
                        })
                    })
                    .collect::<Result<_>>()?,
            ),
        };
        let devices = devices.resolve()?;
        let gpus = flodl_tensor::cuda_device_count();
        if let Some(missing) = devices.iter().find(|d| matches!(d, Device::Cuda(i) if *i >= gpus)) {
            let why = flodl_tensor::gpu_skip_reason()
                .unwrap_or_else(|| format!("{gpus} CUDA device(s) visible"));
            bail!("devices: {missing} is not available ({why})");
        }
        if !cfg.slowdown.is_empty() && cfg.slowdown.len() != devices.len() {
            bail!(
                "slowdown: {} factors given for {} rank(s) (give one per rank)",
                cfg.slowdown.len(),
                devices.len()
            );
        }
        if let Some(f) = cfg.fail_rank.iter().find(|f| f.rank >= devices.len()) {
            bail!("fail-rank: {f} names rank {}, but there are {} rank(s)", f.rank, devices.len());
        }
        // Checked now, built once the dataset size is known.
        schedule(&cfg.schedule, cfg.lr, 1, 0)?;
        let policy = cfg.policy.parse::<Policy>()?;
        let backend = cfg.backend.parse::<Backend>()?;
        let prefetch = prefetch(&cfg.prefetch)?;
        Ok(Self { devices, policy, backend, prefetch })
    }

    /// A plan with other devices, policy and backend (for `fdl bench`).
    pub(crate) fn with(&self, devices: Vec<Device>, policy: Policy, backend: Backend) -> Self {
        Self { devices, policy, backend, prefetch: self.prefetch }
    }

    /// Device names in rank order.
    pub(crate) fn device_names(&self) -> Vec<String> {
        self.devices.iter().map(Device::to_string).collect()
    }
}

/// The training and test sets.
#[derive(Clone)]
pub(crate) struct Data {
    /// Training samples.
    pub(crate) train: Arc<dyn Dataset>,
    /// Test samples.
    pub(crate) test: Arc<dyn Dataset>,
    /// Where they were read from.
    pub(crate) dir: PathBuf,
}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Data")
            .field("train", &self.train.len())
            .field("test", &self.test.len())
            .field("dir", &self.dir)
            .finish()
    }
}

impl Data {
    /// Loads MNIST (checking sha256 when the directory lists them) and applies the subsets.
    ///
    /// # Errors
    /// A missing or corrupt file (named in the message).
    pub(crate) fn load(cfg: &TrainConfig) -> Result<Self> {
        let dir = cfg.data.clone().unwrap_or_else(mnist::vendored_dir);
        if !dir.is_dir() {
            bail!("MNIST directory {} does not exist", dir.display());
        }
        let verify = if dir.join("SHA256SUMS").is_file() { Verify::Sha256 } else { Verify::Skip };
        let load = |split: Split| {
            Mnist::load(&dir, split, verify)
                .with_context(|| format!("cannot load MNIST from {}", dir.display()))
        };
        let train = load(Split::Train)?;
        let test = load(Split::Test)?;
        let train: Arc<dyn Dataset> = match cfg.train_subset {
            Some(n) => Arc::new(Subset::first(train, n)),
            None => Arc::new(train),
        };
        let test: Arc<dyn Dataset> = match cfg.test_subset {
            Some(n) => Arc::new(Subset::first(test, n)),
            None => Arc::new(test),
        };
        Ok(Self { train, test, dir })
    }
}

/// `auto`, `off` or a depth.
fn prefetch(text: &str) -> Result<Prefetch> {
    match text {
        "auto" => Ok(Prefetch::Auto),
        "off" => Ok(Prefetch::Off),
        n => n.parse::<usize>().map(Prefetch::Depth).map_err(|_| {
            anyhow::anyhow!("prefetch '{n}': expected auto, off or a depth (a number)")
        }),
    }
}

/// What a finished run produced.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The trained state (model and metrics) from the library.
    pub(crate) state: TrainedState,
    /// Every report, as written to `metrics.jsonl` (restored epochs first).
    pub(crate) lines: Vec<Line>,
    /// Epochs restored from the checkpoint the run resumed from.
    pub(crate) restored: usize,
    /// The bundle resumed from.
    pub(crate) resumed_from: Option<PathBuf>,
    /// Ranks declared dead, in order.
    pub(crate) faults: Vec<FaultEvent>,
}

/// Trains with `cfg` on `plan`'s ranks, showing progress and handing every report to `sink`.
///
/// # Errors
/// The library rejects the configuration or the run fails; `sink` fails.
pub(crate) fn execute(
    cfg: &TrainConfig,
    plan: &Plan,
    data: &Data,
    opts: &RunOptions,
    resume: Option<&ResumePoint>,
    display: Display,
    mut sink: impl FnMut(&Line) -> Result<()>,
) -> Result<Outcome> {
    let widths = widths(cfg);
    let mlp = MlpConfig::new(&widths, Optimizer::sgd(cfg.momentum as f32));
    // The runtime indexes schedules in cohort steps: every rank's batches together.
    let total_steps = (cfg.epochs * (data.train.len() / cfg.batch_size)) as u64;
    let build = Mlp::factory(mlp);
    let fails = cfg.fail_rank.clone();
    let factory = move |ctx: &ReplicaContext| {
        let at = crate::failure::fail_at(ctx.rank, &fails);
        Ok(flodl_ddp::FailingReplica::new(build(ctx)?, at, flodl_ddp::Failure::Error))
    };
    let mut trainer = Trainer::new(factory)
        .dataset(data.train.clone())
        .test_dataset(data.test.clone(), opts.eval_every)
        .devices(Devices::List(plan.devices.clone()))
        .policy(plan.policy)
        .backend(plan.backend)
        .epochs(cfg.epochs)
        .batch_size(cfg.batch_size)
        .learning_rate(cfg.lr as f32)
        .seed(cfg.seed)
        .slowdown(cfg.slowdown.clone())
        .prefetch(plan.prefetch);
    let per_epoch_steps = (data.train.len() / cfg.batch_size) as f64;
    let warmup = (cfg.warmup_epochs * per_epoch_steps).round() as u64;
    if let Some(schedule) = schedule(&cfg.schedule, cfg.lr, total_steps, warmup)? {
        trainer = trainer.schedule(schedule);
    }
    if let Some(secs) = cfg.watchdog_s {
        trainer = trainer.watchdog(Duration::from_secs_f64(secs));
    }
    if let Some(n) = cfg.max_failures {
        trainer = trainer.max_failures(n);
    }
    if let Some(dir) = &opts.checkpoint_dir {
        let interval = SaveInterval {
            every_epochs: std::num::NonZeroU64::new(opts.checkpoint_every as u64),
            every_reduces: opts
                .checkpoint_every_reduces
                .and_then(|n| std::num::NonZeroU64::new(n as u64)),
        };
        trainer = trainer
            .checkpoint_dir(dir.clone())
            .checkpoint_every(interval)
            .keep_checkpoints(opts.keep_checkpoints);
    }
    if let Some(point) = resume {
        trainer = trainer.resume(point.source());
    }
    let names = plan.device_names();
    let per_epoch = (data.train.len() / cfg.batch_size * cfg.batch_size) as u64;
    let mut progress = Progress::new(display, &names, per_epoch, cfg.epochs, cfg.batch_size);
    let start = Instant::now();
    let mut handle = trainer.run().map_err(|e| resume::explain(e, resume))?;
    let mut lines = Vec::new();
    let mut faults = Vec::new();
    let mut emit = |line: Line, lines: &mut Vec<Line>| -> Result<()> {
        sink(&line)?;
        lines.push(line);
        Ok(())
    };
    // Epochs the bundle's run completed come first (the handle streams only this run's), once
    // this run has shown it can go on: a bundle of another model is refused at the join, and a
    // refused run leaves no record.
    let restored = resume.map_or(&[][..], |p| p.epochs.as_slice());
    let mut pending = Some(restored);
    let restore =
        |pending: &mut Option<&[flodl_ddp::EpochMetrics]>, progress: &Progress| -> Vec<Line> {
            let ms = pending.take().unwrap_or_default();
            ms.iter()
                .map(|m| {
                    progress.restored_epoch(m);
                    Line { entry: Entry::Epoch(m.clone()), t_s: None, restored: true }
                })
                .collect()
        };
    let mut presses = crate::interrupt::presses();
    loop {
        let finished = handle.is_finished();
        let now = crate::interrupt::presses();
        if now > presses {
            presses = now;
            if now == 1 && opts.checkpoint_dir.is_some() {
                progress.alert(
                    "interrupted: stopping at the next reduce after saving a checkpoint \
                     (Ctrl-C again to abort)",
                );
                handle.stop_with_checkpoint();
            } else {
                progress.alert("interrupted: aborting the run");
                handle.abort();
            }
        }
        for fault in handle.poll_fault_events() {
            progress.alert(&fault_line(&fault, &names));
            faults.push(fault.clone());
            emit(Line { entry: Entry::Fault(fault), t_s: None, restored: false }, &mut lines)?;
        }
        for event in handle.poll_reduce_events() {
            progress.reduce(&event, start.elapsed());
            emit(Line { entry: Entry::Reduce(event), t_s: None, restored: false }, &mut lines)?;
        }
        let mut epochs = handle.poll_metrics();
        if epochs.is_empty() && !finished {
            epochs.extend(handle.next_metrics(Duration::from_millis(100)));
        }
        for m in epochs {
            for line in restore(&mut pending, &progress) {
                emit(line, &mut lines)?;
            }
            let elapsed = start.elapsed();
            progress.epoch(&m, elapsed);
            let line =
                Line { entry: Entry::Epoch(m), t_s: Some(elapsed.as_secs_f64()), restored: false };
            emit(line, &mut lines)?;
        }
        if finished {
            break;
        }
    }
    // A death reported between the last poll and the end.
    for fault in handle.poll_fault_events() {
        progress.alert(&fault_line(&fault, &names));
        faults.push(fault.clone());
        emit(Line { entry: Entry::Fault(fault), t_s: None, restored: false }, &mut lines)?;
    }
    let state = handle.join().map_err(|e| resume::explain(e, resume));
    let state = match state {
        Ok(state) => state,
        Err(e) => {
            progress.finish();
            return Err(e);
        }
    };
    for line in restore(&mut pending, &progress) {
        emit(line, &mut lines)?;
    }
    progress.finish();
    let count = restored.len();
    let resumed_from = resume.map(|p| p.bundle.clone());
    Ok(Outcome { state, lines, restored: count, resumed_from, faults })
}

/// One line about a rank's death: who, when, why, who is left.
fn fault_line(fault: &FaultEvent, devices: &[String]) -> String {
    let device = devices.get(fault.rank).map_or(String::new(), |d| format!(" ({d})"));
    let survivors: Vec<String> = fault.survivors.iter().map(ToString::to_string).collect();
    let cause = fault.cause.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
    format!(
        "rank {}{device} died at {:.1} s: {cause}; survivors: {}",
        fault.rank,
        fault.at_ms / 1000.0,
        if survivors.is_empty() {
            "none".to_owned()
        } else {
            format!("ranks {}", survivors.join(", "))
        }
    )
}

/// The LR schedule named `name` over `total` cohort steps, peaking at `lr`, the first `warmup`
/// of them a linear warmup; `None` = constant without warmup.
///
/// After the warmup: `cosine` from `lr` down to 0 at the end; `one-cycle` warms up to `lr`
/// (again), then anneals; `step` divides `lr` by 10 at half and at three quarters;
/// `exponential` decays by a constant factor per step down to `lr`/100 at the end.
fn schedule(name: &str, lr: f64, total: u64, warmup: u64) -> Result<Option<Schedule>> {
    let total = total.max(1);
    let warmup = warmup.min(total - 1);
    let rest = total - warmup;
    let schedule = match name {
        "constant" if warmup == 0 => return Ok(None),
        "constant" => Schedule::Constant { lr },
        "cosine" => Schedule::Cosine { lr, min_lr: 0.0, total: rest },
        "one-cycle" => Schedule::one_cycle(lr, rest),
        "step" => Schedule::MultiStep { lr, milestones: vec![rest / 2, rest * 3 / 4], gamma: 0.1 },
        "exponential" => Schedule::Exponential { lr, gamma: 0.01f64.powf(1.0 / rest as f64) },
        other => {
            bail!("schedule '{other}': expected constant, cosine, one-cycle, step or exponential")
        }
    };
    let schedule = if warmup > 0 { schedule.with_warmup(warmup) } else { schedule };
    schedule.validate()?;
    Ok(Some(schedule))
}

/// Layer widths: 784 inputs, the hidden widths, 10 classes.
fn widths(cfg: &TrainConfig) -> Vec<usize> {
    let mut w = vec![mnist::PIXELS];
    w.extend(&cfg.hidden);
    w.push(mnist::CLASSES);
    w
}

fn describe_model(cfg: &TrainConfig) -> String {
    let w: Vec<String> = widths(cfg).iter().map(ToString::to_string).collect();
    format!("MLP {}", w.join("-"))
}

/// `--out`, else `runs/<name>`, else `runs/<UTC timestamp>`.
fn run_path(opts: &RunOptions, stamp: &str) -> PathBuf {
    match (&opts.out, &opts.name) {
        (Some(out), _) => out.clone(),
        (None, Some(name)) => PathBuf::from("runs").join(name),
        (None, None) => PathBuf::from("runs").join(stamp),
    }
}

/// The run's summary from its outcome.
pub(crate) fn summarise(
    name: String,
    started_at: String,
    cfg: &TrainConfig,
    opts: &RunOptions,
    plan: &Plan,
    outcome: &Outcome,
) -> Summary {
    let state = &outcome.state;
    let names = plan.device_names();
    let train_ms = state.train_ms;
    let total = state.samples;
    let ranks = names
        .iter()
        .enumerate()
        .map(|(rank, device)| {
            let of_rank = state.epochs.iter().filter_map(|e| e.ranks.get(rank));
            let (samples, compute_ms) =
                of_rank.fold((0, 0.0), |(s, c), r| (s + r.samples, c + r.compute_ms));
            RankSummary {
                rank,
                device: device.clone(),
                samples: samples as u64,
                samples_per_s: if compute_ms > 0.0 {
                    samples as f64 * 1000.0 / compute_ms
                } else {
                    0.0
                },
                share: if total > 0 { samples as f64 / total as f64 } else { 0.0 },
                idle: (train_ms > 0.0).then(|| (1.0 - compute_ms / train_ms).clamp(0.0, 1.0)),
            }
        })
        .collect();
    let sync_ms: f64 = outcome
        .lines
        .iter()
        .filter_map(|l| match &l.entry {
            Entry::Reduce(r) => Some(r.sync_ms),
            Entry::Epoch(_) | Entry::Fault(_) => None,
        })
        .sum();
    let reduce_lines = outcome.lines.iter().filter(|l| matches!(l.entry, Entry::Reduce(_))).count();
    Summary {
        name,
        fdl_version: env!("CARGO_PKG_VERSION").to_owned(),
        started_at,
        config: cfg.clone(),
        options: opts.clone(),
        devices: names,
        epochs_completed: state.epochs.len(),
        train_wall_s: train_ms / 1000.0,
        run_wall_s: state.wall_ms / 1000.0,
        final_train_loss: state.epochs.last().map(|e| e.avg_loss),
        test: state.final_eval(),
        syncs: state.reduces,
        avg_sync_ms: (reduce_lines > 0).then(|| sync_ms / reduce_lines as f64),
        ranks,
        resumed_from: outcome.resumed_from.clone(),
        epochs_restored: outcome.restored,
        checkpoint: opts
            .checkpoint_dir
            .as_ref()
            .map(|d| d.join(format!("{LATEST}.{}", flodl_ddp::checkpoint::EXTENSION)))
            .filter(|p| p.is_file()),
        faults: outcome.faults.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_path_prefers_out_then_name_then_stamp() {
        let mut opts = RunOptions {
            eval_every: 1,
            checkpoint_dir: None,
            checkpoint_every: 1,
            checkpoint_every_reduces: None,
            keep_checkpoints: 3,
            resume: None,
            out: None,
            name: None,
        };
        assert_eq!(run_path(&opts, "20260101-000000"), PathBuf::from("runs/20260101-000000"));
        opts.name = Some("a".into());
        assert_eq!(run_path(&opts, "x"), PathBuf::from("runs/a"));
        opts.out = Some("/tmp/o".into());
        assert_eq!(run_path(&opts, "x"), PathBuf::from("/tmp/o"));
    }

    #[test]
    fn schedules_peak_at_lr_and_end_where_named() -> Result<()> {
        let total = 1000;
        assert!(schedule("constant", 0.05, total, 0)?.is_none());
        let cases = [
            ("cosine", 0, 0.05, 0.0),
            ("step", 0, 0.05, 0.0005),
            ("one-cycle", 0, 0.05 / 25.0, 0.0),
            ("exponential", 0, 0.05, 0.0005),
            ("constant", 100, 0.05 / 100.0, 0.05),
            ("cosine", 100, 0.05 / 100.0, 0.0),
            ("exponential", 250, 0.05 / 250.0, 0.0005),
        ];
        for (name, warmup, first, last) in cases {
            let s = schedule(name, 0.05, total, warmup)?
                .ok_or_else(|| anyhow::anyhow!("{name}: none"))?;
            let peak = (0..=total).map(|t| s.lr(t)).fold(0.0, f64::max);
            assert!((peak - 0.05).abs() < 1e-9, "{name}: peak {peak}");
            assert!((s.lr(0) - first).abs() < 1e-9, "{name}: first {}", s.lr(0));
            assert!((s.lr(total) - last).abs() < 1e-6, "{name}: last {}", s.lr(total));
        }
        assert!(schedule("zigzag", 0.05, total, 0).is_err());
        Ok(())
    }

    #[test]
    fn plan_rejects_unknown_names_and_slowdowns_not_one_per_rank() {
        let base = TrainConfig { ranks: RankSpec::CpuRanks(2), ..TrainConfig::defaults() };
        let cases = [
            (TrainConfig { policy: "often".into(), ..base.clone() }, "policy"),
            (TrainConfig { backend: "pigeon".into(), ..base.clone() }, "backend"),
            (TrainConfig { ranks: RankSpec::Devices(vec!["tpu".into()]), ..base.clone() }, "tpu"),
            (TrainConfig { slowdown: vec![1.0, 2.0, 3.0], ..base.clone() }, "slowdown"),
            (TrainConfig { slowdown: vec![2.0], ..base.clone() }, "slowdown"),
            (TrainConfig { schedule: "zigzag".into(), ..base.clone() }, "schedule"),
            (
                TrainConfig { ranks: RankSpec::Devices(vec!["cuda:99".into()]), ..base.clone() },
                "cuda:99",
            ),
        ];
        for (cfg, key) in cases {
            let err = Plan::new(&cfg).err().map(|e| format!("{e:#}"));
            assert!(err.as_deref().is_some_and(|e| e.contains(key)), "{key}: {err:?}");
        }
        assert!(Plan::new(&base).is_ok());
    }
}

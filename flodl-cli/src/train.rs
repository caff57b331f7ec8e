//! `fdl train`: one training run from a resolved configuration, written to a run directory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use flodl_data::mnist::{self, Mnist, Split, Verify};
use flodl_data::{Access, RecordFile};
use flodl_data::{Dataset, Subset};
use flodl_ddp::{
    CacheTally, Devices, EvalMetrics, FaultEvent, ReplicaContext, RunSpec, TimeBreakdown,
    TrainedState, Trainer,
};
use flodl_tensor::{Device, Stream};

use crate::args::{RunFlags, TrainArgs};
use crate::config::{self, TrainConfig};
use crate::dashboard::{Dashboard, Ending, Meta};
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
    let (cfg, opts) = config::resolve(&args.flags, &args.run)?;
    let cluster = crate::launch::place(&args.cluster, &cfg)?;
    // A rank started after a takeover joins the controller of the new term at its address.
    let joined = match &cluster {
        Some(c) => crate::takeover::joined_term(cfg.run.standby.unwrap_or_default(), c.world())?,
        None => None,
    };
    let cluster = match (cluster, joined) {
        (Some(c), Some((_, host, addr))) => Some(c.follow(addr, host)),
        (cluster, _) => cluster,
    };
    let devices = match &cluster {
        Some(c) => crate::launch::cluster_devices(&cfg, c.world())?,
        None => cfg.devices()?,
    };
    // In a cluster job only the controller's process (rank 0's, or its own in an MPI job)
    // saves and resumes: the ranks restore from what it sends them, and may not see its files.
    let kind = devices.first().copied().unwrap_or(Device::Cpu);
    let backend = cfg.run.backend.unwrap_or_default();
    let controller = cluster.as_ref().is_none_or(|c| c.hosts_controller(backend, kind));
    let resume = match &opts.resume {
        Some(path) if controller => Some(ResumePoint::locate(path)?),
        _ => None,
    };
    if let Some(dir) = &cfg.run.checkpoint_dir
        && !args.dry_run
        && controller
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create checkpoint directory {}", dir.display()))?;
    }
    let data = args.model.data(&cfg)?;
    let mut trainer = trainer(&cfg, &devices, &data, resume.as_ref())?;
    if let Some(c) = &cluster {
        trainer = crate::launch::cluster_trainer(trainer, &devices, c.clone());
    }
    if let Some((term, _, _)) = joined {
        trainer = trainer.term(term);
    }
    let spec = trainer.spec().map_err(|e| explain(e, &cfg, resume.as_ref()))?;
    if let Some(c) = cluster.as_ref().filter(|c| !c.hosts_controller(spec.backend, kind))
        && !args.dry_run
    {
        let rank =
            crate::takeover::Rank { args, cfg: &cfg, opts: &opts, devices: &devices, data: &data };
        return rank.run(trainer, &spec, c);
    }
    if args.dry_run {
        let all = serde_json::json!({
            "config": cfg,
            "options": opts,
            "spec": spec,
            "spec_hash": spec.hash()?.to_string(),
        });
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    let (_, stamp) = run_dir::utc_now();
    let path = run_path(&opts, &stamp);
    let run = Controller { args, cfg: &cfg, opts: &opts, data: &data };
    run.run(trainer, spec, resume.as_ref(), path)
}

/// What the process hosting a run's controller (rank 0's, the only one of an in-process run, or
/// a standby's that took over) runs it with.
pub(crate) struct Controller<'a> {
    pub(crate) args: &'a TrainArgs,
    pub(crate) cfg: &'a TrainConfig,
    pub(crate) opts: &'a RunFlags,
    pub(crate) data: &'a Data,
}

impl Controller<'_> {
    /// Runs `trainer` (of `spec`, resuming from `resume`) into the run directory `path`:
    /// progress, metrics, the summary and the report.
    ///
    /// # Errors
    /// The run fails or its directory cannot be written.
    pub(crate) fn run(
        &self,
        trainer: Trainer,
        spec: RunSpec,
        resume: Option<&ResumePoint>,
        path: PathBuf,
    ) -> Result<()> {
        let Controller { args, cfg, opts, data } = *self;
        let opts = opts.clone();
        let (started_at, _) = run_dir::utc_now();
        let name =
            path.file_name().map_or_else(|| "run".to_owned(), |n| n.to_string_lossy().into());
        let names: Vec<String> = spec.devices.iter().map(Device::to_string).collect();
        // Bound before the run directory exists, so an address in use leaves nothing behind.
        let dashboard = match opts.dashboard {
            Some(bind) => {
                let meta = Meta {
                    name: name.clone(),
                    started_at: started_at.clone(),
                    devices: names.clone(),
                    policy: spec.policy,
                    backend: spec.backend,
                    epochs: spec.epochs,
                    batch_size: spec.batch_size,
                    resumed_from: resume.map(|p| p.bundle.clone()),
                    epochs_restored: resume.map_or(0, |p| p.epochs.len()),
                };
                Some(Dashboard::start(bind, opts.dashboard_token.as_deref(), meta)?)
            }
            None => None,
        };
        let mut dir = RunDir::create(&path)?;
        let display = Display::detect(args.quiet);
        if display != Display::Silent {
            println!(
                "training {} on {} rank(s) [{}], {} / {}, {} epochs; run directory {}",
                data.model.describe(&widths(cfg)),
                spec.world(),
                names.join(", "),
                spec.policy,
                spec.backend,
                spec.epochs,
                path.display()
            );
            if let Some(line) = engine_line(&spec) {
                println!("{line}");
            }
            if let Some(point) = resume {
                println!(
                    "resuming from {} (step {}, {} of {} epochs done)",
                    point.bundle.display(),
                    point.step,
                    point.epochs_done,
                    spec.epochs
                );
                for (path, why) in &point.skipped {
                    println!("  skipped {}: {why}", path.display());
                }
                if let Some(changes) = point.changes(&names) {
                    println!("{changes}");
                }
            }
        }
        if let Some(d) = &dashboard {
            // Printed even with --quiet: the URL may carry the run's token.
            println!("dashboard: {}", d.url());
        }
        let trainer = trainer.ledger(dir.path().join(flodl_ddp::ledger::FILE));
        let feed = dashboard.as_ref().map(Dashboard::feed);
        let sink = |l: &Line| {
            dir.append(l)?;
            if let Some(feed) = &feed {
                feed.record(l);
            }
            Ok(())
        };
        let outcome = match execute(trainer, spec, resume, display, sink) {
            Ok(outcome) => outcome,
            Err(e) => {
                if let Some(d) = dashboard {
                    d.close(Ending::Failed(crate::one_line(&e)));
                }
                // A run refused before its first record leaves no empty run directory behind.
                dir.discard_if_empty();
                return Err(e);
            }
        };
        if let Some(d) = dashboard {
            d.close(Ending::Completed);
        }
        let mut summary = summarise(name, started_at, cfg, &opts, &outcome);
        if let Some(n) = cfg.local.train_eval {
            summary.train_eval = Some(train_eval(cfg, data, &outcome, n)?);
        }
        dir.write_summary(&summary)?;
        let report_path =
            run_dir::write_report(dir.path(), &report::render(&summary, &outcome.lines))?;
        let restored = match summary.epochs_restored {
            0 => String::new(),
            n => format!(" ({n} restored from the checkpoint)"),
        };
        match summary.test {
            Some(t) if data.model.gpt().is_some() => println!(
                "validation loss {:.4} nats/byte ({:.4} bits/byte), next-byte accuracy {:.2}%, after {} epochs{restored}, {:.1} s of training, {} syncs",
                t.loss,
                t.loss / std::f64::consts::LN_2,
                t.accuracy * 100.0,
                summary.epochs_completed,
                summary.train_wall_s,
                summary.syncs
            ),
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
        if !summary.rejoins.is_empty() {
            println!("{} rank(s) joined again during the run", summary.rejoins.len());
        }
        if let Some(ckpt) = &summary.checkpoint {
            println!("checkpoint: {}", ckpt.display());
        }
        println!("report: {}", report_path.display());
        Ok(())
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
    /// The model they feed (`--model`).
    pub(crate) model: crate::model::Model,
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
        let dir = cfg.local.data.clone().unwrap_or_else(mnist::vendored_dir);
        if !dir.is_dir() {
            // A moved binary or a registry-installed crate does not find the vendored files.
            let hint = match cfg.local.data {
                Some(_) => String::new(),
                None => format!(
                    " (set {} or pass --data to name the folder holding the MNIST idx files)",
                    mnist::DIR_ENV
                ),
            };
            bail!("MNIST directory {} does not exist{hint}", dir.display());
        }
        let verify = if dir.join("SHA256SUMS").is_file() { Verify::Sha256 } else { Verify::Skip };
        let load = |split: Split| {
            Mnist::load(&dir, split, verify)
                .with_context(|| format!("cannot load MNIST from {}", dir.display()))
        };
        let test = load(Split::Test)?;
        let train: Arc<dyn Dataset> = match &cfg.local.records {
            Some(path) => {
                let access =
                    if cfg.local.direct == Some(true) { Access::Direct } else { Access::Buffered };
                let file = RecordFile::open(path, access)
                    .with_context(|| format!("cannot open the record file {}", path.display()))?;
                ensure!(
                    file.layout() == test.layout(),
                    "{} holds samples of another layout than MNIST's",
                    path.display()
                );
                Arc::new(file)
            }
            None => Arc::new(load(Split::Train)?),
        };
        let train: Arc<dyn Dataset> = match cfg.local.train_subset {
            Some(n) => Arc::new(Subset::first(train, n)),
            None => train,
        };
        let test: Arc<dyn Dataset> = match cfg.local.test_subset {
            Some(n) => Arc::new(Subset::first(test, n)),
            None => Arc::new(test),
        };
        Ok(Self { train, test, dir, model: crate::model::Model::Mlp })
    }
}

/// The model `outcome` returned, evaluated on the first `n` training samples of `data` (all of
/// them when there are fewer) on the CPU: a replica built as the ranks build theirs, loaded
/// with the trained state, in batches of the run's batch size.
///
/// # Errors
/// The replica cannot be built or loaded, or its model does not evaluate.
fn train_eval(cfg: &TrainConfig, data: &Data, outcome: &Outcome, n: usize) -> Result<EvalMetrics> {
    let stream = Stream::cpu();
    let spec = &outcome.spec;
    let ctx = ReplicaContext::alone(stream.clone(), spec.batch_size, spec.seed);
    let mut replica = data.model.factory(cfg, &widths(cfg))(&ctx)
        .context("cannot build a replica to evaluate the returned model")?;
    outcome.state.load_into(replica.as_mut(), &stream)?;
    let samples = Subset::first(data.train.clone(), n);
    flodl_ddp::evaluate(replica.as_mut(), &samples, spec.batch_size, &stream)?
        .context("the model does not evaluate, so --train-eval has nothing to report")
}

/// What a finished run produced.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// What the run's ranks agreed on.
    pub(crate) spec: RunSpec,
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

/// The trainer of a run of `cfg` on `devices` (resolved by [`TrainConfig::devices`]): the
/// reference MLP on `data`, the run's settings, the bundle to resume from.
///
/// # Errors
/// A setting `Trainer::settings` refuses, naming its flag (every other rule is checked by
/// `Trainer::spec`).
pub(crate) fn trainer(
    cfg: &TrainConfig,
    devices: &[Device],
    data: &Data,
    resume: Option<&ResumePoint>,
) -> Result<Trainer> {
    let size = data.model.size(cfg, &widths(cfg));
    let build = data.model.factory(cfg, &widths(cfg));
    let fails = cfg.fail_rank().to_vec();
    let factory = move |ctx: &ReplicaContext| {
        let at = crate::failure::fail_at(ctx.rank, &fails);
        Ok(flodl_ddp::FailingReplica::new(build(ctx)?, at, flodl_ddp::Failure::Error))
    };
    let mut trainer = Trainer::new(factory)
        .dataset(data.train.clone())
        .test_dataset(data.test.clone(), 1)
        .devices(Devices::List(devices.to_vec()))
        .model_size(size)
        .settings(&cfg.run)
        .map_err(|e| config::explain(e, &cfg.run))?;
    if let Some(t) = data.model.stall_timeout() {
        trainer = trainer.stall_timeout(t);
    }
    if let Some(knobs) = data.model.elche() {
        // The model's knobs, under the target a flag or file gave.
        let overhead_target = cfg.run.overhead_target.unwrap_or(knobs.overhead_target);
        trainer = trainer.elche(flodl_ddp::ElCheKnobs { overhead_target, ..knobs });
    }
    if let Some(point) = resume {
        trainer = trainer.resume(point.source());
    }
    Ok(trainer)
}

/// A library error as `fdl` says it: a configuration error names the flag ([`config::explain`]),
/// a refused or failed resume the bundle ([`resume::explain`]).
pub(crate) fn explain(
    error: flodl_ddp::Error,
    cfg: &TrainConfig,
    resume: Option<&ResumePoint>,
) -> anyhow::Error {
    match error {
        e @ flodl_ddp::Error::Invalid(_) => config::explain(e, &cfg.run),
        e => resume::explain(e, resume),
    }
}

/// Runs `trainer` (whose spec is `spec`), showing progress and handing every report to `sink`.
///
/// # Errors
/// The library rejects the configuration or the run fails; `sink` fails.
pub(crate) fn execute(
    trainer: Trainer,
    spec: RunSpec,
    resume: Option<&ResumePoint>,
    display: Display,
    mut sink: impl FnMut(&Line) -> Result<()>,
) -> Result<Outcome> {
    let names: Vec<String> = spec.devices.iter().map(Device::to_string).collect();
    let saves = spec.checkpoint.is_some();
    let per_epoch = (spec.batches_per_epoch() * spec.batch_size) as u64;
    let mut progress = Progress::new(display, &names, per_epoch, spec.epochs, spec.batch_size);
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
    let mut signals = crate::interrupt::received();
    loop {
        let finished = handle.is_finished();
        let now = crate::interrupt::received();
        if now > signals
            && let Some(signal) = crate::interrupt::first()
        {
            signals = now;
            if now == 1 && saves {
                progress.alert(&crate::interrupt::stopping_line(signal));
                handle.stop_with_checkpoint();
            } else {
                progress.alert(&crate::interrupt::aborting_line(signal));
                handle.abort();
            }
        }
        for fault in handle.poll_fault_events() {
            progress.alert(&fault_line(&fault, &names));
            faults.push(fault.clone());
            emit(Line { entry: Entry::Fault(fault), t_s: None, restored: false }, &mut lines)?;
        }
        for rejoin in handle.poll_rejoin_events() {
            progress.alert(&format!(
                "rank {} rejoined at reduce {} (members now {:?})",
                rejoin.rank, rejoin.reduce, rejoin.members
            ));
            emit(Line { entry: Entry::Rejoin(rejoin), t_s: None, restored: false }, &mut lines)?;
        }
        for event in handle.poll_reduce_events() {
            progress.reduce(&event, start.elapsed());
            emit(Line { entry: Entry::Reduce(event), t_s: None, restored: false }, &mut lines)?;
        }
        for guard in handle.poll_guard_events() {
            emit(Line { entry: Entry::Guard(guard), t_s: None, restored: false }, &mut lines)?;
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
    Ok(Outcome { spec, state, lines, restored: count, resumed_from, faults })
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

/// Layer widths: 784 inputs, the hidden widths, 10 classes.
fn widths(cfg: &TrainConfig) -> Vec<usize> {
    let mut w = vec![mnist::PIXELS];
    w.extend(cfg.hidden());
    w.push(mnist::CLASSES);
    w
}

/// `--out`, else `runs/<name>`, else `runs/<UTC timestamp>`.
pub(crate) fn run_path(opts: &RunFlags, stamp: &str) -> PathBuf {
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
    opts: &RunFlags,
    outcome: &Outcome,
) -> Summary {
    let state = &outcome.state;
    let names: Vec<String> = outcome.spec.devices.iter().map(Device::to_string).collect();
    let train_ms = state.train_ms;
    let total = state.samples;
    let wire = crate::record::WireTotals::of(&outcome.lines, names.len());
    let ranks = names
        .iter()
        .enumerate()
        .map(|(rank, device)| {
            let of_rank = state.epochs.iter().filter_map(|e| e.ranks.get(rank));
            let (mut samples, mut compute_ms, mut time) = (0, 0.0, TimeBreakdown::default());
            let mut cache: Option<CacheTally> = None;
            for r in of_rank {
                samples += r.samples;
                compute_ms += r.compute_ms;
                time.merge(&r.time);
                if let Some(c) = &r.cache {
                    cache.get_or_insert_with(CacheTally::default).merge(c);
                }
            }
            let idle = if time.wall_ms() > 0.0 {
                Some(time.non_compute_share())
            } else {
                (train_ms > 0.0).then(|| (1.0 - compute_ms / train_ms).clamp(0.0, 1.0))
            };
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
                idle,
                time,
                data_starve_ms: time.data_ms,
                hit_ratio: cache.map(|c| c.hit_ratio()),
                wire: wire.get(rank).copied().flatten(),
            }
        })
        .collect::<Vec<RankSummary>>();
    let held_back = flodl_ddp::straggler(&ranks.iter().map(|r| r.time).collect::<Vec<_>>());
    let sync_ms: f64 = outcome
        .lines
        .iter()
        .filter_map(|l| match &l.entry {
            Entry::Reduce(r) => Some(r.sync_ms),
            Entry::Epoch(_) | Entry::Fault(_) | Entry::Rejoin(_) | Entry::Guard(_) => None,
        })
        .sum();
    let reduce_lines = outcome.lines.iter().filter(|l| matches!(l.entry, Entry::Reduce(_))).count();
    Summary {
        name,
        fdl_version: env!("CARGO_PKG_VERSION").to_owned(),
        started_at,
        config: serde_json::to_value(cfg).unwrap_or_default(),
        options: opts.clone(),
        devices: names,
        epochs_completed: state.epochs.len(),
        train_wall_s: train_ms / 1000.0,
        run_wall_s: state.wall_ms / 1000.0,
        final_train_loss: state.epochs.last().map(|e| e.avg_loss),
        test: state.final_eval(),
        train_eval: None,
        syncs: state.reduces,
        avg_sync_ms: (reduce_lines > 0).then(|| sync_ms / reduce_lines as f64),
        ranks,
        held_back,
        resumed_from: outcome.resumed_from.clone(),
        epochs_restored: outcome.restored,
        checkpoint: cfg
            .run
            .checkpoint_dir
            .as_ref()
            .and_then(|d| flodl_ddp::checkpoint::locate(d).ok())
            .map(|found| found.path),
        faults: outcome.faults.clone(),
        rejoins: outcome.state.rejoins.clone(),
        spec: Some(outcome.spec.clone()),
    }
}

/// The line that says what carries the collective backend, when it is not the obvious one:
/// the host all-reduce of a world mixing GPU and CPU ranks, or NCCL across processes.
fn engine_line(spec: &flodl_ddp::RunSpec) -> Option<String> {
    match spec.collective_engine()? {
        flodl_ddp::CollectiveEngine::Host { mixed: true } => Some(
            "collective: the host all-reduce, since the world mixes GPU and CPU ranks (NCCL \
             needs every rank on a GPU of its own)"
                .into(),
        ),
        flodl_ddp::CollectiveEngine::Nccl if spec.placement == flodl_ddp::Placement::Processes => {
            Some(
                "collective: NCCL across processes, each group's id made by its lowest rank and \
                 relayed by the controller"
                    .into(),
            )
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A world mixing GPU and CPU ranks says it falls back to the host all-reduce; CPU-only and
    /// host-backend worlds say nothing.
    #[test]
    fn mixed_worlds_say_they_use_the_host_collective() -> Result<()> {
        let train = Mnist::load(mnist::vendored_dir(), Split::Train, Verify::Skip)?;
        let data: Arc<dyn Dataset> = Arc::new(Subset::first(train, 64));
        let spec = |devices: Vec<Device>, backend: flodl_ddp::Backend| {
            flodl_ddp::Trainer::new(flodl_ddp::Mlp::factory(flodl_ddp::MlpConfig::new(
                &[784, 10],
                flodl_ddp::Optimizer::sgd(0.0),
            )))
            .dataset(data.clone())
            .batch_size(8)
            .devices(flodl_ddp::Devices::List(devices))
            .backend(backend)
            .spec()
        };
        let collective = flodl_ddp::Backend::Collective;
        let mixed = engine_line(&spec(vec![Device::Cuda(0), Device::Cpu], collective)?);
        if !mixed.as_deref().is_some_and(|l| l.contains("mixes GPU and CPU ranks")) {
            bail!("mixed world: {mixed:?}");
        }
        let cpu = engine_line(&spec(vec![Device::Cpu; 2], collective)?);
        let host =
            engine_line(&spec(vec![Device::Cuda(0), Device::Cpu], flodl_ddp::Backend::Host)?);
        if cpu.is_some() || host.is_some() {
            bail!("cpu {cpu:?}, host backend {host:?}");
        }
        Ok(())
    }

    #[test]
    fn run_path_prefers_out_then_name_then_stamp() {
        let mut opts = RunFlags::default();
        assert_eq!(run_path(&opts, "20260101-000000"), PathBuf::from("runs/20260101-000000"));
        opts.name = Some("a".into());
        assert_eq!(run_path(&opts, "x"), PathBuf::from("runs/a"));
        opts.out = Some("/tmp/o".into());
        assert_eq!(run_path(&opts, "x"), PathBuf::from("/tmp/o"));
    }
}

//! One training run of the tch transformer under flodl, and what it reached.

use std::sync::Arc;

use anyhow::Context as _;
use flodl_data::{Dataset, Shakespeare, Subset, TextSplit, unigram_entropy};
use flodl_ddp::control::outer::OuterKind;
use flodl_ddp::control::schedule::Schedule;
use flodl_ddp::{
    Devices, ElCheKnobs, FailingReplica, Failure, FaultEvent, Policy, ReplicaContext, SampleAudit,
    Trainer,
};
use flodl_tch::{TchReplica, seeded};
use tch::nn::{self, VarStore};

use crate::config::{GPT_ANCHOR, GptConfig};
use crate::model::Gpt;

/// A run's settings.
#[derive(Clone)]
pub struct Settings {
    /// The model's sizes.
    pub config: GptConfig,
    /// Ranks (each one CPU thread of libtorch).
    pub ranks: usize,
    /// Per-rank slowdown factors (1 = full speed).
    pub slowdown: Vec<f64>,
    /// When to average.
    pub policy: Policy,
    /// Passes over the training windows.
    pub epochs: usize,
    /// Windows per batch.
    pub batch_size: usize,
    /// Training windows: the first N of the training plays (all when `None`).
    pub train_windows: Option<usize>,
    /// Validation windows: the first N of the held-out plays (all when `None`).
    pub valid_windows: Option<usize>,
    /// AdamW's peak learning rate (warmup, then a cosine to a tenth of it).
    pub lr: f64,
    /// Warmup steps (cohort steps: batches of all ranks together).
    pub warmup: u64,
    /// AdamW's weight decay.
    pub weight_decay: f64,
    /// Global gradient norm clip.
    pub max_grad_norm: f64,
    /// Initial weights and epoch permutations.
    pub seed: u64,
    /// A rank that fails at its n-th training step (a death drill), if any.
    pub fail: Option<(usize, usize)>,
    /// Called with every rank's picks of every epoch.
    pub audit: Option<SampleAudit>,
    /// Batches of the slowest rank per averaging window, fixed (ElChe's own cadence when `None`;
    /// [`GPT_ANCHOR`] by default).
    pub anchor: Option<usize>,
    /// The outer step on each average (the plain average when `None`).
    pub outer: Option<OuterKind>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("config", &self.config)
            .field("ranks", &self.ranks)
            .field("slowdown", &self.slowdown)
            .field("policy", &self.policy)
            .field("epochs", &self.epochs)
            .field("batch_size", &self.batch_size)
            .field("train_windows", &self.train_windows)
            .field("fail", &self.fail)
            .field("anchor", &self.anchor)
            .field("outer", &self.outer)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The tiny model on two ranks, the second 2.5× slower, Cadence.
    pub fn tiny() -> Settings {
        Settings {
            config: GptConfig::of(crate::config::Size::Tiny),
            ranks: 2,
            slowdown: vec![1.0, 2.5],
            policy: Policy::Cadence,
            epochs: 1,
            batch_size: 16,
            train_windows: None,
            valid_windows: Some(512),
            lr: 3e-3,
            warmup: 20,
            weight_decay: 0.1,
            max_grad_norm: 1.0,
            seed: 28,
            fail: None,
            audit: None,
            anchor: Some(GPT_ANCHOR),
            outer: None,
        }
    }
}

/// What a run reached.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Training windows per epoch.
    pub train_windows: usize,
    /// Validation loss of the averaged model after the last epoch, nats per byte.
    pub valid_loss: f64,
    /// The validation loss after each epoch, nats per byte.
    pub valid_losses: Vec<f64>,
    /// When each evaluated epoch was complete, seconds since the first batch went out
    /// (evaluations of earlier epochs included, as a user's clock sees them): with
    /// `valid_losses`, the curve that gives the wall time to a target loss.
    pub valid_at_s: Vec<f64>,
    /// The unigram entropy of the validation targets: the loss floor of a model that predicts
    /// byte frequencies alone, nats per byte.
    pub unigram_bound: f64,
    /// Training wall time, seconds.
    pub train_s: f64,
    /// Training tokens (predicted bytes) per second, all ranks together.
    pub tokens_per_s: f64,
    /// Reduces performed.
    pub reduces: u64,
    /// Per rank: training tokens per second of its own compute, and its time in ms by part
    /// (compute, data, reduce with the adapter's export and import, waiting).
    pub ranks: Vec<RankFigures>,
    /// The ranks that died, and who survived them.
    pub faults: Vec<FaultEvent>,
}

/// One rank's throughput and where its time went, over the whole run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RankFigures {
    /// Training tokens per second of the rank's own compute.
    pub tokens_per_s: f64,
    /// Milliseconds computing (forward, backward, optimizer).
    pub compute_ms: f64,
    /// Milliseconds waiting for data.
    pub data_ms: f64,
    /// Milliseconds in reduces (the adapter's export and import included).
    pub reduce_ms: f64,
    /// Milliseconds waiting for the other ranks.
    pub waiting_ms: f64,
}

/// A run's data: the training windows, the validation windows, and the unigram entropy of the
/// validation targets (nats per byte).
#[derive(Clone)]
pub struct Data {
    /// The training windows.
    pub train: Arc<dyn Dataset>,
    /// The validation windows.
    pub valid: Arc<dyn Dataset>,
    /// The loss floor of a model predicting byte frequencies alone, on `valid`'s targets.
    pub unigram_bound: f64,
}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Data")
            .field("train", &self.train.len())
            .field("valid", &self.valid.len())
            .field("unigram_bound", &self.unigram_bound)
            .finish()
    }
}

/// The data of `settings`.
///
/// # Errors
/// The corpus's (missing or corrupt files).
pub fn data(settings: &Settings) -> anyhow::Result<Data> {
    let context = settings.config.context;
    let train = Shakespeare::vendored(TextSplit::Train).context("the training plays")?;
    let valid = Shakespeare::vendored(TextSplit::Valid).context("the held-out plays")?;
    let train_windows = train.windows(context)?;
    let valid_windows = valid.windows(context)?;
    let n_valid = settings.valid_windows.unwrap_or(valid_windows.len()).min(valid_windows.len());
    // The bytes the evaluation predicts: 1..=n·context of the held-out text.
    let bound = unigram_entropy(&valid.bytes()[1..=n_valid * context]).nats;
    let train: Arc<dyn Dataset> = match settings.train_windows {
        Some(n) => Arc::new(Subset::first(train_windows, n)),
        None => Arc::new(train_windows),
    };
    let valid: Arc<dyn Dataset> = Arc::new(Subset::first(valid_windows, n_valid));
    Ok(Data { train, valid, unigram_bound: bound })
}

/// The replica of one rank: the model seeded by the run, AdamW, clipping; one libtorch thread.
///
/// # Errors
/// The adapter's.
pub fn replica(
    settings: &Settings,
    ctx: &ReplicaContext,
) -> flodl_ddp::Result<FailingReplica<TchReplica<Gpt>>> {
    tch::set_num_threads(1);
    let vs = VarStore::new(tch::Device::Cpu);
    let model = seeded(ctx.seed, || Gpt::new(&vs.root(), settings.config));
    let adamw = nn::AdamW { beta2: 0.95, wd: settings.weight_decay, ..Default::default() };
    let inner = TchReplica::new(vs, model, adamw, Some(settings.max_grad_norm), &ctx.stream)?;
    let at = settings.fail.filter(|(rank, _)| *rank == ctx.rank).map(|(_, at)| at);
    Ok(FailingReplica::new(inner, at, Failure::Error))
}

/// Trains the transformer under flodl with `settings`, evaluating after every epoch.
///
/// # Errors
/// The data's or the run's.
pub fn train(settings: &Settings) -> anyhow::Result<Outcome> {
    let Data { train, valid, unigram_bound } = data(settings)?;
    let train_windows = train.len();
    let total = (settings.epochs * (train_windows / settings.batch_size.max(1))) as u64;
    let schedule =
        Schedule::Cosine { lr: settings.lr, min_lr: settings.lr / 10.0, total: total.max(1) }
            .with_warmup(settings.warmup);
    let factory_settings = settings.clone();
    let mut trainer = Trainer::new(move |ctx: &ReplicaContext| replica(&factory_settings, ctx))
        .dataset(train)
        .test_dataset(valid, 1)
        .batch_size(settings.batch_size)
        .epochs(settings.epochs)
        .devices(Devices::Cpu(settings.ranks))
        .policy(settings.policy)
        .schedule(schedule)
        .slowdown(settings.slowdown.clone())
        .stall_timeout(settings.config.stall_timeout())
        .seed(settings.seed);
    if let Some(audit) = &settings.audit {
        trainer = trainer.sample_audit(audit.clone());
    }
    if let Some(anchor) = settings.anchor {
        trainer = trainer.elche(ElCheKnobs { anchor, max_anchor: anchor, ..Default::default() });
    }
    if let Some(outer) = settings.outer {
        trainer = trainer.outer(outer);
    }
    let state = trainer.run()?.join()?;
    let evaluated = state.epochs.iter().filter(|e| e.eval.is_some());
    let valid_losses: Vec<f64> =
        evaluated.clone().filter_map(|e| e.eval.as_ref()).map(|v| v.loss).collect();
    // `at_ms` counts from the run's start (replicas built, threads spawned); the last epoch
    // completes where training ends, so their difference from `train_ms` is that start-up.
    let startup_ms = state.epochs.last().map_or(0.0, |e| (e.at_ms - state.train_ms).max(0.0));
    let valid_at_s: Vec<f64> = evaluated.map(|e| (e.at_ms - startup_ms) / 1000.0).collect();
    let valid_loss = *valid_losses.last().context("the run made no evaluation")?;
    Ok(Outcome {
        train_windows,
        valid_loss,
        valid_losses,
        valid_at_s,
        unigram_bound,
        train_s: state.train_ms / 1000.0,
        tokens_per_s: state.throughput() * settings.config.context as f64,
        reduces: state.reduces,
        ranks: (0..settings.ranks)
            .map(|rank| {
                let mut f = RankFigures::default();
                let mut samples = 0;
                for r in state.epochs.iter().flat_map(|e| &e.ranks).filter(|r| r.rank == rank) {
                    samples += r.samples;
                    f.compute_ms += r.compute_ms;
                    f.data_ms += r.time.data_ms;
                    f.reduce_ms += r.time.reduce_ms;
                    f.waiting_ms += r.time.waiting_ms;
                }
                f.tokens_per_s =
                    (samples * settings.config.context) as f64 * 1e3 / f.compute_ms.max(1e-9);
                f
            })
            .collect(),
        faults: state.faults.clone(),
    })
}

//! The resolved training configuration: built-in defaults, then a TOML file, then flags.
//!
//! The flags and the file's keys are one declaration ([`TrainFlags`] and [`RunFlags`], parsed
//! by clap from the command line and by serde from the file into the same types: policy,
//! backend and schedule as their enums); [`resolve`] merges them over the defaults into a
//! [`TrainConfig`], which `train` turns into a `flodl_ddp::Trainer` (and so a `RunSpec`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use flodl_ddp::control::schedule::Schedule;
use flodl_ddp::{Backend, ConfigError, Devices, Field, Policy, Prefetch, Staging};
use flodl_tensor::Device;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::args::{RunFlags, TrainFlags};
use crate::dashboard::Bind;
use crate::failure::FailAt;

/// Default hidden widths of the reference MLP (784-256-128-10).
const DEFAULT_HIDDEN: [usize; 2] = [256, 128];

/// The LR schedules `fdl` offers, by name; [`ScheduleKind::build`] makes the library's
/// [`Schedule`] once the run's length in steps is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ScheduleKind {
    /// The rate throughout.
    Constant,
    /// A cosine from the rate down to 0 at the end.
    Cosine,
    /// Warm up to the rate (again), then anneal.
    OneCycle,
    /// The rate divided by 10 at half and at three quarters.
    Step,
    /// A constant factor per step, down to 1% at the end.
    Exponential,
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScheduleKind::Constant => "constant",
            ScheduleKind::Cosine => "cosine",
            ScheduleKind::OneCycle => "one-cycle",
            ScheduleKind::Step => "step",
            ScheduleKind::Exponential => "exponential",
        })
    }
}

impl ScheduleKind {
    /// Every schedule, in the order `--help` names them.
    const ALL: [ScheduleKind; 5] = [
        ScheduleKind::Constant,
        ScheduleKind::Cosine,
        ScheduleKind::OneCycle,
        ScheduleKind::Step,
        ScheduleKind::Exponential,
    ];
}

impl std::str::FromStr for ScheduleKind {
    type Err = String;

    /// The name as `Display` writes it.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let name = s.trim().to_ascii_lowercase();
        ScheduleKind::ALL.into_iter().find(|k| k.to_string() == name).ok_or_else(|| {
            format!("schedule '{s}': expected constant, cosine, one-cycle, step or exponential")
        })
    }
}

impl ScheduleKind {
    /// The schedule over `total` cohort steps, peaking at `lr`, the first `warmup` of them a
    /// linear warmup; `None` = constant without warmup.
    ///
    /// The library checks the schedule (`RunSpec::check`, naming `--lr` or `--schedule`).
    pub(crate) fn build(self, lr: f64, total: u64, warmup: u64) -> Option<Schedule> {
        let total = total.max(1);
        let warmup = warmup.min(total - 1);
        let rest = total - warmup;
        let schedule = match self {
            ScheduleKind::Constant if warmup == 0 => return None,
            ScheduleKind::Constant => Schedule::Constant { lr },
            ScheduleKind::Cosine => Schedule::Cosine { lr, min_lr: 0.0, total: rest },
            ScheduleKind::OneCycle => Schedule::one_cycle(lr, rest),
            ScheduleKind::Step => {
                Schedule::MultiStep { lr, milestones: vec![rest / 2, rest * 3 / 4], gamma: 0.1 }
            }
            ScheduleKind::Exponential => {
                Schedule::Exponential { lr, gamma: 0.01f64.powf(1.0 / rest as f64) }
            }
        };
        Some(if warmup > 0 { schedule.with_warmup(warmup) } else { schedule })
    }
}

/// Which devices the ranks run on, before device discovery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RankSpec {
    /// Every GPU when there is one, else two CPU ranks.
    Auto,
    /// This many CPU ranks.
    CpuRanks(usize),
    /// These devices, one rank each (`cpu`, `cuda:0`, ...).
    Devices(#[serde(with = "text::seq")] Vec<Device>),
}

/// Everything a training run needs, after defaults, file and flags are merged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TrainConfig {
    /// Rank devices.
    pub(crate) ranks: RankSpec,
    /// When to average.
    pub(crate) policy: Policy,
    /// How to average.
    pub(crate) backend: Backend,
    /// Epochs to train.
    pub(crate) epochs: usize,
    /// Per-rank batch size.
    pub(crate) batch_size: usize,
    /// Base learning rate.
    pub(crate) lr: f64,
    /// SGD momentum.
    pub(crate) momentum: f64,
    /// LR schedule.
    pub(crate) schedule: ScheduleKind,
    /// Linear LR warmup, in epochs.
    #[serde(default)]
    pub(crate) warmup_epochs: f64,
    /// Seed of weights and data order.
    pub(crate) seed: u64,
    /// Per-rank slowdown factors (empty: none).
    pub(crate) slowdown: Vec<f64>,
    /// MLP hidden widths.
    pub(crate) hidden: Vec<usize>,
    /// MNIST directory (default: the vendored copy, see `flodl_data::mnist::vendored_dir`).
    pub(crate) data: Option<PathBuf>,
    /// Use only the first N training images.
    pub(crate) train_subset: Option<usize>,
    /// Use only the first N test images.
    pub(crate) test_subset: Option<usize>,
    /// Batch prefetching: `auto`, `off` or a depth.
    #[serde(default, with = "text::one")]
    pub(crate) prefetch: Prefetch,
    /// Staging: `auto`, `off` or a budget per rank.
    #[serde(default, with = "text::one")]
    pub(crate) staging: Staging,
    /// A record file to train on instead of MNIST's training images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) records: Option<PathBuf>,
    /// Read the record file around the page cache.
    #[serde(default)]
    pub(crate) direct: bool,
    /// Watchdog deadline in seconds (the library's default when unset).
    #[serde(default)]
    pub(crate) watchdog_s: Option<f64>,
    /// Ranks that may die before the run stops (no limit when unset).
    #[serde(default)]
    pub(crate) max_failures: Option<usize>,
    /// Emulated device failures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) fail_rank: Vec<FailAt>,
    /// How model states travel between a cluster job's processes.
    #[serde(default)]
    pub(crate) wire: flodl_ddp::WireFormat,
}

/// The `train`-only part of the configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunOptions {
    /// Evaluate every N epochs (the last epoch always).
    pub(crate) eval_every: usize,
    /// Checkpoint directory.
    pub(crate) checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every N epochs (0: only at the end).
    pub(crate) checkpoint_every: usize,
    /// Also checkpoint every N reduces.
    #[serde(default)]
    pub(crate) checkpoint_every_reduces: Option<usize>,
    /// Step bundles kept in the checkpoint directory.
    #[serde(default = "default_keep")]
    pub(crate) keep_checkpoints: usize,
    /// Checkpoint (file or directory) to resume from.
    pub(crate) resume: Option<PathBuf>,
    /// Run directory, when given explicitly.
    pub(crate) out: Option<PathBuf>,
    /// Run name.
    pub(crate) name: Option<String>,
    /// Where the live dashboard listens, when the run serves one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) dashboard: Option<Bind>,
    /// The dashboard's token, when given (a secret: never written to the run directory).
    #[serde(skip)]
    pub(crate) dashboard_token: Option<String>,
}

impl Default for RunOptions {
    /// Evaluation after every epoch; no checkpoints, resume, run directory or dashboard.
    fn default() -> Self {
        RunOptions {
            eval_every: 1,
            checkpoint_dir: None,
            checkpoint_every: 1,
            checkpoint_every_reduces: None,
            keep_checkpoints: DEFAULT_KEEP,
            resume: None,
            out: None,
            name: None,
            dashboard: None,
            dashboard_token: None,
        }
    }
}

fn default_keep() -> usize {
    DEFAULT_KEEP
}

/// Step bundles a checkpoint directory keeps unless told otherwise.
const DEFAULT_KEEP: usize = 3;

impl TrainConfig {
    /// The built-in defaults, tuned on 2 CPU cores: a cosine decay from lr 0.05 over 10 epochs
    /// ends at ~98.2% in 5-25 s of training (a constant lr 0.05 ends on a noisy epoch too often).
    pub(crate) fn defaults() -> Self {
        Self {
            ranks: RankSpec::Auto,
            policy: Policy::Cadence,
            backend: Backend::Collective,
            epochs: 10,
            batch_size: 64,
            lr: 0.05,
            momentum: 0.9,
            schedule: ScheduleKind::Cosine,
            warmup_epochs: 0.0,
            seed: 42,
            slowdown: Vec::new(),
            hidden: DEFAULT_HIDDEN.to_vec(),
            data: None,
            train_subset: None,
            test_subset: None,
            prefetch: Prefetch::Auto,
            staging: Staging::Auto,
            records: None,
            direct: false,
            watchdog_s: None,
            max_failures: None,
            fail_rank: Vec::new(),
            wire: flodl_ddp::WireFormat::F32,
        }
    }

    /// One device per rank, discovered and checked against the other per-rank keys.
    ///
    /// # Errors
    /// No rank; a GPU that is not there; a failure for a rank that does not exist.
    pub(crate) fn devices(&self) -> Result<Vec<Device>> {
        let devices = match &self.ranks {
            RankSpec::Auto if flodl_tensor::cuda_device_count() > 0 => Devices::AllGpus,
            RankSpec::Auto => Devices::Cpu(2),
            RankSpec::CpuRanks(n) => Devices::Cpu(*n),
            RankSpec::Devices(list) => Devices::List(list.clone()),
        };
        let devices = devices.resolve().map_err(|e| explain(e, &self.ranks))?;
        let gpus = flodl_tensor::cuda_device_count();
        if let Some(missing) = devices.iter().find(|d| matches!(d, Device::Cuda(i) if *i >= gpus)) {
            let why = flodl_tensor::gpu_skip_reason()
                .unwrap_or_else(|| format!("{gpus} CUDA device(s) visible"));
            bail!("devices: {missing} is not available ({why})");
        }
        if let Some(f) = self.fail_rank.iter().find(|f| f.rank >= devices.len()) {
            bail!("fail-rank: {f} names rank {}, but there are {} rank(s)", f.rank, devices.len());
        }
        Ok(devices)
    }
}

impl TrainFlags {
    /// These flags, each falling back to `file`'s value for the same key.
    fn or(self, file: TrainFlags) -> TrainFlags {
        TrainFlags {
            config: self.config,
            ranks: self.ranks.or(file.ranks),
            devices: self.devices.or(file.devices),
            policy: self.policy.or(file.policy),
            backend: self.backend.or(file.backend),
            epochs: self.epochs.or(file.epochs),
            batch_size: self.batch_size.or(file.batch_size),
            lr: self.lr.or(file.lr),
            momentum: self.momentum.or(file.momentum),
            schedule: self.schedule.or(file.schedule),
            warmup_epochs: self.warmup_epochs.or(file.warmup_epochs),
            seed: self.seed.or(file.seed),
            slowdown: self.slowdown.or(file.slowdown),
            hidden: self.hidden.or(file.hidden),
            data: self.data.or(file.data),
            train_subset: self.train_subset.or(file.train_subset),
            test_subset: self.test_subset.or(file.test_subset),
            prefetch: self.prefetch.or(file.prefetch),
            staging: self.staging.or(file.staging),
            records: self.records.or(file.records),
            direct: self.direct.or(file.direct),
            watchdog: self.watchdog.or(file.watchdog),
            max_failures: self.max_failures.or(file.max_failures),
            fail_rank: self.fail_rank.or(file.fail_rank),
            wire: self.wire.or(file.wire),
        }
    }
}

impl RunFlags {
    /// These flags, each falling back to `file`'s value for the same key.
    fn or(self, file: RunFlags) -> RunFlags {
        RunFlags {
            eval_every: self.eval_every.or(file.eval_every),
            checkpoint_dir: self.checkpoint_dir.or(file.checkpoint_dir),
            checkpoint_every: self.checkpoint_every.or(file.checkpoint_every),
            checkpoint_every_reduces: self
                .checkpoint_every_reduces
                .or(file.checkpoint_every_reduces),
            keep_checkpoints: self.keep_checkpoints.or(file.keep_checkpoints),
            resume: self.resume.or(file.resume),
            out: self.out.or(file.out),
            name: self.name.or(file.name),
            dashboard: self.dashboard.or(file.dashboard),
            dashboard_token: self.dashboard_token.or(file.dashboard_token),
        }
    }
}

/// Merges defaults, the `--config` file (if any) and the flags, and checks the values.
///
/// # Errors
/// The config file cannot be read or parsed, or a value is out of range.
pub(crate) fn resolve(flags: &TrainFlags, run: &RunFlags) -> Result<(TrainConfig, RunOptions)> {
    let (mut file, file_run) = match &flags.config {
        Some(path) => read_file(path)?,
        None => (TrainFlags::default(), RunFlags::default()),
    };
    // A flag beats a file key of the other kind; both from one source is ambiguous (clap
    // refuses both flags).
    if flags.ranks.is_some() || flags.devices.is_some() {
        (file.ranks, file.devices) = (None, None);
    }
    ensure!(
        file.ranks.is_none() || file.devices.is_none(),
        "ranks and devices cannot be used together"
    );
    let f = flags.clone().or(file);
    let d = TrainConfig::defaults();
    let cfg = TrainConfig {
        ranks: match (f.ranks, f.devices) {
            (Some(n), _) => RankSpec::CpuRanks(n),
            (None, Some(list)) => RankSpec::Devices(list),
            (None, None) => RankSpec::Auto,
        },
        policy: f.policy.unwrap_or(d.policy),
        backend: f.backend.unwrap_or(d.backend),
        epochs: f.epochs.unwrap_or(d.epochs),
        batch_size: f.batch_size.unwrap_or(d.batch_size),
        lr: f.lr.unwrap_or(d.lr),
        momentum: f.momentum.unwrap_or(d.momentum),
        schedule: f.schedule.unwrap_or(d.schedule),
        warmup_epochs: f.warmup_epochs.unwrap_or(d.warmup_epochs),
        seed: f.seed.unwrap_or(d.seed),
        slowdown: f.slowdown.unwrap_or(d.slowdown),
        hidden: f.hidden.unwrap_or(d.hidden),
        data: f.data,
        train_subset: f.train_subset,
        test_subset: f.test_subset,
        prefetch: f.prefetch.unwrap_or(d.prefetch),
        staging: f.staging.unwrap_or(d.staging),
        records: f.records,
        direct: f.direct.unwrap_or(false),
        watchdog_s: f.watchdog,
        max_failures: f.max_failures,
        fail_rank: f.fail_rank.unwrap_or_default(),
        wire: f.wire.unwrap_or_default(),
    };

    let r = run.clone().or(file_run);
    if r.checkpoint_dir.is_none() {
        let given = [
            ("checkpoint-every", r.checkpoint_every.is_some()),
            ("checkpoint-every-reduces", r.checkpoint_every_reduces.is_some()),
            ("keep-checkpoints", r.keep_checkpoints.is_some()),
        ];
        if let Some((key, _)) = given.iter().find(|(_, g)| *g) {
            bail!("{key} needs checkpoint-dir");
        }
    }
    let opts =
        RunOptions {
            eval_every: r.eval_every.unwrap_or(1),
            // Reduces alone turn the per-epoch default off.
            checkpoint_every: r
                .checkpoint_every
                .unwrap_or(if r.checkpoint_every_reduces.is_some() { 0 } else { 1 }),
            checkpoint_every_reduces: r.checkpoint_every_reduces,
            keep_checkpoints: r.keep_checkpoints.unwrap_or(DEFAULT_KEEP),
            checkpoint_dir: r.checkpoint_dir,
            resume: r.resume,
            out: r.out,
            name: r.name,
            dashboard: r.dashboard,
            dashboard_token: r.dashboard_token,
        };
    check(&cfg, &opts)?;
    Ok((cfg, opts))
}

/// The keys a `--config` file may set: the long names of the flags it mirrors.
fn file_keys() -> Vec<String> {
    use clap::Args as _;
    let cmd = RunFlags::augment_args(TrainFlags::augment_args(clap::Command::new("fdl")));
    cmd.get_arguments()
        .filter_map(clap::Arg::get_long)
        .filter(|key| *key != "config")
        .map(str::to_owned)
        .collect()
}

/// Reads a `--config` file into the flags' two groups.
fn read_file(path: &Path) -> Result<(TrainFlags, RunFlags)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let table: toml::Table = parse(&text, path)?;
    let known = file_keys();
    if let Some(key) = table.keys().find(|k| !known.contains(k)) {
        let line = text
            .lines()
            .position(|l| {
                l.trim_start()
                    .strip_prefix(key.as_str())
                    .is_some_and(|r| r.trim_start().starts_with('=') || r.starts_with(']'))
            })
            .map_or(1, |i| i + 1);
        bail!("config file {} line {line}: unknown key `{key}`", path.display());
    }
    Ok((parse(&text, path)?, parse(&text, path)?))
}

/// Parses the TOML `text` of the file at `path`, naming the line of an error.
fn parse<T: DeserializeOwned>(text: &str, path: &Path) -> Result<T> {
    toml::from_str(text).map_err(|e| {
        // toml's message spans several lines (a snippet of the file); keep the first.
        let msg = e.message().to_owned();
        let line = e.span().map(|s| text[..s.start.min(text.len())].lines().count().max(1));
        match line {
            Some(line) => anyhow::anyhow!("config file {} line {line}: {msg}", path.display()),
            None => anyhow::anyhow!("config file {}: {msg}", path.display()),
        }
    })
}

/// The rules on what only `fdl` has (the MLP, the data, the run directory); every option of
/// the run itself is checked once, by the library (`RunSpec::check`, see [`explain`]).
fn check(cfg: &TrainConfig, opts: &RunOptions) -> Result<()> {
    ensure!(
        cfg.momentum.is_finite() && (0.0..1.0).contains(&cfg.momentum),
        "momentum must be in [0, 1), got {}",
        cfg.momentum
    );
    ensure!(
        cfg.warmup_epochs.is_finite()
            && cfg.warmup_epochs >= 0.0
            && cfg.warmup_epochs < cfg.epochs.max(1) as f64,
        "warmup-epochs must be at least 0 and less than epochs ({}), got {}",
        cfg.epochs,
        cfg.warmup_epochs
    );
    ensure!(!cfg.hidden.is_empty(), "hidden: give at least one layer width");
    ensure!(cfg.hidden.iter().all(|&h| h > 0), "hidden: layer widths must be positive");
    ensure!(cfg.train_subset != Some(0), "train-subset must be at least 1");
    ensure!(cfg.test_subset != Some(0), "test-subset must be at least 1");
    ensure!(
        opts.checkpoint_every_reduces != Some(0),
        "checkpoint-every-reduces must be at least 1"
    );
    ensure!(
        opts.dashboard.is_some() || opts.dashboard_token.is_none(),
        "dashboard-token needs dashboard"
    );
    if let Some(name) = &opts.name {
        ensure!(
            !name.is_empty() && !name.contains(['/', '\\']) && name != "." && name != "..",
            "name '{name}' must be a plain directory name"
        );
    }
    Ok(())
}

/// The flag (and `--config` key) that sets `field`, given how the ranks were named; `None` for
/// an option `fdl` has no flag for.
pub(crate) fn flag(field: Field, ranks: &RankSpec) -> Option<&'static str> {
    Some(match field {
        Field::Devices if matches!(ranks, RankSpec::CpuRanks(_)) => "ranks",
        Field::Devices => "devices",
        Field::BatchSize => "batch-size",
        Field::Epochs => "epochs",
        Field::EvalEvery => "eval-every",
        Field::Backend => "backend",
        Field::LearningRate => "lr",
        Field::Schedule => "schedule",
        Field::Slowdown => "slowdown",
        Field::Watchdog => "watchdog",
        Field::KeepCheckpoints => "keep-checkpoints",
        Field::ModelSize => "hidden",
        Field::Wire => "wire",
        _ => return None,
    })
}

/// A library error as `fdl`'s one line says it: a configuration error names the flag
/// (`--batch-size: 0 is out of range ...`), any other error is the library's.
pub(crate) fn explain(error: flodl_ddp::Error, ranks: &RankSpec) -> anyhow::Error {
    match error {
        flodl_ddp::Error::Invalid(e) => anyhow::anyhow!(flag_line(&e, ranks)),
        other => other.into(),
    }
}

/// `e` with the flag of its field in front, or the library's name when `fdl` has no flag.
fn flag_line(e: &ConfigError, ranks: &RankSpec) -> String {
    match flag(e.field, ranks) {
        Some(name) => format!("--{name}: {}", e.problem),
        None => format!("invalid configuration: {e}"),
    }
}

/// `secs` seconds as the deadline of `field`, refused in the library's words when no
/// `Duration` holds it (negative, not a number, or past `u64::MAX` seconds).
///
/// # Errors
/// The one line naming the flag.
pub(crate) fn seconds(field: Field, secs: f64, ranks: &RankSpec) -> Result<Duration> {
    Duration::try_from_secs_f64(secs).map_err(|_| {
        let e =
            ConfigError::out_of_range(field, format!("{secs:?}"), "more than 0 and at most a week");
        anyhow::anyhow!(flag_line(&e, ranks))
    })
}

/// Values that the command line spells as text, read from the file the same way: a TOML value
/// may be the flag's text (`"1,2.5"`, `"auto"`) or the native value (`[1.0, 2.5]`, `2`), and
/// either goes through the type's `FromStr`, the parser clap uses.
pub(crate) mod text {
    use std::fmt::{self, Display};
    use std::marker::PhantomData;
    use std::str::FromStr;

    use serde::de::{self, Deserializer, SeqAccess, Visitor};
    use serde::{Serialize, Serializer};

    /// One scalar as text: a string, or a number written out.
    struct Text;

    impl<'de> Visitor<'de> for Text {
        type Value = String;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string or a number")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }

    impl<'de> de::Deserialize<'de> for TextItem {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(Text).map(TextItem)
        }
    }

    /// An element of a list, as text.
    struct TextItem(String);

    fn parsed<T: FromStr, E: de::Error>(text: &str) -> Result<T, E>
    where
        T::Err: Display,
    {
        text.trim().parse().map_err(|e| E::custom(format!("'{}': {e}", text.trim())))
    }

    /// A list: an array, or the comma-separated text the flag takes.
    struct List<T>(PhantomData<T>);

    impl<'de, T: FromStr> Visitor<'de> for List<T>
    where
        T::Err: Display,
    {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array or a comma-separated string")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<T>, E> {
            v.split(',').filter(|s| !s.trim().is_empty()).map(parsed).collect()
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::new();
            while let Some(TextItem(item)) = seq.next_element()? {
                out.push(parsed(&item)?);
            }
            Ok(out)
        }
    }

    /// `deserialize_with` for an optional list key.
    pub(crate) fn list<'de, D: Deserializer<'de>, T: FromStr>(
        d: D,
    ) -> Result<Option<Vec<T>>, D::Error>
    where
        T::Err: Display,
    {
        d.deserialize_any(List(PhantomData)).map(Some)
    }

    /// `deserialize_with` for an optional scalar key written as text or a number.
    pub(crate) fn optional<'de, D: Deserializer<'de>, T: FromStr>(
        d: D,
    ) -> Result<Option<T>, D::Error>
    where
        T::Err: Display,
    {
        one::deserialize(d).map(Some)
    }

    /// A value stored as its text (`Display` out, `FromStr` in).
    pub(crate) mod one {
        use super::*;

        pub(crate) fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
            s.collect_str(v)
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>, T: FromStr>(
            d: D,
        ) -> Result<T, D::Error>
        where
            T::Err: Display,
        {
            parsed(&d.deserialize_any(Text)?)
        }
    }

    /// A list stored as its elements' text.
    pub(crate) mod seq {
        use super::*;

        pub(crate) fn serialize<T: Display, S: Serializer>(
            v: &[T],
            s: S,
        ) -> Result<S::Ok, S::Error> {
            let texts: Vec<String> = v.iter().map(ToString::to_string).collect();
            texts.serialize(s)
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>, T: FromStr>(
            d: D,
        ) -> Result<Vec<T>, D::Error>
        where
            T::Err: Display,
        {
            d.deserialize_any(List(PhantomData))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::Parser;

    use crate::args::{Cli, Command};

    fn write(text: &str) -> Result<tempfile::NamedTempFile> {
        let mut f = tempfile::NamedTempFile::new()?;
        std::io::Write::write_all(&mut f, text.as_bytes())?;
        Ok(f)
    }

    fn with_file(file: &tempfile::NamedTempFile) -> TrainFlags {
        TrainFlags { config: Some(file.path().to_owned()), ..TrainFlags::default() }
    }

    /// `fdl train ARGS` resolved.
    fn train(args: &[&str]) -> Result<(TrainConfig, RunOptions)> {
        let cli = Cli::try_parse_from(["fdl", "train"].iter().chain(args))?;
        match cli.command {
            Command::Train(t) => resolve(&t.flags, &t.run),
            other => bail!("not train: {other:?}"),
        }
    }

    #[test]
    fn flags_override_file_which_overrides_defaults() -> Result<()> {
        let file = write(
            "epochs = 3\nbatch-size = 16\nslowdown = [1.0, 2.5]\nlr = 0.1\npolicy = \"sync\"\n",
        )?;
        let path = file.path().to_str().ok_or_else(|| anyhow::anyhow!("path"))?;
        let (cfg, opts) = train(&["--config", path, "--epochs", "5", "--backend", "host"])?;
        let defaults = TrainConfig::defaults();
        assert_eq!((cfg.epochs, cfg.batch_size, cfg.lr), (5, 16, 0.1));
        assert_eq!(cfg.slowdown, vec![1.0, 2.5]);
        assert_eq!((cfg.policy, cfg.backend), (Policy::Sync, Backend::Host));
        assert_eq!((cfg.momentum, cfg.schedule), (defaults.momentum, defaults.schedule));
        assert_eq!(opts.eval_every, 1);
        Ok(())
    }

    #[test]
    fn lists_parse_from_flag_text_and_file_strings() -> Result<()> {
        let file = write("devices = \"cpu, cpu\"\nhidden = \"32,16\"\n")?;
        let (cfg, _) = resolve(&with_file(&file), &RunFlags::default())?;
        assert_eq!(cfg.ranks, RankSpec::Devices(vec![Device::Cpu, Device::Cpu]));
        assert_eq!(cfg.hidden, vec![32, 16]);
        let flags = TrainFlags { ranks: Some(3), ..with_file(&file) };
        let (cfg, _) = resolve(&flags, &RunFlags::default())?;
        assert_eq!(cfg.ranks, RankSpec::CpuRanks(3));
        let (cfg, _) = train(&["--devices", "cpu,cuda:1", "--hidden", "8,4", "--slowdown", "1,2"])?;
        assert_eq!(cfg.ranks, RankSpec::Devices(vec![Device::Cpu, Device::Cuda(1)]));
        assert_eq!((cfg.hidden, cfg.slowdown), (vec![8, 4], vec![1.0, 2.0]));
        let both = write("ranks = 2\ndevices = \"cpu,cpu\"\n")?;
        let err = resolve(&with_file(&both), &RunFlags::default()).err().map(|e| format!("{e:#}"));
        assert!(err.as_deref().is_some_and(|e| e.contains("together")), "{err:?}");
        Ok(())
    }

    #[test]
    fn checkpoint_prefetch_and_fault_keys_resolve_from_the_file() -> Result<()> {
        let text = "checkpoint-dir = \"ck\"\ncheckpoint-every-reduces = 5\nprefetch = 2\n\
                    watchdog = 2.5\nmax-failures = 1\nfail-rank = [\"1@3\"]\nresume = \"old\"\n";
        let file = write(text)?;
        let (cfg, opts) = resolve(&with_file(&file), &RunFlags::default())?;
        assert_eq!(opts.checkpoint_dir, Some(PathBuf::from("ck")));
        // Reduces alone: no per-epoch saves.
        assert_eq!((opts.checkpoint_every, opts.checkpoint_every_reduces), (0, Some(5)));
        assert_eq!(opts.keep_checkpoints, DEFAULT_KEEP);
        assert_eq!(opts.resume, Some(PathBuf::from("old")));
        assert_eq!(cfg.prefetch, Prefetch::Depth(2));
        assert_eq!((cfg.watchdog_s, cfg.max_failures), (Some(2.5), Some(1)));
        assert_eq!(cfg.fail_rank, vec![FailAt { rank: 1, batch: 3 }]);
        let run = RunFlags { checkpoint_every: Some(2), ..RunFlags::default() };
        let (_, opts) = resolve(&with_file(&file), &run)?;
        assert_eq!((opts.checkpoint_every, opts.checkpoint_every_reduces), (2, Some(5)));
        let (cfg, opts) = resolve(&TrainFlags::default(), &RunFlags::default())?;
        assert_eq!((opts.checkpoint_dir, opts.checkpoint_every), (None, 1));
        assert_eq!(cfg, TrainConfig::defaults());
        Ok(())
    }

    /// Every flag of `train` but `--config`, `--quiet` and `--dry-run` is a file key, read with
    /// the flag's type.
    #[test]
    fn every_flag_is_a_file_key() -> Result<()> {
        let text = "ranks = 3\npolicy = \"async\"\nbackend = \"host\"\nepochs = 4\n\
            batch-size = 8\nlr = 1\nmomentum = 0.5\nschedule = \"one-cycle\"\n\
            warmup-epochs = 1\nseed = 7\nslowdown = [1, 2]\nhidden = [5]\ndata = \"d\"\n\
            train-subset = 100\ntest-subset = 50\nprefetch = \"off\"\nwatchdog = 3\n\
            staging = \"64M:lru\"\nrecords = \"r.fdr\"\ndirect = true\n\
            max-failures = 2\nfail-rank = \"0@1, 2@4\"\nwire = \"bf16\"\neval-every = 2\n\
            checkpoint-dir = \"ck\"\ncheckpoint-every = 3\ncheckpoint-every-reduces = 9\n\
            keep-checkpoints = 4\nresume = \"r\"\nout = \"o\"\nname = \"n\"\n\
            dashboard = 8080\ndashboard-token = \"t\"\n";
        // The text sets every key but `devices` (which excludes `ranks`; see the list test).
        let mut keys = file_keys();
        keys.sort();
        let table: toml::Table = toml::from_str(text)?;
        let mut set: Vec<String> = table.keys().cloned().chain(["devices".to_owned()]).collect();
        set.sort();
        assert_eq!(keys, set);
        let file = write(text)?;
        let (cfg, opts) = resolve(&with_file(&file), &RunFlags::default())?;
        let want = TrainConfig {
            ranks: RankSpec::CpuRanks(3),
            policy: Policy::Async,
            backend: Backend::Host,
            epochs: 4,
            batch_size: 8,
            lr: 1.0,
            momentum: 0.5,
            schedule: ScheduleKind::OneCycle,
            warmup_epochs: 1.0,
            seed: 7,
            slowdown: vec![1.0, 2.0],
            hidden: vec![5],
            data: Some("d".into()),
            train_subset: Some(100),
            test_subset: Some(50),
            prefetch: Prefetch::Off,
            staging: Staging::Budget { bytes: 64 << 20, eviction: flodl_data::Eviction::Lru },
            records: Some("r.fdr".into()),
            direct: true,
            watchdog_s: Some(3.0),
            max_failures: Some(2),
            fail_rank: vec![FailAt { rank: 0, batch: 1 }, FailAt { rank: 2, batch: 4 }],
            wire: flodl_ddp::WireFormat::Bf16,
        };
        assert_eq!(cfg, want);
        let want = RunOptions {
            eval_every: 2,
            checkpoint_dir: Some("ck".into()),
            checkpoint_every: 3,
            checkpoint_every_reduces: Some(9),
            keep_checkpoints: 4,
            resume: Some("r".into()),
            out: Some("o".into()),
            name: Some("n".into()),
            dashboard: Some("127.0.0.1:8080".parse()?),
            dashboard_token: Some("t".into()),
        };
        assert_eq!(opts, want);
        // The resolved configuration round-trips through JSON (summary.json, bench.json).
        let json = serde_json::to_string(&cfg)?;
        assert_eq!(serde_json::from_str::<TrainConfig>(&json)?, cfg);
        Ok(())
    }

    #[test]
    fn bad_values_are_rejected_with_the_key_named() -> Result<()> {
        // The rules the library owns (epochs, lr, slowdown factors, watchdog, ...) are tried
        // through the real binary (tests/cli.rs), since `fdl` checks them by building the spec.
        let cases: [(&[&str], &str); 8] = [
            (&["--slowdown", "1,x"], "slowdown"),
            (&["--hidden", "0"], "hidden"),
            (&["--warmup-epochs", "10"], "warmup-epochs"),
            (&["--fail-rank", "1@0"], "fail-rank"),
            (&["--policy", "often"], "often"),
            (&["--schedule", "zigzag"], "schedule"),
            (&["--prefetch", "lots"], "lots"),
            (&["--devices", "cpu,tpu"], "tpu"),
        ];
        for (args, key) in cases {
            let err = train(args).err().map(|e| format!("{e:#}"));
            assert!(err.as_deref().is_some_and(|e| e.contains(key)), "{key}: {err:?}");
        }
        let files = [
            ("epoch = 3\n", vec!["line 1", "epoch"]),
            ("epochs = 2\npolicy = \"often\"\n", vec!["line 2", "often"]),
            ("slowdown = \"1,x\"\n", vec!["line 1", "x"]),
            ("[checkpoint]\nevery = 2\n", vec!["line 1", "checkpoint"]),
        ];
        for (text, needles) in files {
            let file = write(text)?;
            let err = resolve(&with_file(&file), &RunFlags::default()).err();
            let err = err.map(|e| format!("{e:#}")).unwrap_or_default();
            assert!(needles.iter().all(|n| err.contains(n)), "{text:?}: {err:?}");
        }
        Ok(())
    }

    #[test]
    fn schedules_peak_at_lr_and_end_where_named() -> Result<()> {
        // The flag, the file and summary.json spell a schedule alike.
        for kind in ScheduleKind::ALL {
            assert_eq!(kind.to_string().parse::<ScheduleKind>(), Ok(kind));
            assert_eq!(serde_json::to_value(kind)?, kind.to_string());
        }
        let total = 1000;
        assert!(ScheduleKind::Constant.build(0.05, total, 0).is_none());
        let cases = [
            (ScheduleKind::Cosine, 0, 0.05, 0.0),
            (ScheduleKind::Step, 0, 0.05, 0.0005),
            (ScheduleKind::OneCycle, 0, 0.05 / 25.0, 0.0),
            (ScheduleKind::Exponential, 0, 0.05, 0.0005),
            (ScheduleKind::Constant, 100, 0.05 / 100.0, 0.05),
            (ScheduleKind::Cosine, 100, 0.05 / 100.0, 0.0),
            (ScheduleKind::Exponential, 250, 0.05 / 250.0, 0.0005),
        ];
        for (kind, warmup, first, last) in cases {
            let s =
                kind.build(0.05, total, warmup).ok_or_else(|| anyhow::anyhow!("{kind}: none"))?;
            let peak = (0..=total).map(|t| s.lr(t)).fold(0.0, f64::max);
            assert!((peak - 0.05).abs() < 1e-9, "{kind}: peak {peak}");
            assert!((s.lr(0) - first).abs() < 1e-9, "{kind}: first {}", s.lr(0));
            assert!((s.lr(total) - last).abs() < 1e-6, "{kind}: last {}", s.lr(total));
        }
        Ok(())
    }

    #[test]
    fn devices_are_checked_against_the_per_rank_keys() {
        let base = TrainConfig { ranks: RankSpec::CpuRanks(2), ..TrainConfig::defaults() };
        let cases = [
            (TrainConfig { ranks: RankSpec::CpuRanks(0), ..base.clone() }, "--ranks"),
            (TrainConfig { fail_rank: vec![FailAt { rank: 2, batch: 1 }], ..base.clone() }, "2@1"),
            (
                TrainConfig { ranks: RankSpec::Devices(vec![Device::Cuda(99)]), ..base.clone() },
                "cuda:99",
            ),
        ];
        for (cfg, key) in cases {
            let err = cfg.devices().err().map(|e| format!("{e:#}"));
            assert!(err.as_deref().is_some_and(|e| e.contains(key)), "{key}: {err:?}");
        }
        assert!(base.devices().is_ok_and(|d| d == [Device::Cpu, Device::Cpu]));
    }
}

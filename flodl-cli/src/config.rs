//! The resolved training configuration: built-in defaults, then a TOML file, then flags.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use crate::args::TrainFlags;
use crate::failure::FailAt;

/// Default hidden widths of the reference MLP (784-256-128-10).
const DEFAULT_HIDDEN: [usize; 2] = [256, 128];

/// Keys a `--config` TOML file may set; the same names as the flags, in kebab-case.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ConfigFile {
    ranks: Option<usize>,
    devices: Option<ListOrString<String>>,
    policy: Option<String>,
    backend: Option<String>,
    epochs: Option<usize>,
    batch_size: Option<usize>,
    lr: Option<f64>,
    momentum: Option<f64>,
    schedule: Option<String>,
    warmup_epochs: Option<f64>,
    seed: Option<u64>,
    slowdown: Option<ListOrString<f64>>,
    hidden: Option<ListOrString<usize>>,
    data: Option<PathBuf>,
    train_subset: Option<usize>,
    test_subset: Option<usize>,
    prefetch: Option<PrefetchKey>,
    watchdog: Option<f64>,
    max_failures: Option<usize>,
    fail_rank: Option<ListOrString<String>>,
    eval_every: Option<usize>,
    checkpoint_dir: Option<PathBuf>,
    checkpoint_every: Option<usize>,
    checkpoint_every_reduces: Option<usize>,
    keep_checkpoints: Option<usize>,
    resume: Option<PathBuf>,
    out: Option<PathBuf>,
    name: Option<String>,
}

/// A list in TOML: either an array or the comma-separated string the flag takes.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ListOrString<T> {
    List(Vec<T>),
    Text(String),
}

/// `prefetch` in TOML: `"auto"`, `"off"` or a depth.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PrefetchKey {
    Depth(usize),
    Text(String),
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
    Devices(Vec<String>),
}

/// Everything a training run needs, after defaults, file and flags are merged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TrainConfig {
    /// Rank devices.
    pub(crate) ranks: RankSpec,
    /// Averaging policy name (sync, cadence, async).
    pub(crate) policy: String,
    /// Averaging backend name (collective, host).
    pub(crate) backend: String,
    /// Epochs to train.
    pub(crate) epochs: usize,
    /// Per-rank batch size.
    pub(crate) batch_size: usize,
    /// Base learning rate.
    pub(crate) lr: f64,
    /// SGD momentum.
    pub(crate) momentum: f64,
    /// LR schedule name.
    pub(crate) schedule: String,
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
    #[serde(default = "default_prefetch")]
    pub(crate) prefetch: String,
    /// Watchdog deadline in seconds (the library's default when unset).
    #[serde(default)]
    pub(crate) watchdog_s: Option<f64>,
    /// Ranks that may die before the run stops (no limit when unset).
    #[serde(default)]
    pub(crate) max_failures: Option<usize>,
    /// Emulated device failures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) fail_rank: Vec<FailAt>,
}

fn default_prefetch() -> String {
    "auto".to_owned()
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
}

fn default_keep() -> usize {
    DEFAULT_KEEP
}

/// Step bundles a checkpoint directory keeps unless told otherwise.
const DEFAULT_KEEP: usize = 3;

/// Flags of `train` that are not shared with `bench`, as parsed.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunFlags {
    pub(crate) eval_every: Option<usize>,
    pub(crate) checkpoint_dir: Option<PathBuf>,
    pub(crate) checkpoint_every: Option<usize>,
    pub(crate) checkpoint_every_reduces: Option<usize>,
    pub(crate) keep_checkpoints: Option<usize>,
    pub(crate) resume: Option<PathBuf>,
    pub(crate) out: Option<PathBuf>,
    pub(crate) name: Option<String>,
}

impl TrainConfig {
    /// The built-in defaults, tuned on 2 CPU cores: a cosine decay from lr 0.05 over 10 epochs
    /// ends at ~98.2% in 5-25 s of training (a constant lr 0.05 ends on a noisy epoch too often).
    pub(crate) fn defaults() -> Self {
        Self {
            ranks: RankSpec::Auto,
            policy: "cadence".to_owned(),
            backend: "collective".to_owned(),
            epochs: 10,
            batch_size: 64,
            lr: 0.05,
            momentum: 0.9,
            schedule: "cosine".to_owned(),
            warmup_epochs: 0.0,
            seed: 42,
            slowdown: Vec::new(),
            hidden: DEFAULT_HIDDEN.to_vec(),
            data: None,
            train_subset: None,
            test_subset: None,
            prefetch: default_prefetch(),
            watchdog_s: None,
            max_failures: None,
            fail_rank: Vec::new(),
        }
    }
}

/// Merges defaults, the `--config` file (if any) and the flags, and checks the values.
///
/// # Errors
/// The config file cannot be read or parsed, or a value is out of range.
pub(crate) fn resolve(flags: &TrainFlags, run: &RunFlags) -> Result<(TrainConfig, RunOptions)> {
    let file = match &flags.config {
        Some(path) => read_file(path)?,
        None => ConfigFile::default(),
    };
    let mut cfg = TrainConfig::defaults();
    let ranks = flags.ranks.or(file.ranks);
    let devices = match &flags.devices {
        Some(text) => Some(split_list::<String>(text, "devices")?),
        None => file.devices.map(|l| l.into_vec("devices")).transpose()?,
    };
    cfg.ranks = match (ranks, devices) {
        // A flag beats a file key of the other kind; both from one source is ambiguous.
        (Some(n), Some(d)) => match (flags.ranks.is_some(), flags.devices.is_some()) {
            (true, false) => RankSpec::CpuRanks(n),
            (false, true) => RankSpec::Devices(d),
            _ => bail!("ranks and devices cannot be used together"),
        },
        (Some(n), None) => RankSpec::CpuRanks(n),
        (None, Some(d)) => RankSpec::Devices(d),
        (None, None) => RankSpec::Auto,
    };
    set(&mut cfg.policy, flags.policy.clone().or(file.policy));
    set(&mut cfg.backend, flags.backend.clone().or(file.backend));
    set(&mut cfg.epochs, flags.epochs.or(file.epochs));
    set(&mut cfg.batch_size, flags.batch_size.or(file.batch_size));
    set(&mut cfg.lr, flags.lr.or(file.lr));
    set(&mut cfg.momentum, flags.momentum.or(file.momentum));
    set(&mut cfg.schedule, flags.schedule.clone().or(file.schedule));
    set(&mut cfg.warmup_epochs, flags.warmup_epochs.or(file.warmup_epochs));
    set(&mut cfg.seed, flags.seed.or(file.seed));
    let slowdown = match &flags.slowdown {
        Some(text) => Some(split_list::<f64>(text, "slowdown")?),
        None => file.slowdown.map(|l| l.into_vec("slowdown")).transpose()?,
    };
    set(&mut cfg.slowdown, slowdown);
    let hidden = match &flags.hidden {
        Some(text) => Some(split_list::<usize>(text, "hidden")?),
        None => file.hidden.map(|l| l.into_vec("hidden")).transpose()?,
    };
    set(&mut cfg.hidden, hidden);
    cfg.data = flags.data.clone().or(file.data);
    cfg.train_subset = flags.train_subset.or(file.train_subset);
    cfg.test_subset = flags.test_subset.or(file.test_subset);
    let prefetch = match file.prefetch {
        Some(PrefetchKey::Depth(n)) => Some(n.to_string()),
        Some(PrefetchKey::Text(t)) => Some(t),
        None => None,
    };
    set(&mut cfg.prefetch, flags.prefetch.clone().or(prefetch));
    cfg.watchdog_s = flags.watchdog.or(file.watchdog);
    cfg.max_failures = flags.max_failures.or(file.max_failures);
    let fail_rank = match &flags.fail_rank {
        Some(text) => Some(split_list::<String>(text, "fail-rank")?),
        None => file.fail_rank.map(|l| l.into_vec("fail-rank")).transpose()?,
    };
    if let Some(list) = fail_rank {
        cfg.fail_rank = list
            .iter()
            .map(|f| f.parse::<FailAt>().map_err(|e| anyhow::anyhow!("fail-rank: {e}")))
            .collect::<Result<_>>()?;
    }

    let checkpoint_dir = run.checkpoint_dir.clone().or(file.checkpoint_dir);
    let every = run.checkpoint_every.or(file.checkpoint_every);
    let every_reduces = run.checkpoint_every_reduces.or(file.checkpoint_every_reduces);
    let keep = run.keep_checkpoints.or(file.keep_checkpoints);
    if checkpoint_dir.is_none() {
        let given = [
            ("checkpoint-every", every.is_some()),
            ("checkpoint-every-reduces", every_reduces.is_some()),
            ("keep-checkpoints", keep.is_some()),
        ];
        if let Some((key, _)) = given.iter().find(|(_, g)| *g) {
            bail!("{key} needs checkpoint-dir");
        }
    }
    let opts = RunOptions {
        eval_every: run.eval_every.or(file.eval_every).unwrap_or(1),
        // Reduces alone turn the per-epoch default off.
        checkpoint_every: every.unwrap_or(if every_reduces.is_some() { 0 } else { 1 }),
        checkpoint_every_reduces: every_reduces,
        keep_checkpoints: keep.unwrap_or(DEFAULT_KEEP),
        checkpoint_dir,
        resume: run.resume.clone().or(file.resume),
        out: run.out.clone().or(file.out),
        name: run.name.clone().or(file.name),
    };
    check(&cfg, &opts)?;
    Ok((cfg, opts))
}

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

fn read_file(path: &Path) -> Result<ConfigFile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).map_err(|e| {
        // toml's message spans several lines (a snippet of the file); keep the first.
        let msg = e.message().to_owned();
        let line = e.span().map(|s| text[..s.start.min(text.len())].lines().count().max(1));
        match line {
            Some(line) => anyhow::anyhow!("config file {} line {line}: {msg}", path.display()),
            None => anyhow::anyhow!("config file {}: {msg}", path.display()),
        }
    })
}

impl<T: std::str::FromStr> ListOrString<T> {
    fn into_vec(self, key: &str) -> Result<Vec<T>> {
        match self {
            Self::List(v) => Ok(v),
            Self::Text(s) => split_list(&s, key),
        }
    }
}

/// Parses a comma-separated list (`1,2.5`, `cpu,cuda:0`).
fn split_list<T: std::str::FromStr>(text: &str, key: &str) -> Result<Vec<T>> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<T>().map_err(|_| anyhow::anyhow!("{key}: cannot parse '{s}'")))
        .collect()
}

fn check(cfg: &TrainConfig, opts: &RunOptions) -> Result<()> {
    match &cfg.ranks {
        RankSpec::CpuRanks(0) => bail!("ranks must be at least 1"),
        RankSpec::Devices(d) if d.is_empty() => bail!("devices: the list is empty"),
        _ => {}
    }
    ensure!(cfg.epochs >= 1, "epochs must be at least 1");
    ensure!(cfg.batch_size >= 1, "batch-size must be at least 1");
    ensure!(cfg.lr.is_finite() && cfg.lr > 0.0, "lr must be a positive number, got {}", cfg.lr);
    ensure!(
        cfg.momentum.is_finite() && (0.0..1.0).contains(&cfg.momentum),
        "momentum must be in [0, 1), got {}",
        cfg.momentum
    );
    ensure!(
        cfg.warmup_epochs.is_finite()
            && cfg.warmup_epochs >= 0.0
            && cfg.warmup_epochs < cfg.epochs as f64,
        "warmup-epochs must be at least 0 and less than epochs ({}), got {}",
        cfg.epochs,
        cfg.warmup_epochs
    );
    if let Some(bad) = cfg.slowdown.iter().find(|f| !(f.is_finite() && **f >= 1.0)) {
        bail!("slowdown factors must be numbers >= 1 (1 = full speed), got {bad}");
    }
    ensure!(!cfg.hidden.is_empty(), "hidden: give at least one layer width");
    ensure!(cfg.hidden.iter().all(|&h| h > 0), "hidden: layer widths must be positive");
    ensure!(cfg.train_subset != Some(0), "train-subset must be at least 1");
    ensure!(cfg.test_subset != Some(0), "test-subset must be at least 1");
    ensure!(opts.eval_every >= 1, "eval-every must be at least 1");
    ensure!(
        opts.checkpoint_every_reduces != Some(0),
        "checkpoint-every-reduces must be at least 1"
    );
    ensure!(opts.keep_checkpoints >= 1, "keep-checkpoints must be at least 1");
    if let Some(w) = cfg.watchdog_s {
        ensure!(w.is_finite() && w > 0.0, "watchdog must be a positive number of seconds, got {w}");
    }
    if let Some(name) = &opts.name {
        ensure!(
            !name.is_empty() && !name.contains(['/', '\\']) && name != "." && name != "..",
            "name '{name}' must be a plain directory name"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> Result<tempfile::NamedTempFile> {
        let mut f = tempfile::NamedTempFile::new()?;
        std::io::Write::write_all(&mut f, text.as_bytes())?;
        Ok(f)
    }

    #[test]
    fn flags_override_file_which_overrides_defaults() -> Result<()> {
        let file = write("epochs = 3\nbatch-size = 16\nslowdown = [1.0, 2.5]\nlr = 0.1\n")?;
        let flags = TrainFlags {
            config: Some(file.path().to_owned()),
            epochs: Some(5),
            ..TrainFlags::default()
        };
        let (cfg, opts) = resolve(&flags, &RunFlags::default())?;
        let defaults = TrainConfig::defaults();
        assert_eq!(cfg.epochs, 5);
        assert_eq!(cfg.batch_size, 16);
        assert_eq!(cfg.slowdown, vec![1.0, 2.5]);
        assert_eq!(cfg.lr, 0.1);
        assert_eq!(cfg.momentum, defaults.momentum);
        assert_eq!(opts.eval_every, 1);
        Ok(())
    }

    #[test]
    fn lists_parse_from_flag_text_and_file_strings() -> Result<()> {
        let file = write("devices = \"cpu, cpu\"\nhidden = \"32,16\"\n")?;
        let flags = TrainFlags { config: Some(file.path().to_owned()), ..TrainFlags::default() };
        let (cfg, _) = resolve(&flags, &RunFlags::default())?;
        assert_eq!(cfg.ranks, RankSpec::Devices(vec!["cpu".into(), "cpu".into()]));
        assert_eq!(cfg.hidden, vec![32, 16]);
        let flags = TrainFlags {
            config: Some(file.path().to_owned()),
            ranks: Some(3),
            ..TrainFlags::default()
        };
        let (cfg, _) = resolve(&flags, &RunFlags::default())?;
        assert_eq!(cfg.ranks, RankSpec::CpuRanks(3));
        let both = write("ranks = 2\ndevices = \"cpu,cpu\"\n")?;
        let flags = TrainFlags { config: Some(both.path().to_owned()), ..TrainFlags::default() };
        let err = resolve(&flags, &RunFlags::default()).err().map(|e| format!("{e:#}"));
        assert!(err.as_deref().is_some_and(|e| e.contains("together")), "{err:?}");
        Ok(())
    }

    #[test]
    fn checkpoint_prefetch_and_fault_keys_resolve_from_the_file() -> Result<()> {
        let text = "checkpoint-dir = \"ck\"\ncheckpoint-every-reduces = 5\nprefetch = 2\n\
                    watchdog = 2.5\nmax-failures = 1\nfail-rank = [\"1@3\"]\nresume = \"old\"\n";
        let file = write(text)?;
        let flags = TrainFlags { config: Some(file.path().to_owned()), ..TrainFlags::default() };
        let (cfg, opts) = resolve(&flags, &RunFlags::default())?;
        assert_eq!(opts.checkpoint_dir, Some(PathBuf::from("ck")));
        // Reduces alone: no per-epoch saves.
        assert_eq!((opts.checkpoint_every, opts.checkpoint_every_reduces), (0, Some(5)));
        assert_eq!(opts.keep_checkpoints, DEFAULT_KEEP);
        assert_eq!(opts.resume, Some(PathBuf::from("old")));
        assert_eq!(cfg.prefetch, "2");
        assert_eq!((cfg.watchdog_s, cfg.max_failures), (Some(2.5), Some(1)));
        assert_eq!(cfg.fail_rank, vec![FailAt { rank: 1, batch: 3 }]);
        let run = RunFlags { checkpoint_every: Some(2), ..RunFlags::default() };
        let (_, opts) = resolve(&flags, &run)?;
        assert_eq!((opts.checkpoint_every, opts.checkpoint_every_reduces), (2, Some(5)));
        let (_, opts) = resolve(&TrainFlags::default(), &RunFlags::default())?;
        assert_eq!((opts.checkpoint_dir, opts.checkpoint_every), (None, 1));
        Ok(())
    }

    #[test]
    fn bad_values_are_rejected_with_the_key_named() -> Result<()> {
        let cases: [(TrainFlags, &str); 8] = [
            (TrainFlags { epochs: Some(0), ..TrainFlags::default() }, "epochs"),
            (TrainFlags { lr: Some(-1.0), ..TrainFlags::default() }, "lr"),
            (TrainFlags { slowdown: Some("1,0.5".into()), ..TrainFlags::default() }, "slowdown"),
            (TrainFlags { slowdown: Some("1,x".into()), ..TrainFlags::default() }, "slowdown"),
            (TrainFlags { hidden: Some("0".into()), ..TrainFlags::default() }, "hidden"),
            (TrainFlags { watchdog: Some(0.0), ..TrainFlags::default() }, "watchdog"),
            (TrainFlags { warmup_epochs: Some(10.0), ..TrainFlags::default() }, "warmup-epochs"),
            (TrainFlags { fail_rank: Some("1@0".into()), ..TrainFlags::default() }, "fail-rank"),
        ];
        for (flags, key) in cases {
            let err = resolve(&flags, &RunFlags::default()).err().map(|e| format!("{e:#}"));
            assert!(err.as_deref().is_some_and(|e| e.contains(key)), "{key}: {err:?}");
        }
        let file = write("epoch = 3\n")?;
        let flags = TrainFlags { config: Some(file.path().to_owned()), ..TrainFlags::default() };
        let err = resolve(&flags, &RunFlags::default()).err().map(|e| format!("{e:#}"));
        assert!(err.as_deref().is_some_and(|e| e.contains("line 1") && e.contains("epoch")));
        Ok(())
    }
}

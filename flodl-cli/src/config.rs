//! The resolved training configuration: `fdl`'s defaults, then a TOML file, then flags.
//!
//! The run's settings are the library's one declaration of them ([`RunSettings`]: clap reads
//! them from the flags, serde from the file, under the same names); what only `fdl` has is
//! [`LocalFlags`] and [`RunFlags`], declared the same way. [`resolve`] merges flags over file
//! over defaults with each group's `or` (one line per group, never per field), and `train`
//! hands the settings to `flodl_ddp::Trainer::settings`: the library's `RunSpec::check` is the
//! one check of the run's options, and [`flag`] turns the field it names back into the flag.

use std::path::{Path, PathBuf};

use anyhow::{Result, ensure};
use flodl_ddp::{
    Backend, ConfigError, Devices, Field, Policy, Prefetch, Problem, RunSettings, ScheduleKind,
    Staging,
};
use flodl_tensor::Device;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::args::{LocalFlags, RunFlags, TrainFlags};
use crate::failure::FailAt;

/// Default hidden widths of the reference MLP (784-256-128-10).
const DEFAULT_HIDDEN: [usize; 2] = [256, 128];

/// Default SGD momentum.
const DEFAULT_MOMENTUM: f64 = 0.9;

/// Everything a training run is given, after defaults, file and flags are merged: the run's
/// settings and what only `fdl` has (written to `summary.json` and `bench.json` as one table
/// of the flags' names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TrainConfig {
    /// The run's settings (the library's).
    #[serde(flatten)]
    pub(crate) run: RunSettings,
    /// The model, the data, emulated failures.
    #[serde(flatten)]
    pub(crate) local: LocalFlags,
}

/// `fdl`'s defaults, tuned on 2 CPU cores: a cosine decay from lr 0.05 over 10 epochs ends at
/// ~98.2% in 5-25 s of training (a constant lr 0.05 ends on a noisy epoch too often). An unset
/// key takes the library's default (ranks: every GPU, or 2 CPU ranks when there is none).
pub(crate) fn defaults() -> TrainConfig {
    TrainConfig {
        run: RunSettings {
            policy: Some(Policy::Cadence),
            backend: Some(Backend::Collective),
            epochs: Some(10),
            batch_size: Some(64),
            lr: Some(0.05),
            schedule: Some(ScheduleKind::Cosine),
            warmup_epochs: Some(0.0),
            seed: Some(42),
            prefetch: Some(Prefetch::Auto),
            staging: Some(Staging::Auto),
            wire: Some(flodl_ddp::WireFormat::F32),
            eval_every: Some(1),
            ..RunSettings::default()
        },
        local: LocalFlags {
            momentum: Some(DEFAULT_MOMENTUM),
            hidden: Some(DEFAULT_HIDDEN.to_vec()),
            ..LocalFlags::default()
        },
    }
}

impl TrainConfig {
    /// The MLP's hidden widths.
    pub(crate) fn hidden(&self) -> Vec<usize> {
        self.local.hidden.clone().unwrap_or_else(|| DEFAULT_HIDDEN.to_vec())
    }

    /// SGD momentum.
    pub(crate) fn momentum(&self) -> f64 {
        self.local.momentum.unwrap_or(DEFAULT_MOMENTUM)
    }

    /// The emulated failures.
    pub(crate) fn fail_rank(&self) -> &[FailAt] {
        self.local.fail_rank.as_deref().unwrap_or_default()
    }

    /// The slowdown factors (empty: none).
    pub(crate) fn slowdown(&self) -> &[f64] {
        self.run.slowdown.as_deref().unwrap_or_default()
    }

    /// One device per rank, discovered and checked against the other per-rank keys: `ranks`
    /// CPU ranks, the `devices` listed, else every GPU (or 2 CPU ranks when there is none).
    ///
    /// # Errors
    /// No rank; a GPU that is not there; a failure for a rank that does not exist.
    pub(crate) fn devices(&self) -> Result<Vec<Device>> {
        let devices = match (self.run.ranks, &self.run.devices) {
            (Some(n), _) => Devices::Cpu(n),
            (None, Some(list)) => Devices::List(list.clone()),
            (None, None) if flodl_tensor::cuda_device_count() > 0 => Devices::AllGpus,
            (None, None) => Devices::Cpu(2),
        };
        let devices = devices.resolve().map_err(|e| explain(e, &self.run))?;
        let gpus = flodl_tensor::cuda_device_count();
        if let Some(missing) = devices.iter().find(|d| matches!(d, Device::Cuda(i) if *i >= gpus)) {
            let why = flodl_tensor::gpu_skip_reason()
                .unwrap_or_else(|| format!("{gpus} CUDA device(s) visible"));
            anyhow::bail!("devices: {missing} is not available ({why})");
        }
        if let Some(f) = self.fail_rank().iter().find(|f| f.rank >= devices.len()) {
            anyhow::bail!(
                "fail-rank: {f} names rank {}, but there are {} rank(s)",
                f.rank,
                devices.len()
            );
        }
        Ok(devices)
    }
}

/// The three groups of flags (or of a file's keys).
#[derive(Debug, Clone, Default)]
struct Given {
    run: RunSettings,
    local: LocalFlags,
    options: RunFlags,
}

/// Merges `fdl`'s defaults, the `--config` file (if any) and the flags, and checks what only
/// `fdl` has (the run's settings are checked by the library when the trainer is built).
///
/// # Errors
/// The config file cannot be read or parsed ([`FileError`]), or a value of `fdl`'s own is out
/// of range.
pub(crate) fn resolve(flags: &TrainFlags, run: &RunFlags) -> Result<(TrainConfig, RunFlags)> {
    let mut file = match &flags.config {
        Some(path) => read_file(path)?,
        None => Given::default(),
    };
    // A flag beats a file key of the other kind (`ranks` and `devices` are one option).
    if flags.settings.ranks.is_some() || flags.settings.devices.is_some() {
        (file.run.ranks, file.run.devices) = (None, None);
    }
    let d = defaults();
    let cfg = TrainConfig {
        run: flags.settings.clone().or(file.run).or(d.run),
        local: flags.local.clone().or(file.local).or(d.local),
    };
    let opts = run.clone().or(file.options);
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

/// A `--config` file that cannot be used, in one line naming the file, the line and the key.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FileError {
    /// The file cannot be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A key no flag has.
    #[error("config file {} line {line}: unknown key `{key}`", path.display())]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// Where the key is.
        line: usize,
        /// The key.
        key: String,
    },
    /// A key's value the flag would refuse (another type, text it does not parse).
    #[error("config file {} line {line}: `{key}`: {message}", path.display())]
    BadValue {
        /// The file.
        path: PathBuf,
        /// Where the value is.
        line: usize,
        /// The key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// Text that is not TOML.
    #[error("config file {} line {line}: {message}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// Where the parser stopped.
        line: usize,
        /// Why.
        message: String,
    },
}

/// Reads a `--config` file into the flags' three groups (each reads its own keys).
fn read_file(path: &Path) -> std::result::Result<Given, FileError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| FileError::Unreadable { path: path.to_owned(), source })?;
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
        return Err(FileError::UnknownKey { path: path.to_owned(), line, key: key.clone() });
    }
    Ok(Given { run: parse(&text, path)?, local: parse(&text, path)?, options: parse(&text, path)? })
}

/// Parses the TOML `text` of the file at `path`, naming the line of an error and its key.
fn parse<T: DeserializeOwned>(text: &str, path: &Path) -> std::result::Result<T, FileError> {
    toml::from_str(text).map_err(|e| {
        // toml's message spans several lines (a snippet of the file); keep the first.
        let message = e.message().lines().next().unwrap_or_default().to_owned();
        let start = e.span().map_or(0, |s| s.start.min(text.len()));
        let line = text[..start].lines().count().max(1);
        let path = path.to_owned();
        // The key of the line the error points at, when it is a `key = value` line.
        let key = text[..start]
            .rsplit('\n')
            .next()
            .and_then(|l| l.split_once('='))
            .map(|(k, _)| k.trim().trim_matches('"').to_owned())
            .filter(|k| !k.is_empty() && !k.starts_with('['));
        match key {
            Some(key) if e.span().is_some() => FileError::BadValue { path, line, key, message },
            _ => FileError::Syntax { path, line, message },
        }
    })
}

/// The rules on what only `fdl` has (the MLP, the data, the run directory); every option of
/// the run itself is checked once, by the library (`RunSpec::check`, see [`explain`]).
fn check(cfg: &TrainConfig, opts: &RunFlags) -> Result<()> {
    let momentum = cfg.momentum();
    ensure!(
        momentum.is_finite() && (0.0..1.0).contains(&momentum),
        "momentum must be in [0, 1), got {momentum}"
    );
    let hidden = cfg.hidden();
    ensure!(!hidden.is_empty(), "hidden: give at least one layer width");
    ensure!(hidden.iter().all(|&h| h > 0), "hidden: layer widths must be positive");
    ensure!(cfg.local.train_subset != Some(0), "train-subset must be at least 1");
    ensure!(cfg.local.test_subset != Some(0), "test-subset must be at least 1");
    ensure!(cfg.local.train_eval != Some(0), "train-eval must be at least 1");
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

/// The flag (and `--config` key) that sets `field`: the library's key for it
/// ([`RunSettings::key`], the one map), or `hidden` for the model's size (the MLP is `fdl`'s);
/// `None` for an option `fdl` has no flag for.
pub(crate) fn flag(field: Field, settings: &RunSettings) -> Option<&'static str> {
    settings.key(field).or(match field {
        Field::ModelSize => Some("hidden"),
        _ => None,
    })
}

/// A library error as `fdl`'s one line says it: a configuration error names the flag
/// (`--batch-size: 0 is out of range ...`), any other error is the library's.
pub(crate) fn explain(error: flodl_ddp::Error, settings: &RunSettings) -> anyhow::Error {
    match error {
        flodl_ddp::Error::Invalid(e) => anyhow::anyhow!(flag_line(&e, settings)),
        other => other.into(),
    }
}

/// `e` with the flag of its field in front (and of the field it needs), or the library's name
/// when `fdl` has no flag.
fn flag_line(e: &ConfigError, settings: &RunSettings) -> String {
    let Some(name) = flag(e.field, settings) else {
        return format!("invalid configuration: {e}");
    };
    match &e.problem {
        Problem::Needs { other, to_be } if flag(*other, settings).is_some() => {
            let other = flag(*other, settings).unwrap_or_default();
            format!("--{name}: needs --{other} to be {to_be}")
        }
        problem => format!("--{name}: {problem}"),
    }
}

/// `cmd` (`fdl train`, `bench` or `launch`) with `fdl`'s default appended to the help of every
/// flag that has one, read from [`defaults`] (so the help cannot state another).
pub(crate) fn help_defaults(cmd: clap::Command) -> clap::Command {
    let table = match serde_json::to_value(defaults()) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => return cmd,
    };
    cmd.mut_args(|arg| {
        let value = arg.get_long().and_then(|long| table.get(long));
        let text = match value {
            // The one default that is a rule, not a value ([`TrainConfig::devices`]).
            None if arg.get_long() == Some("ranks") => {
                "every GPU, or 2 CPU ranks when there is none".to_owned()
            }
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                .collect::<Vec<_>>()
                .join(","),
            Some(other) => other.to_string(),
            None => return arg,
        };
        let add = |help: Option<&clap::builder::StyledStr>| match help {
            Some(h) => format!("{h} (default {text})"),
            None => format!("(default {text})"),
        };
        let (short, long) = (add(arg.get_help()), add(arg.get_long_help().or(arg.get_help())));
        arg.help(short).long_help(long)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use anyhow::bail;
    use clap::Parser;
    use flodl_data::mnist::{self, Mnist, Split, Verify};
    use flodl_data::{Dataset, Subset};

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
    fn train(args: &[&str]) -> Result<(TrainConfig, RunFlags)> {
        let cli = Cli::try_parse_from(["fdl", "train"].iter().chain(args))?;
        match cli.command {
            Command::Train(t) => resolve(&t.flags, &t.run),
            other => bail!("not train: {other:?}"),
        }
    }

    /// `fdl train ARGS` resolved, applied to a trainer of 512 MNIST images and checked by the
    /// library, as `fdl train` does: the error in `fdl`'s words.
    fn checked(args: &[&str]) -> Result<flodl_ddp::RunSpec> {
        let (cfg, _) = train(args)?;
        let images = Mnist::load(mnist::vendored_dir(), Split::Train, Verify::Skip)?;
        let data: Arc<dyn Dataset> = Arc::new(Subset::first(images, 512));
        flodl_ddp::Trainer::cooperative()
            .dataset(data)
            .settings(&cfg.run)
            .and_then(|t| t.spec())
            .map_err(|e| explain(e, &cfg.run))
    }

    #[test]
    fn flags_override_file_which_overrides_defaults() -> Result<()> {
        let file = write(
            "epochs = 3\nbatch-size = 16\nslowdown = [1.0, 2.5]\nlr = 0.1\npolicy = \"sync\"\n",
        )?;
        let path = file.path().to_str().ok_or_else(|| anyhow::anyhow!("path"))?;
        let (cfg, opts) = train(&["--config", path, "--epochs", "5", "--backend", "host"])?;
        let d = defaults();
        let r = &cfg.run;
        assert_eq!((r.epochs, r.batch_size, r.lr), (Some(5), Some(16), Some(0.1)));
        assert_eq!(cfg.slowdown(), [1.0, 2.5]);
        assert_eq!((r.policy, r.backend), (Some(Policy::Sync), Some(Backend::Host)));
        assert_eq!((cfg.momentum(), r.schedule), (d.momentum(), d.run.schedule));
        assert_eq!(opts, RunFlags::default());
        Ok(())
    }

    #[test]
    fn lists_parse_from_flag_text_and_file_strings() -> Result<()> {
        let file = write("devices = \"cpu, cpu\"\nhidden = \"32,16\"\n")?;
        let (cfg, _) = resolve(&with_file(&file), &RunFlags::default())?;
        assert_eq!(cfg.run.devices, Some(vec![Device::Cpu, Device::Cpu]));
        assert_eq!(cfg.hidden(), vec![32, 16]);
        // A flag of the other kind beats the file's key.
        let mut flags = with_file(&file);
        flags.settings.ranks = Some(3);
        let (cfg, _) = resolve(&flags, &RunFlags::default())?;
        assert_eq!((cfg.run.ranks, cfg.run.devices), (Some(3), None));
        let (cfg, _) = train(&["--devices", "cpu,cuda:1", "--hidden", "8,4", "--slowdown", "1,2"])?;
        assert_eq!(cfg.run.devices, Some(vec![Device::Cpu, Device::Cuda(1)]));
        assert_eq!((cfg.hidden(), cfg.slowdown()), (vec![8, 4], &[1.0, 2.0][..]));
        let both = write("ranks = 2\ndevices = \"cpu,cpu\"\n")?;
        let path = both.path().to_str().ok_or_else(|| anyhow::anyhow!("path"))?;
        let err = checked(&["--config", path]).err().map(|e| format!("{e:#}"));
        assert!(err.as_deref().is_some_and(|e| e.contains("together")), "{err:?}");
        Ok(())
    }

    #[test]
    fn checkpoint_prefetch_and_fault_keys_resolve_from_the_file() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ck = dir.path().join("ck");
        let text = format!(
            "checkpoint-dir = {:?}\ncheckpoint-every-reduces = 5\nprefetch = 2\nwatchdog = 2.5\n\
             max-failures = 1\nfail-rank = [\"1@3\"]\nresume = \"old\"\n",
            ck.display().to_string()
        );
        let file = write(&text)?;
        let path = file.path().to_str().ok_or_else(|| anyhow::anyhow!("path"))?;
        let (cfg, opts) = train(&["--config", path])?;
        assert_eq!(cfg.run.checkpoint_dir.as_deref(), Some(ck.as_path()));
        assert_eq!(opts.resume, Some(PathBuf::from("old")));
        assert_eq!(cfg.run.prefetch, Some(Prefetch::Depth(2)));
        assert_eq!(cfg.fail_rank(), [FailAt { rank: 1, batch: 3 }]);
        let spec = checked(&["--config", path, "--ranks", "2"])?;
        let saves = spec.checkpoint.ok_or_else(|| anyhow::anyhow!("no checkpoints"))?;
        // Reduces alone: no per-epoch saves.
        assert_eq!(saves.every.every_epochs, None);
        assert_eq!(saves.every.every_reduces.map(|n| n.get()), Some(5));
        assert_eq!((saves.keep, spec.max_failures), (3, 1));
        assert_eq!(spec.watchdog, std::time::Duration::from_millis(2500));
        let spec = checked(&["--config", path, "--ranks", "2", "--checkpoint-every", "2"])?;
        let every = spec.checkpoint.map(|c| c.every);
        assert_eq!(every.and_then(|e| e.every_epochs).map(|n| n.get()), Some(2));
        let (cfg, opts) = resolve(&TrainFlags::default(), &RunFlags::default())?;
        assert_eq!((cfg, opts), (defaults(), RunFlags::default()));
        Ok(())
    }

    /// Every flag of `train` but `--config`, `--quiet`, `--dry-run`, `--model` and the cluster
    /// flags is a file key, read with the flag's type; the resolved configuration round-trips
    /// through JSON (summary.json, bench.json).
    #[test]
    fn every_flag_is_a_file_key() -> Result<()> {
        let text = "ranks = 3\npolicy = \"async\"\nbackend = \"host\"\nepochs = 4\n\
            batch-size = 8\nlr = 1\nmomentum = 0.5\nschedule = \"one-cycle\"\n\
            warmup-epochs = 1\nseed = 7\nslowdown = [1, 2]\nhidden = [5]\ndata = \"d\"\n\
            train-subset = 100\ntest-subset = 50\ntrain-eval = 64\nprefetch = \"off\"\nwatchdog = 3\n\
            staging = \"64M:lru\"\nrecords = \"r.fdr\"\ndirect = true\n\
            max-failures = 2\nstandby = \"2\"\nfail-rank = \"0@1, 2@4\"\nwire = \"bf16\"\noverlap = 0.5\n\
            fragments = 2\noverhead-target = 0.03\n\
            eval-every = 2\n\
            checkpoint-dir = \"ck\"\ncheckpoint-every = 3\ncheckpoint-every-reduces = 9\n\
            keep-checkpoints = 4\nresume = \"r\"\nout = \"o\"\nname = \"n\"\n\
            dashboard = 8080\ndashboard-token = \"t\"\nspeed-change = \"1:3@0.25-0.5\"\n";
        // The text sets every key but `devices` (which excludes `ranks`; see the list test).
        let mut keys = file_keys();
        keys.sort();
        let table: toml::Table = toml::from_str(text)?;
        let mut set: Vec<String> = table.keys().cloned().chain(["devices".to_owned()]).collect();
        set.sort();
        assert_eq!(keys, set);
        let file = write(text)?;
        let (cfg, opts) = resolve(&with_file(&file), &RunFlags::default())?;
        let run = RunSettings {
            ranks: Some(3),
            devices: None,
            policy: Some(Policy::Async),
            backend: Some(Backend::Host),
            epochs: Some(4),
            batch_size: Some(8),
            lr: Some(1.0),
            schedule: Some(ScheduleKind::OneCycle),
            warmup_epochs: Some(1.0),
            seed: Some(7),
            slowdown: Some(vec![1.0, 2.0]),
            speed_change: Some(vec![flodl_ddp::SpeedChange {
                rank: 1,
                factor: 3.0,
                from: 0.25,
                until: 0.5,
            }]),
            prefetch: Some(Prefetch::Off),
            staging: Some(Staging::Budget { bytes: 64 << 20, eviction: flodl_data::Eviction::Lru }),
            watchdog: Some(3.0),
            max_failures: Some(2),
            standby: Some(flodl_ddp::Standby::Rank(2)),
            wire: Some(flodl_ddp::WireFormat::Bf16),
            overlap: Some(0.5),
            fragments: Some(2),
            overhead_target: Some(0.03),
            eval_every: Some(2),
            checkpoint_dir: Some("ck".into()),
            checkpoint_every: Some(3),
            checkpoint_every_reduces: Some(9),
            keep_checkpoints: Some(4),
        };
        let local = LocalFlags {
            momentum: Some(0.5),
            hidden: Some(vec![5]),
            data: Some("d".into()),
            train_subset: Some(100),
            test_subset: Some(50),
            train_eval: Some(64),
            records: Some("r.fdr".into()),
            direct: Some(true),
            fail_rank: Some(vec![FailAt { rank: 0, batch: 1 }, FailAt { rank: 2, batch: 4 }]),
        };
        assert_eq!(cfg, TrainConfig { run, local });
        let want = RunFlags {
            resume: Some("r".into()),
            out: Some("o".into()),
            name: Some("n".into()),
            dashboard: Some("127.0.0.1:8080".parse()?),
            dashboard_token: Some("t".into()),
        };
        assert_eq!(opts, want);
        let json = serde_json::to_string(&cfg)?;
        assert_eq!(serde_json::from_str::<TrainConfig>(&json)?, cfg);
        Ok(())
    }

    /// Every key a run's settings serialize to (all of them set) is a flag of `fdl train`,
    /// `bench` and `launch`, and a file key read back to the same settings; every field of the
    /// library's `RunSpec` is set by a key, or is named here with the reason it has none. A new
    /// `RunSettings` field without a flag, or a new `RunSpec` field without a key or a reason,
    /// fails this test.
    #[test]
    fn every_run_setting_is_a_flag_and_a_file_key() -> Result<()> {
        let all = RunSettings::every_field_set();
        let text = toml::to_string(&all)?;
        let table: toml::Table = toml::from_str(&text)?;
        let keys: Vec<&String> = table.keys().collect();
        // Every field is set, so every field is a key (a missing key is a field unset above).
        let debug = format!("{all:?}");
        assert_eq!(keys.len(), debug.matches(": Some(").count(), "{text}");
        let mut cmd = crate::command();
        for sub in ["train", "bench", "launch"] {
            let longs: Vec<String> = cmd
                .find_subcommand_mut(sub)
                .map(|c| c.get_arguments().filter_map(|a| a.get_long()).map(str::to_owned))
                .into_iter()
                .flatten()
                .collect();
            for key in &keys {
                assert!(longs.contains(key), "{key} is not a flag of fdl {sub}");
            }
        }
        let known = file_keys();
        for key in &keys {
            assert!(known.contains(key), "{key} is not a --config key");
        }
        assert_eq!(toml::from_str::<RunSettings>(&text)?, all);
        // The flags give the same settings as the file.
        let mut args = vec!["fdl".to_owned(), "train".to_owned()];
        for (key, value) in &table {
            let text = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Array(items) => items
                    .iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                    .collect::<Vec<_>>()
                    .join(","),
                other => other.to_string(),
            };
            // `ranks` and `devices` exclude each other on the command line.
            if key != "devices" {
                args.extend([format!("--{key}"), text]);
            }
        }
        let Command::Train(t) = Cli::try_parse_from(&args)?.command else { bail!("not train") };
        assert_eq!(t.flags.settings, RunSettings { devices: None, ..all.clone() });

        // Each field of the run specification, and the keys that set it (or why none does).
        let reached: [(&str, &[&str]); 37] = [
            ("batch_size", &["batch-size"]),
            ("epochs", &["epochs"]),
            ("devices", &["ranks", "devices"]),
            ("placement", &["(the cluster job's launcher: fdl launch)"]),
            ("wire", &["wire"]),
            ("policy", &["policy"]),
            ("backend", &["backend"]),
            ("seed", &["seed"]),
            ("schedule", &["lr", "schedule", "warmup-epochs"]),
            ("lr_scale", &["(resolved from lr_scale_ratio and the ranks)"]),
            ("lr_scale_ratio", &["(library only: Trainer::lr_scale_ratio)"]),
            ("elche", &["overhead-target", "(its other knobs library only: Trainer::elche)"]),
            ("slowdown", &["slowdown"]),
            ("speed_changes", &["speed-change"]),
            ("stall_timeout", &["(library only; fdl's GPT sets its own)"]),
            ("snapshot_timeout", &["(library only: Trainer::snapshot_timeout)"]),
            ("max_stalled_rounds", &["(library only: Trainer::snapshot_timeout)"]),
            ("watchdog", &["watchdog"]),
            ("gamma", &["(library only: Trainer::gamma)"]),
            ("guard", &["(library only: Trainer::guard)"]),
            ("outer", &["(library only: Trainer::outer)"]),
            ("easgd", &["(library only: Trainer::easgd)"]),
            ("overlap", &["overlap"]),
            ("fragments", &["fragments"]),
            ("max_grad_norm", &["(library only: Trainer::max_grad_norm)"]),
            ("prefetch", &["prefetch"]),
            ("staging", &["staging"]),
            ("max_failures", &["max-failures"]),
            ("standby", &["standby"]),
            ("term", &["(the controller's term: 0, one more in a standby's run after a takeover)"]),
            ("eval_every", &["eval-every"]),
            ("eval_rank", &["(library only: Trainer::eval_rank)"]),
            (
                "checkpoint",
                &[
                    "checkpoint-dir",
                    "checkpoint-every",
                    "checkpoint-every-reduces",
                    "keep-checkpoints",
                ],
            ),
            ("train", &["(the dataset: data, records, train-subset)"]),
            ("test", &["(the dataset: data, test-subset)"]),
            ("data", &["(the dataset's checksums: computed from the loaded samples)"]),
            ("model", &["(the model: hidden, momentum, --model)"]),
        ];
        let spec = serde_json::to_value(flodl_ddp::RunSpec::default())?;
        let fields: Vec<&String> = spec.as_object().map(|m| m.keys().collect()).unwrap_or_default();
        for field in &fields {
            let row = reached.iter().find(|(name, _)| name == field);
            assert!(row.is_some(), "RunSpec::{field} has no key and no reason in this table");
        }
        for (field, by) in reached {
            assert!(fields.iter().any(|f| *f == field), "{field} is not a RunSpec field");
            for key in by.iter().filter(|k| !k.starts_with('(')) {
                assert!(keys.iter().any(|k| k == key), "RunSpec::{field}: {key} is no setting");
            }
        }
        Ok(())
    }

    /// The one map from the library's fields to `fdl`'s flags names a real flag for each
    /// field a setting reaches, and the rules the library owns come back in the flag's name.
    #[test]
    fn library_errors_name_the_flag() -> Result<()> {
        let cases: [(&[&str], &str); 12] = [
            (&["--epochs", "0"], "--epochs:"),
            (&["--batch-size", "0"], "--batch-size:"),
            (&["--lr", "0"], "--lr:"),
            (&["--warmup-epochs", "10"], "--warmup-epochs:"),
            (&["--warmup-epochs", "-1"], "--warmup-epochs:"),
            (&["--slowdown", "1,0.5"], "--slowdown:"),
            (&["--watchdog", "1e20"], "--watchdog:"),
            (&["--eval-every", "0"], "--eval-every:"),
            (&["--ranks", "0"], "--ranks:"),
            (&["--checkpoint-every", "2"], "--checkpoint-every: needs --checkpoint-dir"),
            (&["--keep-checkpoints", "2"], "--keep-checkpoints: needs --checkpoint-dir"),
            (
                &["--checkpoint-dir", "ck", "--checkpoint-every-reduces", "0"],
                "--checkpoint-every-reduces:",
            ),
        ];
        for (args, start) in cases {
            let err = checked(args).err().map(|e| format!("{e:#}")).unwrap_or_default();
            assert!(err.starts_with(start), "{args:?}: {err:?}");
        }
        Ok(())
    }

    #[test]
    fn bad_values_are_rejected_with_the_key_named() -> Result<()> {
        let cases: [(&[&str], &str); 7] = [
            (&["--slowdown", "1,x"], "slowdown"),
            (&["--hidden", "0"], "hidden"),
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
            ("epoch = 3\n", vec!["line 1", "unknown key `epoch`"]),
            ("epochs = 2\npolicy = \"often\"\n", vec!["line 2", "`policy`", "often"]),
            ("slowdown = \"1,x\"\n", vec!["line 1", "`slowdown`", "x"]),
            ("epochs = \"x\"\n", vec!["line 1", "`epochs`"]),
            ("seed = 1\nhidden = true\n", vec!["line 2", "`hidden`"]),
            ("[checkpoint]\nevery = 2\n", vec!["line 1", "checkpoint"]),
            ("epochs = [\n", vec!["line 1"]),
        ];
        for (text, needles) in files {
            let file = write(text)?;
            let err = resolve(&with_file(&file), &RunFlags::default()).err();
            let err = err.map(|e| format!("{e:#}")).unwrap_or_default();
            assert!(needles.iter().all(|n| err.contains(n)), "{text:?}: {err:?}");
            assert_eq!(err.lines().count(), 1, "{text:?}: {err:?}");
        }
        Ok(())
    }

    #[test]
    fn devices_are_checked_against_the_per_rank_keys() -> Result<()> {
        let base = |f: &dyn Fn(&mut TrainConfig)| {
            let mut cfg = defaults();
            cfg.run.ranks = Some(2);
            f(&mut cfg);
            cfg
        };
        let cases = [
            (base(&|c| c.run.ranks = Some(0)), "--ranks"),
            (base(&|c| c.local.fail_rank = Some(vec![FailAt { rank: 2, batch: 1 }])), "2@1"),
            (
                base(&|c| (c.run.ranks, c.run.devices) = (None, Some(vec![Device::Cuda(99)]))),
                "cuda:99",
            ),
        ];
        for (cfg, key) in cases {
            let err = cfg.devices().err().map(|e| format!("{e:#}"));
            assert!(err.as_deref().is_some_and(|e| e.contains(key)), "{key}: {err:?}");
        }
        assert!(base(&|_| ()).devices().is_ok_and(|d| d == [Device::Cpu, Device::Cpu]));
        Ok(())
    }
}

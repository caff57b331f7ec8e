//! `Trainer::settings` tried on a real trainer: each setting reaches the spec, and each one
//! that cannot run names its field (beside `settings.rs`, whose own tests need no trainer).

use std::sync::Arc;

use flodl_data::mnist::{self, Mnist, Split, Verify};
use flodl_data::{Dataset, Subset};

use crate::Error;
use crate::config_error::{ConfigError, Field, Problem};
use crate::control::policy::Policy;
use crate::control::schedule::Schedule;
use crate::control::schedule_kind::ScheduleKind;
use crate::runtime::settings::RunSettings;
use crate::runtime::spec::RunSpec;
use crate::runtime::trainer::Trainer;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The settings of a TOML text applied to a trainer of 512 MNIST images, and its spec.
fn spec_of(text: &str) -> Result<std::result::Result<RunSpec, ConfigError>> {
    let settings: RunSettings = toml::from_str(text)?;
    let images = Mnist::load(mnist::vendored_dir(), Split::Train, Verify::Skip)?;
    let data: Arc<dyn Dataset> = Arc::new(Subset::first(images, 512));
    let spec = Trainer::cooperative().dataset(data).settings(&settings).and_then(|t| t.spec());
    match spec {
        Ok(spec) => Ok(Ok(spec)),
        Err(Error::Invalid(e)) => Ok(Err(e)),
        Err(e) => Err(e.into()),
    }
}

#[test]
fn settings_become_the_spec() -> Result<()> {
    let spec = spec_of(
        "ranks = 2\nepochs = 2\nbatch-size = 32\nseed = 3\npolicy = \"sync\"\n\
         slowdown = \"1, 2\"\nwatchdog = 2.5\nmax-failures = 1\neval-every = 2\n",
    )??;
    assert_eq!((spec.world(), spec.epochs, spec.batch_size, spec.seed), (2, 2, 32, 3));
    assert_eq!((spec.policy, spec.slowdown.clone()), (Policy::Sync, vec![1.0, 2.0]));
    assert_eq!((spec.max_failures, spec.eval_every), (1, 2));
    assert_eq!(spec.watchdog, std::time::Duration::from_millis(2500));
    // A rate alone is a constant schedule, through f32 as `learning_rate` takes it.
    let spec = spec_of("lr = 0.05\n")??;
    assert_eq!(spec.schedule, Schedule::Constant { lr: f64::from(0.05f32) });
    // A named schedule spans the run: 2 epochs of 512 / 64 batches, the first 4 warmup.
    let spec = spec_of("lr = 0.05\nschedule = \"cosine\"\nepochs = 2\nwarmup-epochs = 0.5\n")??;
    let want = ScheduleKind::Cosine.build(0.05, 16, 4);
    assert_eq!(Some(spec.schedule), want);
    let spec = spec_of("checkpoint-dir = \"ck\"\ncheckpoint-every-reduces = 5\n")??;
    let saves = spec.checkpoint.ok_or("no checkpoints")?;
    assert_eq!(
        (saves.every.every_epochs, saves.every.every_reduces.map(|n| n.get())),
        (None, Some(5))
    );
    assert_eq!(saves.keep, 3);
    Ok(())
}

#[test]
fn settings_that_cannot_run_name_their_field() -> Result<()> {
    let needs = Problem::Needs { other: Field::Checkpoint, to_be: "given" };
    let cases = [
        ("ranks = 2\ndevices = [\"cpu\"]\n", Field::Devices, None),
        ("watchdog = 1e20\n", Field::Watchdog, None),
        ("watchdog = -1\n", Field::Watchdog, None),
        ("watchdog = 0\n", Field::Watchdog, None),
        ("epochs = 2\nwarmup-epochs = 2\n", Field::WarmupEpochs, None),
        ("warmup-epochs = nan\n", Field::WarmupEpochs, None),
        ("checkpoint-every = 2\n", Field::CheckpointEvery, Some(needs.clone())),
        ("keep-checkpoints = 2\n", Field::KeepCheckpoints, Some(needs)),
        ("checkpoint-dir = \"ck\"\ncheckpoint-every-reduces = 0\n", Field::CheckpointEvery, None),
        ("checkpoint-dir = \"ck\"\nkeep-checkpoints = 0\n", Field::KeepCheckpoints, None),
        ("lr = 0\n", Field::LearningRate, None),
        ("schedule = \"step\"\nlr = -1\n", Field::LearningRate, None),
        ("epochs = 0\n", Field::Epochs, None),
        ("ranks = 0\n", Field::Devices, None),
    ];
    for (text, field, problem) in cases {
        let e = spec_of(text)?.err().ok_or_else(|| format!("{text:?} was accepted"))?;
        assert_eq!(e.field, field, "{text:?}: {e}");
        if let Some(problem) = problem {
            assert_eq!(e.problem, problem, "{text:?}");
        }
    }
    Ok(())
}

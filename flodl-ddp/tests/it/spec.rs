//! The run specification: what `Trainer::spec` resolves, its serde round trips, and which
//! options its two hashes cover.

use crate::common::{TestResult, train_subset};

use std::time::Duration;

use flodl_data::Split;
use flodl_ddp::checkpoint::{Checkpoint, SaveInterval};
use flodl_ddp::control::guard::{Guard, TrendGuard};
use flodl_ddp::control::outer::OuterKind;
use flodl_ddp::control::schedule::Schedule;
use flodl_ddp::{
    Backend, ConfigError, Devices, ElCheKnobs, Error, EvalRank, Field, Machine, Mlp, MlpConfig,
    ModelSize, Optimizer, Policy, Prefetch, Problem, RunSpec, Trainer,
};
use flodl_tensor::Device;

fn base() -> Trainer {
    Trainer::new(Mlp::factory(MlpConfig::new(&[784, 16, 10], Optimizer::sgd(0.9))))
        .dataset(train_subset(512))
        .batch_size(32)
        .epochs(2)
        .devices(Devices::Cpu(2))
        .policy(Policy::Cadence)
        .backend(Backend::Host)
        .seed(5)
        .learning_rate(0.05)
}

/// `spec` resolves the defaults a run would use and refuses what `run` refuses.
#[test]
fn spec_resolves_the_run_without_running_it() -> TestResult {
    let spec = base().stall_timeout(Duration::from_secs(10)).spec()?;
    assert_eq!(spec.devices, vec![Device::Cpu, Device::Cpu]);
    assert_eq!(spec.schedule, Schedule::Constant { lr: f64::from(0.05f32) });
    assert_eq!(spec.watchdog, Duration::from_secs(10), "the watchdog is at most the stall timeout");
    assert_eq!(spec.guard, Guard::Trend(TrendGuard::new(0.05)));
    assert_eq!((spec.train.samples, spec.batches_per_epoch(), spec.world()), (512, 16, 2));
    let names: Vec<&str> = spec.train.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["image", "label"]);
    assert_eq!((spec.test.as_ref(), spec.checkpoint.as_ref()), (None, None));
    let spec = base().lr_scale_ratio(1.0).easgd(0.5).spec()?;
    assert_eq!(spec.lr_scale, 2.0);
    assert_eq!(spec.guard, Guard::Trend(TrendGuard::new(0.3)), "EASGD's default guard");
    let refused: [(&str, Trainer); 3] = [
        ("no dataset", Trainer::new(Mlp::factory(MlpConfig::new(&[784, 10], Optimizer::sgd(0.0))))),
        ("zero batch", base().batch_size(0)),
        ("EASGD on the collective backend", base().backend(Backend::Collective).easgd(0.5)),
    ];
    for (what, trainer) in refused {
        assert!(trainer.spec().is_err(), "{what} was accepted");
    }
    Ok(())
}

/// A small machine to check against: 2 cores, 1 GiB free for the CPU.
fn small_machine() -> Machine {
    Machine { cores: 2, free_memory: vec![(Device::Cpu, 1 << 30)] }
}

/// Every rule of `RunSpec::check`, one row each: the option set wrong, and the field the
/// refusal names. A row's trainer differs from the accepted base in that option only.
#[test]
fn check_names_the_field_of_every_refused_option() -> TestResult {
    let huge = MlpConfig::new(&[784, 100_000, 100_000, 10], Optimizer::sgd(0.9)).size();
    let cases: Vec<(&str, Trainer, Field)> = vec![
        (
            "no dataset",
            Trainer::new(Mlp::factory(MlpConfig::new(&[784, 10], Optimizer::sgd(0.0)))),
            Field::Dataset,
        ),
        ("zero batch", base().batch_size(0), Field::BatchSize),
        ("one batch short", base().batch_size(512), Field::BatchSize),
        ("zero epochs", base().epochs(0), Field::Epochs),
        ("no rank", base().devices(Devices::Cpu(0)), Field::Devices),
        ("1000 CPU ranks on 2 cores", base().devices(Devices::Cpu(1000)), Field::Devices),
        ("eval rank 2 of 2", base().eval_rank(EvalRank::Fixed(2)), Field::EvalRank),
        ("standby on rank 0", base().standby(flodl_ddp::Standby::Rank(0)), Field::Standby),
        ("standby rank 2 of 2", base().standby(flodl_ddp::Standby::Rank(2)), Field::Standby),
        ("slowdown 0.5", base().slowdown(vec![1.0, 0.5]), Field::Slowdown),
        ("slowdown NaN", base().slowdown(vec![1.0, f64::NAN]), Field::Slowdown),
        ("three factors for two ranks", base().slowdown(vec![1.0; 3]), Field::Slowdown),
        ("lr 0", base().learning_rate(0.0), Field::LearningRate),
        ("lr -1", base().learning_rate(-1.0), Field::LearningRate),
        ("lr inf", base().learning_rate(f32::INFINITY), Field::LearningRate),
        (
            "cosine from 0",
            base().schedule(Schedule::Cosine { lr: 0.0, min_lr: 0.0, total: 10 }.with_warmup(2)),
            Field::LearningRate,
        ),
        (
            "cosine to a negative rate",
            base().schedule(Schedule::Cosine { lr: 0.1, min_lr: -1.0, total: 10 }),
            Field::Schedule,
        ),
        ("scale ratio -1", base().lr_scale_ratio(-1.0), Field::LrScaleRatio),
        ("anchor 0", base().elche(ElCheKnobs { anchor: 0, ..Default::default() }), Field::Elche),
        (
            "overhead target 0.005",
            base().elche(ElCheKnobs { overhead_target: 0.005, ..Default::default() }),
            Field::OverheadTarget,
        ),
        (
            "overhead target 0.6",
            base().elche(ElCheKnobs { overhead_target: 0.6, ..Default::default() }),
            Field::OverheadTarget,
        ),
        (
            "overhead target NaN",
            base().elche(ElCheKnobs { overhead_target: f64::NAN, ..Default::default() }),
            Field::OverheadTarget,
        ),
        ("stall timeout 0", base().stall_timeout(Duration::ZERO), Field::StallTimeout),
        (
            "stall timeout a year",
            base().stall_timeout(Duration::from_secs(365 * 86_400)),
            Field::StallTimeout,
        ),
        ("snapshot timeout 0", base().snapshot_timeout(Duration::ZERO, 3), Field::SnapshotTimeout),
        ("watchdog 0", base().watchdog(Duration::ZERO), Field::Watchdog),
        ("watchdog 1e20 s", base().watchdog(Duration::MAX), Field::Watchdog),
        ("gamma NaN", base().gamma(f64::NAN), Field::Gamma),
        ("outer lr 0", base().outer(OuterKind::Nesterov { lr: 0.0, momentum: 0.9 }), Field::Outer),
        ("easgd 2", base().easgd(2.0), Field::Easgd),
        ("easgd on collective", base().backend(Backend::Collective).easgd(0.5), Field::Easgd),
        ("max grad norm 0", base().max_grad_norm(0.0), Field::MaxGradNorm),
        ("no fragment", base().fragments(0), Field::Fragments),
        (
            "fragments on collective",
            base().backend(Backend::Collective).fragments(2),
            Field::Fragments,
        ),
        (
            "fragments under Nesterov",
            base().outer(OuterKind::Nesterov { lr: 0.7, momentum: 0.9 }).fragments(2),
            Field::Fragments,
        ),
        ("keep 0 bundles", base().checkpoint_dir("ck").keep_checkpoints(0), Field::KeepCheckpoints),
        ("a 121 GB model in 1 GiB", base().model_size(huge), Field::ModelSize),
        (
            "two 0.75 GiB replicas in 1 GiB",
            base().model_size(ModelSize { parameters: 1 << 26, state_per_parameter: 1 }),
            Field::ModelSize,
        ),
    ];
    for (what, trainer, field) in cases {
        match trainer.spec_on(&small_machine()) {
            Err(Error::Invalid(ConfigError { field: named, problem })) => {
                assert_eq!(named, field, "{what}: {problem}");
            }
            other => return Err(format!("{what}: {other:?}").into()),
        }
    }
    // The limits themselves run: 32 CPU ranks on 2 cores, one 0.75 GiB replica in 1 GiB.
    let one = ModelSize { parameters: 1 << 26, state_per_parameter: 1 };
    let edge = base().batch_size(8).devices(Devices::Cpu(32)).slowdown(Vec::new());
    assert_eq!(edge.spec_on(&small_machine())?.world(), 32);
    assert!(base().devices(Devices::Cpu(1)).model_size(one).spec_on(&small_machine()).is_ok());
    // The refusal of a model too large names both sizes.
    let err = base().model_size(huge).spec_on(&small_machine()).err().map(|e| e.to_string());
    let want = "model_size: 2 replica(s) on cpu need 225.3 GiB";
    assert!(err.as_deref().is_some_and(|e| e.contains(want)), "{err:?}");
    let problem = Problem::TooManyRanks { ranks: 1000, cores: 2, max: 32 };
    let err = base().devices(Devices::Cpu(1000)).spec_on(&small_machine()).err();
    assert!(matches!(err, Some(Error::Invalid(ConfigError { problem: p, .. })) if p == problem));
    Ok(())
}

/// A spec with every option set survives bincode 2 and JSON unchanged, hashes the same after
/// either, and its JSON names the closed sets as `fdl` spells them.
#[test]
fn spec_round_trips_through_bincode_and_json() -> TestResult {
    let spec = base()
        .test_dataset(std::sync::Arc::new(crate::common::mnist(Split::Test)), 2)
        .devices(Devices::List(vec![Device::Cpu, Device::Cuda(1)]))
        .schedule(Schedule::Cosine { lr: 0.1, min_lr: 0.001, total: 100 }.with_warmup(5))
        .elche(ElCheKnobs {
            speed_hint: Some((1, 2.5)),
            max_overshoot: Some(3),
            ..Default::default()
        })
        .slowdown(vec![1.0, 2.5])
        .snapshot_timeout(Duration::from_millis(1500), 4)
        .watchdog(Duration::from_secs(7))
        .gamma(0.5)
        .outer(OuterKind::nesterov())
        .easgd(0.25)
        .max_grad_norm(1.5)
        .prefetch(Prefetch::Depth(3))
        .max_failures(1)
        .eval_rank(EvalRank::Fixed(1))
        .checkpoint_dir("ck")
        .checkpoint_every(SaveInterval::every_reduces(7))
        .keep_checkpoints(2)
        .model_size(ModelSize { parameters: 1000, state_per_parameter: 1 })
        .spec()?;
    let config = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(&spec, config)?;
    let (back, read): (RunSpec, usize) = bincode::serde::decode_from_slice(&bytes, config)?;
    assert_eq!((&back, read), (&spec, bytes.len()), "bincode");
    let json = serde_json::to_string(&spec)?;
    let from_json: RunSpec = serde_json::from_str(&json)?;
    assert_eq!(from_json, spec, "json");
    assert_eq!((back.hash()?, from_json.hash()?), (spec.hash()?, spec.hash()?));
    let value: serde_json::Value = serde_json::from_str(&json)?;
    assert_eq!(value["policy"], "cadence");
    assert_eq!(value["backend"], "host");
    assert_eq!(value["devices"], serde_json::json!(["cpu", "cuda:1"]));
    assert_eq!(value["prefetch"], serde_json::json!({ "depth": 3 }));
    assert_eq!(value["eval_rank"], serde_json::json!({ "fixed": 1 }));
    // Prefetch's text form (`fdl --prefetch`) round-trips too.
    for prefetch in [Prefetch::Auto, Prefetch::Off, Prefetch::Depth(0), Prefetch::Depth(7)] {
        assert_eq!(prefetch.to_string().parse::<Prefetch>()?, prefetch);
    }
    assert!("lots".parse::<Prefetch>().is_err());
    Ok(())
}

/// Which options the checkpoint compatibility hash covers (what the trajectory depends on) and
/// which it leaves out (a bundle resumes into a longer run, on other devices and another world
/// size, with other timeouts), while the whole-spec hash changes with every option.
#[test]
fn compat_hash_covers_what_the_trajectory_depends_on() -> TestResult {
    type Change = fn(Trainer) -> Trainer;
    let same: [(&str, Change); 12] = [
        ("world", |t| t.devices(Devices::Cpu(3))),
        ("speed hint", |t| {
            t.elche(ElCheKnobs { speed_hint: Some((1, 2.0)), ..Default::default() })
        }),
        ("epochs", |t| t.epochs(5)),
        ("slowdown", |t| t.slowdown(vec![1.0, 3.0])),
        ("stall timeout", |t| t.stall_timeout(Duration::from_secs(9))),
        ("watchdog", |t| t.watchdog(Duration::from_secs(3))),
        ("prefetch", |t| t.prefetch(Prefetch::Off)),
        ("max failures", |t| t.max_failures(0)),
        ("evaluation", |t| t.test_dataset(train_subset(64), 3)),
        ("checkpoints", |t| t.checkpoint_dir("elsewhere")),
        ("guard", |t| t.guard(Guard::Off)),
        ("devices", |t| t.devices(Devices::List(vec![Device::Cpu, Device::Cuda(0)]))),
    ];
    let differ: [(&str, Change); 13] = [
        ("policy", |t| t.policy(Policy::Async)),
        ("backend", |t| t.backend(Backend::Collective)),
        ("batch size", |t| t.batch_size(16)),
        ("training set", |t| t.dataset(train_subset(480))),
        ("seed", |t| t.seed(6)),
        ("learning rate", |t| t.learning_rate(0.1)),
        ("schedule", |t| t.schedule(Schedule::Cosine { lr: 0.05, min_lr: 0.0, total: 32 })),
        ("lr scaling", |t| t.lr_scale_ratio(1.0)),
        ("gamma", |t| t.gamma(0.0)),
        ("outer", |t| t.outer(OuterKind::slow_momentum())),
        ("easgd", |t| t.easgd(0.5)),
        ("clipping", |t| t.max_grad_norm(1.0)),
        ("elche", |t| t.elche(ElCheKnobs { anchor: 4, ..Default::default() })),
    ];
    let reference = base().spec()?;
    let cases = same.iter().map(|c| (c, true)).chain(differ.iter().map(|c| (c, false)));
    for ((what, change), compatible) in cases {
        let changed = change(base()).spec()?;
        assert_eq!(
            changed.compat_hash()? == reference.compat_hash()?,
            compatible,
            "{what}: compat hash"
        );
        assert_ne!(changed.hash()?, reference.hash()?, "{what}: spec hash");
    }
    assert_eq!(base().spec()?.hash()?, reference.hash()?, "the hash is deterministic");
    Ok(())
}

/// The bundles a run writes carry its spec's compatibility hash.
#[test]
fn bundles_record_the_compat_hash() -> TestResult {
    let dir = tempfile::tempdir()?;
    let trainer = base().epochs(1).checkpoint_dir(dir.path());
    let expected = trainer.spec()?.compat_hash()?;
    trainer.run()?.join()?;
    let bundle = Checkpoint::read(&dir.path().join("latest.fdlck"))?;
    assert_eq!(bundle.config_hash, expected);
    Ok(())
}

/// The collective engine follows the devices: NCCL for distinct GPUs (and each process's own
/// GPU in a cluster run) when built with CUDA, the host all-reduce for CPU ranks, shared GPUs
/// and mixed worlds (flagged), none on the host backend.
#[test]
fn collective_engine_follows_the_devices() -> TestResult {
    use flodl_ddp::CollectiveEngine;
    let nccl = if cfg!(feature = "cuda") {
        CollectiveEngine::Nccl
    } else {
        CollectiveEngine::Host { mixed: false }
    };
    let cases: [(Vec<Device>, Backend, Option<CollectiveEngine>); 5] = [
        (vec![Device::Cpu; 2], Backend::Collective, Some(CollectiveEngine::Host { mixed: false })),
        (vec![Device::Cuda(0), Device::Cuda(1)], Backend::Collective, Some(nccl)),
        (
            vec![Device::Cuda(0), Device::Cuda(0)],
            Backend::Collective,
            Some(CollectiveEngine::Host { mixed: false }),
        ),
        (
            vec![Device::Cuda(0), Device::Cpu],
            Backend::Collective,
            Some(CollectiveEngine::Host { mixed: true }),
        ),
        (vec![Device::Cuda(0), Device::Cpu], Backend::Host, None),
    ];
    for (devices, backend, want) in cases {
        let spec = base().devices(Devices::List(devices.clone())).backend(backend).spec()?;
        assert_eq!(spec.collective_engine(), want, "{devices:?} {backend:?}");
    }
    Ok(())
}

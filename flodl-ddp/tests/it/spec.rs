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
    Backend, Devices, ElCheKnobs, EvalRank, Mlp, MlpConfig, Optimizer, Policy, Prefetch, RunSpec,
    Trainer,
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

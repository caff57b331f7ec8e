//! Numerical divergence: a non-finite loss, or non-finite parameters at a reduce, stop the run
//! with a typed error naming the rank and step; a checkpointed run keeps its last good bundle.

use crate::common::{TestResult, train_subset};

use std::time::Duration;

use flodl_ddp::checkpoint::{Checkpoint, SaveInterval, SaveReason};
use flodl_ddp::{
    Backend, Batch, Devices, Divergence, Error, Mlp, MlpConfig, Optimizer, Policy, Replica,
    ReplicaContext, Result, Trainer,
};
use flodl_tensor::{DType, Tensor};

/// An MLP at learning rate 1e30 (`fdl train --lr 1e30`): within a few steps its loss is not
/// finite, and the run ends with `Diverged` naming a rank of the run, alone or with peers, on
/// every policy and backend.
#[test]
fn a_huge_learning_rate_stops_the_run() -> TestResult {
    let data = train_subset(2048);
    let cases = [
        (1, Policy::Sync, Backend::Collective),
        (2, Policy::Sync, Backend::Collective),
        (2, Policy::Cadence, Backend::Host),
        (2, Policy::Async, Backend::Collective),
    ];
    for (ranks, policy, backend) in cases {
        let r = Trainer::new(Mlp::factory(MlpConfig::new(&[784, 64, 10], Optimizer::sgd(0.9))))
            .dataset(data.clone())
            .batch_size(32)
            .epochs(3)
            .devices(Devices::Cpu(ranks))
            .policy(policy)
            .backend(backend)
            .learning_rate(1e30)
            .stall_timeout(Duration::from_secs(60))
            .run()?
            .join();
        let what = format!("{ranks} ranks {policy:?} {backend:?}");
        let found = match &r {
            Err(Error::Diverged { rank, step, cause, bundle: None }) => {
                Some((*rank, *step, *cause))
            }
            _ => None,
        };
        let Some((rank, step, cause)) = found else {
            return Err(format!("{what}: not a divergence: {:?}", r.map(|_| "finished")).into());
        };
        assert!(rank < ranks && step < 64, "{what}: rank {rank} step {step}");
        assert!(
            matches!(cause, Divergence::Loss(l) if !l.is_finite())
                || cause == Divergence::Parameters,
            "{what}: {cause:?}"
        );
    }
    Ok(())
}

/// A replica with one parameter that trains at a finite loss, and whose rank `poisoned` writes
/// NaN into its parameter at its `at`-th optimizer step.
struct Poisoned {
    p: Vec<Tensor>,
    at: Option<usize>,
    steps: usize,
}

impl Poisoned {
    fn factory(poisoned: usize, at: usize) -> impl Fn(&ReplicaContext) -> Result<Poisoned> {
        move |ctx| {
            let p = vec![Tensor::zeros(&[4], DType::F32, &ctx.stream)?];
            Ok(Poisoned { p, at: (ctx.rank == poisoned).then_some(at), steps: 0 })
        }
    }
}

impl Replica for Poisoned {
    fn train_step(&mut self, _batch: &Batch) -> Result<f32> {
        Ok(0.5)
    }
    fn step(&mut self, lr: f32) -> Result<()> {
        self.steps += 1;
        let poison = self.at == Some(self.steps);
        for x in self.p[0].as_mut_slice::<f32>()? {
            *x = if poison { f32::NAN } else { *x - lr };
        }
        Ok(())
    }
    fn parameters(&self) -> &[Tensor] {
        &self.p
    }
    fn parameters_mut(&mut self) -> &mut [Tensor] {
        &mut self.p
    }
}

/// Whether every parameter value of a bundle's model is finite.
fn finite_model(ckpt: &Checkpoint) -> bool {
    ckpt.params
        .records()
        .iter()
        .all(|r| r.to_f32_vec().is_some_and(|v| v.iter().all(|x| x.is_finite())))
}

/// Rank 1's parameters turn NaN at its 5th step while its loss stays finite: the check at the
/// reduce stops the run (on the host backend rank 1's own snapshot is refused; on the collective
/// backend every rank holds the NaN average and the first to report it is named). Checkpointed
/// after every reduce, the run saved no bundle of the NaN state: `latest.fdlck` and the failure
/// bundle it names hold finite parameters.
#[test]
fn non_finite_parameters_stop_the_run_and_keep_the_last_good_bundle() -> TestResult {
    for backend in [Backend::Collective, Backend::Host] {
        let dir = tempfile::tempdir()?;
        let r = Trainer::new(Poisoned::factory(1, 5))
            .dataset(train_subset(1024))
            .batch_size(16)
            .epochs(2)
            .devices(Devices::Cpu(2))
            .policy(Policy::Sync)
            .backend(backend)
            .learning_rate(0.01)
            .stall_timeout(Duration::from_secs(60))
            .checkpoint_dir(dir.path())
            .checkpoint_every(SaveInterval::every_reduces(1))
            .run()?
            .join();
        let found = match &r {
            Err(Error::Diverged { rank, step, cause: Divergence::Parameters, bundle }) => {
                Some((*rank, *step, bundle.clone()))
            }
            _ => None,
        };
        let Some((rank, step, bundle)) = found else {
            let r = r.map(|_| "finished");
            return Err(format!("{backend:?}: not a divergence of the parameters: {r:?}").into());
        };
        let named_rank = match backend {
            Backend::Host => rank == 1,
            Backend::Collective => rank < 2,
        };
        assert!(named_rank, "{backend:?}: rank {rank}");
        // Both ranks train one batch per step under Sync: rank 1's 5th step is cohort step 9 or 10.
        assert!((9..=10).contains(&step), "{backend:?}: step {step}");
        let bundle = bundle.ok_or("no failure bundle")?;
        assert!(bundle.ends_with("failure.fdlck"), "{}", bundle.display());
        let failure = Checkpoint::read(&bundle)?;
        assert_eq!(failure.reason, SaveReason::Diverged, "{backend:?}");
        let latest = Checkpoint::read(&dir.path().join("latest.fdlck"))?;
        assert!(finite_model(&failure) && finite_model(&latest), "{backend:?}: a NaN bundle");
        assert_eq!(failure.reduce_version, latest.reduce_version, "{backend:?}");
        assert_eq!(latest.reduce_version, 4, "{backend:?}: the reduces before the poisoned one");
    }
    Ok(())
}

//! Evaluations on the elected rank, and epoch callbacks.

use crate::common::{TestResult, mnist, train_subset};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flodl_data::Split;
use flodl_ddp::{
    Backend, Batch, BatchEval, Devices, EpochMetrics, Error, EvalRank, Mlp, MlpConfig, Optimizer,
    Policy, Replica, ReplicaContext, Result, Trainer,
};
use flodl_tensor::Tensor;

/// The ranks that evaluated a batch, in order.
type Evaluators = Arc<Mutex<Vec<usize>>>;

/// An `Mlp` that records its rank whenever it evaluates a batch.
struct Watched {
    inner: Mlp,
    rank: usize,
    seen: Evaluators,
}

impl Replica for Watched {
    fn train_step(&mut self, batch: &Batch) -> Result<f32> {
        self.inner.train_step(batch)
    }
    fn step(&mut self, lr: f32) -> Result<()> {
        self.inner.step(lr)
    }
    fn parameters(&self) -> &[Tensor] {
        self.inner.parameters()
    }
    fn parameters_mut(&mut self) -> &mut [Tensor] {
        self.inner.parameters_mut()
    }
    fn gradients(&self) -> &[Tensor] {
        self.inner.gradients()
    }
    fn optimizer_state(&self) -> &[Tensor] {
        self.inner.optimizer_state()
    }
    fn optimizer_state_mut(&mut self) -> &mut [Tensor] {
        self.inner.optimizer_state_mut()
    }
    fn evaluate_batch(&mut self, batch: &Batch) -> Result<Option<BatchEval>> {
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(self.rank);
        }
        self.inner.evaluate_batch(batch)
    }
}

fn watched(policy: Policy, backend: Backend, slowdown: Vec<f64>) -> (Trainer, Evaluators) {
    let seen: Evaluators = Arc::default();
    let record = seen.clone();
    let factory = move |ctx: &ReplicaContext| -> Result<Watched> {
        let cfg = MlpConfig::new(&[784, 32, 10], Optimizer::sgd(0.9));
        let inner = Mlp::new(&cfg, ctx.batch_size, ctx.seed, &ctx.stream)?;
        Ok(Watched { inner, rank: ctx.rank, seen: record.clone() })
    };
    let test: Arc<dyn flodl_data::Dataset> =
        Arc::new(flodl_data::Subset::first(mnist(Split::Test), 256));
    let trainer = Trainer::new(factory)
        .dataset(train_subset(3072))
        .test_dataset(test, 1)
        .batch_size(32)
        .epochs(3)
        .devices(Devices::Cpu(3))
        .policy(policy)
        .backend(backend)
        .learning_rate(0.05)
        .slowdown(slowdown)
        .stall_timeout(Duration::from_secs(30));
    (trainer, seen)
}

/// The fastest rank (rank 1: the others are slowed 3×) evaluates every epoch in every mode,
/// once it has been measured; a fixed rank evaluates every epoch.
#[test]
fn the_elected_rank_evaluates() -> TestResult {
    for policy in [Policy::Sync, Policy::Cadence, Policy::Async] {
        for backend in [Backend::Collective, Backend::Host] {
            let what = format!("{policy:?} {backend:?}");
            let (t, seen) = watched(policy, backend, vec![3.0, 1.0, 3.0]);
            let state = t.run()?.join()?;
            assert!(state.epochs.iter().all(|e| e.eval.is_some()), "{what}: an epoch lacks eval");
            let seen = seen.lock().map_err(|_| "poisoned")?;
            assert!(!seen.is_empty(), "{what}: nothing evaluated");
            assert!(seen.iter().all(|&r| r == 1), "{what}: evaluated on {seen:?}");

            let (t, seen) = watched(policy, backend, vec![1.0, 1.0, 3.0]);
            t.eval_rank(EvalRank::Fixed(2)).run()?.join()?;
            let seen = seen.lock().map_err(|_| "poisoned")?;
            assert!(!seen.is_empty() && seen.iter().all(|&r| r == 2), "{what}: fixed on {seen:?}");
        }
    }
    let (t, _) = watched(Policy::Sync, Backend::Collective, Vec::new());
    assert!(matches!(t.eval_rank(EvalRank::Fixed(3)).run(), Err(Error::Config(_))));
    Ok(())
}

/// The epoch callback sees every epoch once, in order, with its evaluation, exactly as the
/// handle and the final state do; a world of one calls it too.
#[test]
fn epoch_callback_sees_every_epoch() -> TestResult {
    for ranks in [1, 3] {
        let called: Arc<Mutex<Vec<EpochMetrics>>> = Arc::default();
        let record = called.clone();
        let (t, _) = watched(Policy::Cadence, Backend::Collective, Vec::new());
        let mut handle = t
            .devices(Devices::Cpu(ranks))
            .on_epoch(move |m| {
                if let Ok(mut c) = record.lock() {
                    c.push(m.clone());
                }
            })
            .run()?;
        let mut streamed = Vec::new();
        while let Some(m) = handle.next_metrics(Duration::from_secs(60)) {
            streamed.push(m);
        }
        let state = handle.join()?;
        let called = called.lock().map_err(|_| "poisoned")?;
        assert_eq!(called.iter().map(|m| m.epoch).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!(called.iter().all(|m| m.eval.is_some()), "{ranks} ranks: no eval");
        assert!(called[0].at_ms > 0.0, "{ranks} ranks: no completion time");
        assert!(called.windows(2).all(|w| w[0].at_ms < w[1].at_ms), "{ranks} ranks: times");
        assert_eq!(*called, streamed, "{ranks} ranks");
        assert_eq!(*called, state.epochs, "{ranks} ranks");
    }
    Ok(())
}

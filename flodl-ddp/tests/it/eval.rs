//! Evaluations on the elected rank, and epoch callbacks.

use crate::common::{TestResult, mnist, train_subset};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flodl_data::Split;
use flodl_ddp::{
    Backend, Batch, BatchEval, Devices, EpochMetrics, Error, EvalRank, Mlp, MlpConfig, Optimizer,
    Policy, Replica, ReplicaContext, Result, Trainer,
};
use flodl_tensor::{Stream, Tensor};

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
    assert!(matches!(t.eval_rank(EvalRank::Fixed(3)).run(), Err(Error::Invalid(_))));
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

/// A linear scorer `s = w·x` on two features, evaluated by hand: it predicts 1 when `s > 0`,
/// and a sample's loss is `(s − label)²`. It records the shapes of the batches it sees.
struct Scorer {
    w: Vec<Tensor>,
    stream: Stream,
    evaluates: bool,
    seen: Vec<(Vec<usize>, Vec<usize>)>,
}

impl Replica for Scorer {
    fn train_step(&mut self, _batch: &Batch) -> Result<f32> {
        Ok(0.0)
    }
    fn step(&mut self, _lr: f32) -> Result<()> {
        Ok(())
    }
    fn parameters(&self) -> &[Tensor] {
        &self.w
    }
    fn parameters_mut(&mut self) -> &mut [Tensor] {
        &mut self.w
    }
    fn evaluate_batch(&mut self, batch: &Batch) -> Result<Option<BatchEval>> {
        if !self.evaluates {
            return Ok(None);
        }
        // Field order is the layout's: the label first here, then the features.
        let (labels, x) = (batch.field(0)?, batch.field(1)?);
        self.seen.push((labels.shape().to_vec(), x.shape().to_vec()));
        let labels = labels.to_vec::<i32>(&self.stream)?;
        let x = x.to_vec::<f32>(&self.stream)?;
        let w = self.w[0].to_vec::<f32>(&self.stream)?;
        let mut eval = BatchEval { loss_sum: 0.0, correct: 0, samples: batch.len() };
        for (label, xi) in labels.iter().zip(x.chunks(2)) {
            let s = w[0] * xi[0] + w[1] * xi[1];
            eval.loss_sum += f64::from((s - *label as f32).powi(2));
            eval.correct += usize::from(i32::from(s > 0.0) == *label);
        }
        Ok(Some(eval))
    }
}

/// `flodl_ddp::evaluate` on a five-sample dataset, against a hand computation: with
/// `w = (1, −1)` the scores are 1, −3, 0, 4, −0.5 for labels 1, 0, 1, 0, 0, so the losses are
/// 0, 9, 1, 16, 0.25 (mean 5.25) and three predictions are right (accuracy 0.6), whatever the
/// batch size; the batches arrive in layout order, the label (a scalar, i32) as `[n]`, the
/// features as `[n, 2]`, the last batch shorter. A replica that does not evaluate gives `None`;
/// a zero batch size is a configuration error.
#[test]
fn evaluate_matches_a_hand_computation() -> TestResult {
    use flodl_data::{Field, InMemory, SampleLayout, Values};
    use flodl_tensor::DType;
    let layout = SampleLayout::new(vec![
        Field::new("label", &[], DType::I32),
        Field::new("x", &[2], DType::F32),
    ])?;
    let labels = Values::I32(vec![1, 0, 1, 0, 0]);
    let x = Values::F32(vec![2.0, 1.0, 0.0, 3.0, 1.0, 1.0, 4.0, 0.0, 0.0, 0.5]);
    let data = InMemory::new(layout, vec![labels, x])?;
    let stream = Stream::cpu_with_threads(1);
    let scorer = |evaluates| -> Result<Scorer> {
        let w = vec![Tensor::from_slice(&[1.0f32, -1.0], &[2], &stream)?];
        Ok(Scorer { w, stream: stream.clone(), evaluates, seen: Vec::new() })
    };
    // (batch size, the batches' label and feature shapes)
    let cases: [(usize, &[usize]); 3] = [(2, &[2, 2, 1]), (5, &[5]), (64, &[5])];
    for (batch_size, sizes) in cases {
        let mut replica = scorer(true)?;
        let eval = flodl_ddp::evaluate(&mut replica, &data, batch_size, &stream)?
            .ok_or("no evaluation")?;
        assert_eq!(eval.samples, 5, "batch size {batch_size}");
        assert!((eval.loss - 5.25).abs() < 1e-9, "batch size {batch_size}: {eval:?}");
        assert!((eval.accuracy - 0.6).abs() < 1e-12, "batch size {batch_size}: {eval:?}");
        let expected: Vec<(Vec<usize>, Vec<usize>)> =
            sizes.iter().map(|&n| (vec![n], vec![n, 2])).collect();
        assert_eq!(replica.seen, expected, "batch size {batch_size}");
    }
    let mut silent = scorer(false)?;
    assert_eq!(flodl_ddp::evaluate(&mut silent, &data, 2, &stream)?, None);
    let zero = flodl_ddp::evaluate(&mut scorer(true)?, &data, 0, &stream);
    assert!(matches!(zero, Err(Error::Invalid(_))), "{zero:?}");
    Ok(())
}

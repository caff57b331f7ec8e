//! The cooperative tier: the user's own loop (plain Rust softmax regression and SGD, written
//! here) trains every rank through a `Worker`, in every policy × backend, and a worker that
//! stops calling in or panics is a dead rank.

use crate::common::{TestResult, mnist, train_subset};
use crate::softmax::SoftmaxRegression;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flodl_data::{Dataset, HostBatch, Split, Subset};
use flodl_ddp::HostTensor;
use flodl_ddp::{
    Backend, Batch, Devices, EpochMetrics, Error, Parameters, Policy, Result, Trainer, Worker,
    record_scalar,
};
use flodl_tensor::Device;

const FEATURES: usize = 784;
const CLASSES: usize = 10;

/// Softmax regression held as plain vectors: `W` (`[784, 10]`, row-major) then `b` (`[10]`).
struct Linear {
    params: Vec<Vec<f32>>,
}

impl Linear {
    fn zeros() -> Linear {
        Linear { params: vec![vec![0.0; FEATURES * CLASSES], vec![0.0; CLASSES]] }
    }

    /// The shapes and initial values the run starts from.
    fn initial() -> Vec<HostTensor> {
        let z = Linear::zeros();
        vec![
            HostTensor { shape: vec![FEATURES, CLASSES], data: z.params[0].clone() },
            HostTensor { shape: vec![CLASSES], data: z.params[1].clone() },
        ]
    }

    /// Class probabilities of image `x`.
    fn probabilities(&self, x: &[f32]) -> [f32; CLASSES] {
        let (w, b) = (&self.params[0], &self.params[1]);
        let mut z = [0.0f32; CLASSES];
        z.copy_from_slice(b);
        for (i, &xi) in x.iter().enumerate() {
            if xi != 0.0 {
                let row = &w[i * CLASSES..(i + 1) * CLASSES];
                z.iter_mut().zip(row).for_each(|(z, w)| *z += xi * w);
            }
        }
        let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = z
            .iter_mut()
            .map(|v| {
                *v = (*v - max).exp();
                *v
            })
            .sum();
        z.iter_mut().for_each(|v| *v /= sum);
        z
    }

    /// Forward, backward and an SGD step at `lr` is split by the tier: this is the forward and
    /// backward, returning the mean loss and the gradients.
    fn loss_and_grads(&self, xs: &[f32], ys: &[i32]) -> (f32, Vec<Vec<f32>>) {
        let n = ys.len();
        let mut grads = vec![vec![0.0; FEATURES * CLASSES], vec![0.0; CLASSES]];
        let mut loss = 0.0;
        for (x, &y) in xs.chunks_exact(FEATURES).zip(ys) {
            let mut p = self.probabilities(x);
            loss -= p[y as usize].max(1e-12).ln();
            p[y as usize] -= 1.0;
            for (i, &xi) in x.iter().enumerate() {
                if xi != 0.0 {
                    let row = &mut grads[0][i * CLASSES..(i + 1) * CLASSES];
                    row.iter_mut().zip(&p).for_each(|(g, p)| *g += xi * p / n as f32);
                }
            }
            grads[1].iter_mut().zip(&p).for_each(|(g, p)| *g += p / n as f32);
        }
        (loss / n as f32, grads)
    }

    fn sgd(&mut self, grads: &[Vec<f32>], lr: f32) {
        for (p, g) in self.params.iter_mut().zip(grads) {
            p.iter_mut().zip(g).for_each(|(p, g)| *p -= lr * g);
        }
    }

    /// Accuracy on `data`'s first `n` samples.
    fn accuracy(&self, data: &dyn Dataset, n: usize) -> Result<f64> {
        let mut host = HostBatch::new(data.layout(), Device::Cpu);
        let picks: Vec<usize> = (0..n).collect();
        data.fetch(&picks, &mut host)?;
        let (xs, ys) = (host.f32(0)?, host.i32(1)?);
        let correct = xs
            .chunks_exact(FEATURES)
            .zip(ys)
            .filter(|(x, y)| {
                let p = self.probabilities(x);
                let best = (0..CLASSES).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap_or(0);
                best == **y as usize
            })
            .count();
        Ok(correct as f64 / n as f64)
    }
}

/// The user's model lends its vectors.
impl Parameters for Linear {
    fn count(&self) -> usize {
        self.params.count()
    }
    fn read(&self, index: usize, out: &mut [f32]) -> Result<()> {
        self.params.read(index, out)
    }
    fn write(&mut self, index: usize, values: &[f32]) -> Result<()> {
        self.params.write(index, values)
    }
}

/// How a user's loop behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Conduct {
    /// Trains every step it is handed.
    Faithful,
    /// Stops calling in after this many steps, holding its worker for `hold`.
    FallsSilent { after: usize, hold: Duration },
    /// Panics after this many steps (its worker is dropped while unwinding).
    Panics { after: usize },
}

/// One step of the user's loop: the batch's images and labels through the model.
fn train(model: &mut Linear, batch: &Batch) -> Result<(f32, Vec<Vec<f32>>)> {
    let xs = batch.field(0)?.as_slice::<f32>()?;
    let ys = batch.field(1)?.as_slice::<i32>()?;
    Ok(model.loss_and_grads(xs, ys))
}

/// The user's loop for one rank, on its own thread; returns the steps it trained.
fn user_loop(mut worker: Worker, conduct: Conduct) -> JoinHandle<Result<usize>> {
    std::thread::spawn(move || {
        let mut model = Linear::zeros();
        let mut steps = 0;
        while let Some(step) = worker.next_step(&mut model)? {
            match conduct {
                Conduct::FallsSilent { after, hold } if steps == after => {
                    std::thread::sleep(hold);
                    return Ok(steps);
                }
                Conduct::Panics { after } if steps == after => panic!("the user's loop panics"),
                _ => {}
            }
            let (loss, grads) = train(&mut model, step.batch())?;
            record_scalar("user_loss", f64::from(loss));
            let lr = step.finish(loss)?;
            model.sgd(&grads, lr);
            steps += 1;
        }
        Ok(steps)
    })
}

fn trainer(ranks: usize, policy: Policy, backend: Backend, data: Arc<dyn Dataset>) -> Trainer {
    Trainer::cooperative()
        .dataset(data)
        .batch_size(32)
        .epochs(2)
        .devices(Devices::Cpu(ranks))
        .policy(policy)
        .backend(backend)
        .learning_rate(0.1)
        .stall_timeout(Duration::from_secs(60))
}

/// The parts of an epoch's metrics both tiers must fill: a row per rank, with compute time,
/// throughput and a time breakdown wherever it trained; the epoch's loss and the user's
/// scalar. Every rank trains in the run, but not necessarily in every epoch: a starved slow
/// rank may find the next epoch's spans all taken by the fast one (the dispatcher runs one
/// epoch ahead), which is the scheduler doing its job.
fn check_metrics(what: &str, epochs: &[EpochMetrics], ranks: usize, scalar: Option<&str>) {
    let mut trained = vec![0usize; ranks];
    for e in epochs {
        assert_eq!(e.ranks.len(), ranks, "{what}: epoch {}", e.epoch);
        assert!(e.avg_loss.is_finite() && e.avg_loss > 0.0, "{what}: loss {}", e.avg_loss);
        for r in &e.ranks {
            assert_eq!(r.samples > 0, r.batches > 0, "{what}: rank {} counts", r.rank);
            if r.batches > 0 {
                assert!(r.compute_ms > 0.0 && r.throughput > 0.0, "{what}: rank {} timing", r.rank);
                assert!(r.time.wall_ms() > 0.0, "{what}: rank {} time breakdown", r.rank);
            }
            trained[r.rank] += r.batches;
        }
        if let Some(name) = scalar {
            let v = e.scalars.get(name).copied().unwrap_or(f64::NAN);
            assert!(v.is_finite() && v > 0.0, "{what}: scalar {name} = {v}");
        }
    }
    for (rank, batches) in trained.iter().enumerate() {
        assert!(*batches > 0, "{what}: rank {rank} trained nothing in the run");
    }
}

/// Every policy × backend on 2 CPU ranks, one slowed 2×: the user's loop trains a model
/// past 80% test accuracy, every sample is trained, reduces happen, the metrics are those of
/// the `Replica` tier (which trains the same model in the same mode beside it).
#[test]
fn cooperative_trains_in_every_mode() -> TestResult {
    let data = train_subset(4096);
    let test: Arc<dyn Dataset> = Arc::new(Subset::first(mnist(Split::Test), 1000));
    for policy in [Policy::Sync, Policy::Cadence, Policy::Async] {
        for backend in [Backend::Collective, Backend::Host] {
            let what = format!("{policy:?} {backend:?}");
            let t0 = Instant::now();
            let mut run = trainer(2, policy, backend, data.clone())
                .slowdown(vec![1.0, 2.0])
                .run_cooperative(Linear::initial())?;
            let loops: Vec<_> =
                run.workers.drain(..).map(|w| user_loop(w, Conduct::Faithful)).collect();
            let state = run.handle.join()?;
            let steps: usize = loops
                .into_iter()
                .map(|h| h.join().map_err(|_| "a user loop panicked")?.map_err(Into::into))
                .sum::<std::result::Result<usize, Box<dyn std::error::Error>>>()?;
            assert_eq!(steps, 2 * 4096 / 32, "{what}: steps of the user loops");
            assert_eq!(state.samples, 2 * 4096, "{what}");
            assert!(state.reduces > 0, "{what}");
            assert!(state.faults.is_empty(), "{what}: {:?}", state.faults);
            check_metrics(&what, &state.epochs, 2, Some("user_loss"));
            let model = Linear { params: state.params.iter().map(|p| p.data.clone()).collect() };
            let acc = model.accuracy(test.as_ref(), 1000)?;
            let loss = state.epochs.last().map_or(f64::NAN, |e| e.avg_loss);
            assert!(acc > 0.8, "{what}: accuracy {acc}");
            assert!(loss < 0.8, "{what}: loss {loss}");
            eprintln!("{what}: accuracy {acc:.3}, loss {loss:.3}, {:?}", t0.elapsed());

            // The Replica tier in the same mode fills the same metrics.
            let replica = Trainer::new(SoftmaxRegression::new)
                .dataset(data.clone())
                .batch_size(32)
                .epochs(2)
                .devices(Devices::Cpu(2))
                .policy(policy)
                .backend(backend)
                .learning_rate(0.1)
                .slowdown(vec![1.0, 2.0])
                .run()?
                .join()?;
            check_metrics(&format!("{what} replica tier"), &replica.epochs, 2, None);
            assert_eq!(replica.epochs.len(), state.epochs.len(), "{what}");
            assert_eq!(replica.samples, state.samples, "{what}");
        }
    }
    Ok(())
}

/// A user loop that stops calling in, or panics, is a dead rank: the survivors finish the run,
/// which reports the death.
#[test]
fn a_worker_that_stops_is_a_dead_rank() -> TestResult {
    let data = train_subset(3072);
    let hold = Duration::from_secs(10);
    let cases = [
        (Policy::Cadence, Backend::Collective, Conduct::FallsSilent { after: 5, hold }),
        (Policy::Async, Backend::Host, Conduct::FallsSilent { after: 5, hold }),
        (Policy::Sync, Backend::Host, Conduct::Panics { after: 3 }),
        (Policy::Cadence, Backend::Collective, Conduct::Panics { after: 3 }),
    ];
    for (policy, backend, conduct) in cases {
        let what = format!("{policy:?} {backend:?} {conduct:?}");
        let mut run = trainer(3, policy, backend, data.clone())
            .watchdog(Duration::from_secs(3))
            .run_cooperative(Linear::initial())?;
        let loops: Vec<_> = run
            .workers
            .drain(..)
            .enumerate()
            .map(|(r, w)| user_loop(w, if r == 2 { conduct } else { Conduct::Faithful }))
            .collect();
        let state = run.handle.join()?;
        assert_eq!(state.faults.len(), 1, "{what}: {:?}", state.faults);
        assert_eq!(state.faults[0].rank, 2, "{what}");
        assert_eq!(state.epochs.len(), 2, "{what}: the survivors finish the run");
        for (r, h) in loops.into_iter().enumerate() {
            let outcome = h.join();
            match (r, conduct) {
                (2, Conduct::Panics { .. }) => assert!(outcome.is_err(), "{what}"),
                _ => {
                    let steps = outcome.map_err(|_| "a user loop panicked")??;
                    assert!(steps > 0, "{what}: rank {r} trained nothing");
                }
            }
        }
    }
    Ok(())
}

/// A step dropped without its loss is refused at the next call, with a typed error.
#[test]
fn an_unfinished_step_is_refused() -> TestResult {
    let mut run = trainer(1, Policy::Sync, Backend::Collective, train_subset(256))
        .watchdog(Duration::from_secs(2))
        .run_cooperative(Linear::initial())?;
    let mut worker = run.workers.pop().ok_or("no worker")?;
    let mut model = Linear::zeros();
    let step = worker.next_step(&mut model)?.ok_or("no step")?;
    drop(step);
    let refused = worker.next_step(&mut model);
    assert!(matches!(refused, Err(Error::StepUnfinished { rank: 0 })), "{refused:?}");
    drop(worker);
    let ended = run.handle.join();
    assert!(ended.is_err(), "a world of one whose worker is gone fails: {ended:?}");
    Ok(())
}

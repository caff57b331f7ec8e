//! Prefetching ranks on CPU: same batches and model as the synchronous path, full coverage under
//! skew, and data failures or starvation ending the run with a typed error.

use crate::common::{TestResult, train_subset};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flodl_data::{Dataset, HostBatch, SampleLayout};
use flodl_ddp::{
    Backend, Devices, Error, FailureKind, Mlp, MlpConfig, Optimizer, Policy, Prefetch, SampleAudit,
    Trainer,
};

fn trainer(ranks: usize, policy: Policy, backend: Backend, data: Arc<dyn Dataset>) -> Trainer {
    let mlp = MlpConfig::new(&[784, 64, 10], Optimizer::sgd(0.9));
    Trainer::new(Mlp::factory(mlp))
        .dataset(data)
        .batch_size(32)
        .epochs(2)
        .devices(Devices::Cpu(ranks))
        .policy(policy)
        .backend(backend)
        .learning_rate(0.05)
        .stall_timeout(Duration::from_secs(60))
}

/// Every batch a run trains, per rank, in order: `(epoch, sample indices)`.
type Trace = Arc<Mutex<Vec<Vec<(usize, Vec<usize>)>>>>;

fn tracing_audit(ranks: usize) -> (Trace, SampleAudit) {
    let trace: Trace = Arc::new(Mutex::new(vec![Vec::new(); ranks]));
    let log = trace.clone();
    let audit: SampleAudit = Arc::new(move |rank, epoch, picks: &[usize]| {
        let mut t = log.lock().unwrap_or_else(|e| e.into_inner());
        t[rank].push((epoch, picks.to_vec()));
    });
    (trace, audit)
}

/// With prefetching forced on CPU ranks, a `Sync` run trains the same batches in the same order
/// and ends with bitwise the same parameters as the synchronous run (one rank: the solo path).
#[test]
fn prefetch_is_bitwise_the_synchronous_run() -> TestResult {
    let data = train_subset(1536);
    let cases = [(1, Backend::Collective), (2, Backend::Collective), (2, Backend::Host)];
    for (ranks, backend) in cases {
        let mut runs = Vec::new();
        for prefetch in [Prefetch::Off, Prefetch::Depth(2), Prefetch::Depth(0)] {
            let (trace, audit) = tracing_audit(ranks);
            let state = trainer(ranks, Policy::Sync, backend, data.clone())
                .seed(9)
                .prefetch(prefetch)
                .sample_audit(audit)
                .run()?
                .join()?;
            let trace = trace.lock().unwrap_or_else(|e| e.into_inner()).clone();
            runs.push((prefetch, state, trace));
        }
        let (_, off, off_trace) = &runs[0];
        assert_eq!(off_trace.iter().map(Vec::len).sum::<usize>(), 2 * (1536 / 32));
        for (prefetch, state, trace) in &runs[1..] {
            let what = format!("{ranks} ranks {backend:?} {prefetch:?}");
            assert_eq!(trace, off_trace, "{what}: batches differ");
            assert_eq!(state.params.len(), off.params.len(), "{what}");
            for (a, b) in state.params.iter().zip(&off.params) {
                assert_eq!(a.shape, b.shape, "{what}");
                assert!(
                    a.data.iter().zip(&b.data).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{what}: parameters differ"
                );
            }
        }
    }
    Ok(())
}

/// `Cadence` (and `Async`) with prefetching on and a 2.5× skew train every sample exactly once
/// per epoch (the tail smaller than a batch aside), on both backends.
#[test]
fn prefetch_covers_every_sample_once_per_epoch_under_skew() -> TestResult {
    let n = 2048 + 13;
    let data = train_subset(n);
    let epochs = 3;
    for policy in [Policy::Cadence, Policy::Async] {
        for backend in [Backend::Collective, Backend::Host] {
            let seen: Arc<Mutex<Vec<Vec<u32>>>> = Arc::new(Mutex::new(vec![vec![0; n]; epochs]));
            let log = seen.clone();
            let audit: SampleAudit = Arc::new(move |_rank, epoch, picks: &[usize]| {
                let mut s = log.lock().unwrap_or_else(|e| e.into_inner());
                for &p in picks {
                    s[epoch][p] += 1;
                }
            });
            let state = trainer(2, policy, backend, data.clone())
                .epochs(epochs)
                .slowdown(vec![1.0, 2.5])
                .prefetch(Prefetch::Depth(2))
                .sample_audit(audit)
                .run()?
                .join()?;
            let what = format!("{policy:?} {backend:?}");
            assert_eq!(state.epochs.len(), epochs, "{what}");
            let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            for (e, counts) in seen.iter().enumerate() {
                assert!(counts.iter().all(|&c| c <= 1), "{what} epoch {e}: a sample twice");
                let once = counts.iter().filter(|&&c| c == 1).count();
                assert_eq!(once, n / 32 * 32, "{what} epoch {e}");
            }
        }
    }
    Ok(())
}

/// How the test dataset misbehaves once it has served `after` fetches.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Every later fetch fails.
    Fail,
    /// Every later fetch takes this long (far past the stall timeout).
    Stall(Duration),
}

/// A dataset that misbehaves from its `after`-th fetch on.
struct Faulty {
    inner: Arc<dyn Dataset>,
    fetches: AtomicUsize,
    after: usize,
    fault: Fault,
}

impl Dataset for Faulty {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn layout(&self) -> &SampleLayout {
        self.inner.layout()
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> flodl_data::Result<()> {
        if self.fetches.fetch_add(1, Ordering::AcqRel) >= self.after {
            match self.fault {
                Fault::Fail => {
                    return Err(flodl_data::Error::Io {
                        path: "faulty".into(),
                        source: std::io::Error::other("injected read failure"),
                    });
                }
                // Emulates a stalled disk; the rank's deadline is what is tested.
                Fault::Stall(d) => std::thread::sleep(d),
            }
        }
        self.inner.fetch(indices, out)
    }
}

/// Whether a run's failure is a timeout waiting for `what`, on the run's one rank or as a
/// rank's failure description.
fn timed_out_on(err: &Error, what: &str) -> bool {
    match err {
        Error::Timeout { what: w, .. } => *w == what,
        Error::Rank { failure, .. } => {
            failure.kind == FailureKind::Timeout && failure.message.contains(what)
        }
        _ => false,
    }
}

/// A dataset whose fetch fails mid-epoch ends a prefetching run with that data error, in every
/// policy and on one rank too (no hang).
#[test]
fn failing_fetch_ends_the_run_with_a_typed_error() -> TestResult {
    let batches = 1024 / 32;
    for ranks in [1, 2] {
        for policy in [Policy::Sync, Policy::Cadence, Policy::Async] {
            for prefetch in [Prefetch::Depth(2), Prefetch::Depth(0), Prefetch::Off] {
                let data: Arc<dyn Dataset> = Arc::new(Faulty {
                    inner: train_subset(1024),
                    fetches: AtomicUsize::new(0),
                    after: batches / 2,
                    fault: Fault::Fail,
                });
                let what = format!("{ranks} ranks {policy:?} {prefetch:?}");
                let err = trainer(ranks, policy, Backend::Collective, data)
                    .prefetch(prefetch)
                    .max_failures(0)
                    .run()?
                    .join()
                    .err()
                    .ok_or_else(|| format!("{what}: a failing fetch must fail the run"))?;
                assert!(
                    matches!(&err, Error::Data(flodl_data::Error::Io { .. }))
                        || matches!(&err, Error::Rank { failure, .. }
                            if failure.kind == FailureKind::Data),
                    "{what}: {err}"
                );
            }
        }
    }
    Ok(())
}

/// A rank whose prefetched batch does not come within the stall timeout fails with a timeout
/// (and services its control channel meanwhile, so the run ends instead of hanging).
#[test]
fn starved_rank_times_out() -> TestResult {
    for ranks in [1, 2] {
        let data: Arc<dyn Dataset> = Arc::new(Faulty {
            inner: train_subset(1024),
            fetches: AtomicUsize::new(0),
            after: 8,
            fault: Fault::Stall(Duration::from_secs(3)),
        });
        let err = trainer(ranks, Policy::Cadence, Backend::Collective, data)
            .prefetch(Prefetch::Depth(1))
            .stall_timeout(Duration::from_millis(500))
            .max_failures(0)
            .run()?
            .join()
            .err()
            .ok_or("a starved rank must fail the run")?;
        assert!(timed_out_on(&err, "a prefetched batch"), "{ranks} ranks: {err}");
    }
    Ok(())
}

/// On a CUDA rank (`Auto` prefetches there: pinned staging, async upload, ready event), a `Sync`
/// run trains the same batches as with prefetching off, and its parameters match to f32
/// rounding. Without a usable GPU it prints `skipped: <reason>` and passes (fails under
/// `FLODL_REQUIRE_GPU=1`).
#[test]
fn cuda_rank_prefetches_the_same_batches() -> TestResult {
    if let Some(reason) = flodl_tensor::gpu_skip_reason() {
        flodl_tensor::skip_or_fail(&reason);
        return Ok(());
    }
    let data = train_subset(2048);
    let devices = vec![flodl_tensor::Device::Cuda(0), flodl_tensor::Device::Cpu];
    let mut runs = Vec::new();
    for prefetch in [Prefetch::Off, Prefetch::Auto, Prefetch::Depth(0)] {
        let (trace, audit) = tracing_audit(devices.len());
        let state = trainer(2, Policy::Sync, Backend::Host, data.clone())
            .devices(Devices::List(devices.clone()))
            .prefetch(prefetch)
            .sample_audit(audit)
            .run()?
            .join()?;
        let trace = trace.lock().unwrap_or_else(|e| e.into_inner()).clone();
        runs.push((prefetch, state, trace));
    }
    let (_, off, off_trace) = &runs[0];
    for (prefetch, state, trace) in &runs[1..] {
        assert_eq!(trace, off_trace, "{prefetch:?}: batches differ");
        for (a, b) in state.params.iter().zip(&off.params) {
            let worst = a
                .data
                .iter()
                .zip(&b.data)
                .map(|(x, y)| (f64::from(*x) - f64::from(*y)).abs() / (1.0 + f64::from(*y).abs()))
                .fold(0.0, f64::max);
            assert!(worst < 1e-4, "{prefetch:?}: parameters differ by {worst}");
        }
    }
    Ok(())
}

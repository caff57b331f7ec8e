//! Staging on: ranks read a record file on disk through a cache filled ahead from the
//! coordinator's advisories. Every sample is trained exactly once per epoch (under skew, with
//! prefetching composed, through a death and a resume), the staging thread reads ahead, and
//! the epochs report each rank's data-starve time and hit ratio.

use crate::common::{TestResult, train_subset};

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flodl_data::{Access, Dataset, HostBatch, RecordFile, SampleLayout, write_records};
use flodl_ddp::checkpoint::{Checkpoint, SaveInterval};
use flodl_ddp::{
    Backend, Devices, FailingReplica, Failure, Mlp, MlpConfig, Optimizer, Policy, Prefetch,
    ReplicaContext, ResumeFrom, SampleAudit, Staging, TrainedState, Trainer,
};

const SAMPLES: usize = 2048 + 13;
const BATCH: usize = 32;
const EPOCHS: usize = 3;

/// A dataset that counts the samples its staging thread (`flodl-staging`) fetched.
struct ReadAhead {
    inner: Arc<dyn Dataset>,
    staged: Arc<AtomicUsize>,
}

impl Dataset for ReadAhead {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn layout(&self) -> &SampleLayout {
        self.inner.layout()
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> flodl_data::Result<()> {
        if std::thread::current().name() == Some("flodl-staging") {
            self.staged.fetch_add(indices.len(), Ordering::Relaxed);
        }
        self.inner.fetch(indices, out)
    }

    fn fetch_cost(&self) -> flodl_data::FetchCost {
        self.inner.fetch_cost()
    }
}

/// The first `SAMPLES` training images written to a record file in `dir`, opened buffered.
fn records(dir: &Path) -> Result<Arc<dyn Dataset>, Box<dyn std::error::Error>> {
    let path = dir.join("train.fdr");
    write_records(train_subset(SAMPLES).as_ref(), &path, 1, &|_, _| Ok(()))?;
    Ok(Arc::new(RecordFile::open(&path, Access::Buffered)?))
}

/// A quarter of the dataset's bytes: the cache holds a fraction of what each rank reads.
fn budget(data: &dyn Dataset) -> u64 {
    (data.len() * data.layout().sample_bytes() / 4) as u64
}

/// 3 CPU ranks of the reference MLP on `data`, rank 1 at half speed, rank `dies` failing at
/// its step `at` when given.
fn trainer(
    policy: Policy,
    backend: Backend,
    data: Arc<dyn Dataset>,
    dies: Option<(usize, usize)>,
) -> Trainer {
    let build = Mlp::factory(MlpConfig::new(&[784, 32, 10], Optimizer::sgd(0.9)));
    let factory = move |ctx: &ReplicaContext| {
        let at = dies.filter(|(rank, _)| *rank == ctx.rank).map(|(_, at)| at);
        Ok(FailingReplica::new(build(ctx)?, at, Failure::Error))
    };
    let budget = budget(data.as_ref());
    Trainer::new(factory)
        .dataset(data)
        .batch_size(BATCH)
        .epochs(EPOCHS)
        .devices(Devices::Cpu(3))
        .policy(policy)
        .backend(backend)
        .learning_rate(0.05)
        .seed(9)
        .slowdown(vec![1.0, 2.0, 1.0])
        .staging(Staging::bytes(budget))
        .stall_timeout(Duration::from_secs(30))
        .watchdog(Duration::from_secs(5))
}

/// Per epoch, the samples trained (all ranks together), in any order.
type Seen = Arc<Mutex<BTreeMap<usize, Vec<usize>>>>;

fn audited() -> (Seen, SampleAudit) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let audit: SampleAudit = Arc::new(move |_rank, epoch, picks: &[usize]| {
        let mut s = log.lock().unwrap_or_else(|e| e.into_inner());
        s.entry(epoch).or_default().extend_from_slice(picks);
    });
    (seen, audit)
}

/// Every rank that trained reports where its samples came from (all of them: hits and misses
/// sum to its reported samples) and a data-starve time equal to its breakdown's data part.
fn check_metrics(state: &TrainedState, what: &str) -> Result<(), String> {
    for e in &state.epochs {
        for r in &e.ranks {
            if r.data_starve_ms != r.time.data_ms {
                return Err(format!("{what} epoch {}: rank {} starve != data", e.epoch, r.rank));
            }
            let Some(c) = r.cache else {
                // Only a rank that reported nothing (a dead rank's held batches) has none.
                if r.compute_ms > 0.0 {
                    return Err(format!(
                        "{what} epoch {}: rank {} has no cache tally",
                        e.epoch, r.rank
                    ));
                }
                continue;
            };
            if (c.hits + c.misses) as usize > r.samples || r.hit_ratio != Some(c.hit_ratio()) {
                return Err(format!("{what} epoch {}: rank {} tally {c:?}", e.epoch, r.rank));
            }
        }
    }
    Ok(())
}

/// Under skew, with progressive dispatch (`Cadence`, `Async`) and the static cut (`Sync`), on
/// both backends, with and without prefetching, staging trains every sample exactly once per
/// epoch, the staging thread reads ahead along the advisories, and the cache tallies add up.
#[test]
fn staging_trains_every_sample_once_per_epoch() -> TestResult {
    let dir = tempfile::tempdir()?;
    let file = records(dir.path())?;
    let cases = [
        (Policy::Cadence, Backend::Collective, Prefetch::Off),
        (Policy::Async, Backend::Host, Prefetch::Depth(2)),
        (Policy::Sync, Backend::Collective, Prefetch::Depth(1)),
    ];
    for (policy, backend, prefetch) in cases {
        let what = format!("{policy:?} {backend:?} {prefetch:?}");
        let staged = Arc::new(AtomicUsize::new(0));
        let data: Arc<dyn Dataset> =
            Arc::new(ReadAhead { inner: file.clone(), staged: staged.clone() });
        let (seen, audit) = audited();
        let state = trainer(policy, backend, data, None)
            .prefetch(prefetch)
            .sample_audit(audit)
            .run()?
            .join()?;
        assert_eq!(state.epochs.len(), EPOCHS, "{what}");
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        for epoch in 0..EPOCHS {
            let mut got = seen.get(&epoch).cloned().unwrap_or_default();
            got.sort_unstable();
            let perm = flodl_data::epoch_permutation(SAMPLES, 9, epoch as u64);
            let mut want = perm[..SAMPLES / BATCH * BATCH].to_vec();
            want.sort_unstable();
            assert_eq!(got, want, "{what} epoch {epoch}: not every sample exactly once");
        }
        assert!(staged.load(Ordering::Relaxed) > 0, "{what}: the staging thread read nothing");
        check_metrics(&state, &what)?;
    }
    Ok(())
}

/// With staging on, a rank that dies mid-run leaves the survivors to train its unfinished
/// work (re-dispatched and re-advised): no sample is trained twice by the survivors and every
/// epoch after the death trains every sample exactly once. Resumed from a bundle of that run,
/// a staged run trains exactly the positions the bundle's coverage leaves open.
#[test]
fn staging_survives_a_death_and_a_resume() -> TestResult {
    let dir = tempfile::tempdir()?;
    let data = records(dir.path())?;
    let ck = dir.path().join("ck");
    let total = SAMPLES / BATCH * BATCH;
    let what = "Cadence Host, rank 2 dies at step 8";
    let (seen, audit) = audited();
    let state = trainer(Policy::Cadence, Backend::Host, data.clone(), Some((2, 8)))
        .sample_audit(audit)
        .checkpoint_dir(&ck)
        .checkpoint_every(SaveInterval::every_reduces(4))
        .keep_checkpoints(1000)
        .run()?
        .join()?;
    assert_eq!(state.epochs.len(), EPOCHS, "{what}");
    assert_eq!(state.faults.len(), 1, "{what}: {:?}", state.faults);
    check_metrics(&state, what)?;
    {
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        for epoch in 0..EPOCHS {
            let mut counts = vec![0u32; SAMPLES];
            for &s in seen.get(&epoch).map_or(&[][..], Vec::as_slice) {
                counts[s] += 1;
            }
            let covered = counts.iter().filter(|&&c| c > 0).count();
            assert_eq!(covered, total, "{what} epoch {epoch}: positions left untrained");
            // Twice only for the dead rank's batches of a chunk it never finished.
            let twice = counts.iter().filter(|&&c| c > 1).count();
            assert!(twice <= 8 * BATCH, "{what} epoch {epoch}: {twice} samples twice");
            if epoch == EPOCHS - 1 {
                assert_eq!(twice, 0, "{what}: the last epoch trained a sample twice");
            }
        }
    }
    let mut bundles: Vec<_> = std::fs::read_dir(&ck)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("step-")))
        .collect();
    bundles.sort();
    let path = bundles.get(bundles.len() / 2).ok_or("no bundle saved")?.clone();
    let bundle = Checkpoint::read(&path)?;
    let (seen, audit) = audited();
    let resumed = trainer(Policy::Cadence, Backend::Host, data, None)
        .resume(ResumeFrom::File(path.clone()))
        .sample_audit(audit)
        .run()?
        .join()?;
    assert_eq!(resumed.epochs.len(), EPOCHS, "resumed");
    check_metrics(&resumed, "resumed")?;
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    for epoch in 0..EPOCHS {
        let perm = flodl_data::epoch_permutation(SAMPLES, 9, epoch as u64);
        let mut want: Vec<usize> = if (epoch as u64) < bundle.epoch {
            Vec::new()
        } else {
            match bundle.coverage_of(epoch as u64) {
                Some(c) => c.uncovered().iter().flat_map(|r| r.offset..r.offset + r.size).collect(),
                None => (0..total).collect(),
            }
        };
        for p in &mut want {
            *p = perm[*p];
        }
        want.sort_unstable();
        let mut got = seen.get(&epoch).cloned().unwrap_or_default();
        got.sort_unstable();
        assert_eq!(got, want, "resumed from {}: epoch {epoch}", path.display());
    }
    Ok(())
}

//! The checkpoint a run resumes from: which bundle, where it stands, and why one is refused.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, bail};
use flodl_ddp::checkpoint::{self, CheckpointError, RankMap};
use flodl_ddp::{Error, ResumeFrom};

/// The bundle a run resumes from, read and checked for integrity (not yet for compatibility).
#[derive(Debug, Clone)]
pub(crate) struct ResumePoint {
    /// The bundle file that is read (a directory's `latest.fdlck`, else its newest intact step
    /// bundle; see `flodl_ddp::checkpoint::locate`).
    pub(crate) bundle: PathBuf,
    /// Newer bundles of the directory that were passed over, with why.
    pub(crate) skipped: Vec<(PathBuf, String)>,
    /// The cohort step the bundle was saved at.
    pub(crate) step: u64,
    /// Epochs the bundle's run had completed.
    pub(crate) epochs_done: u64,
    /// Their metrics, as that run recorded them.
    pub(crate) epochs: Vec<flodl_ddp::EpochMetrics>,
    /// Ranks of the run that saved it.
    pub(crate) world: usize,
    /// Which of them saved an optimizer state (for the rank map of an elastic resume).
    pub(crate) saved: Vec<bool>,
    /// Their devices, when the bundle records them.
    pub(crate) devices: Option<Vec<String>>,
}

impl ResumePoint {
    /// Finds and reads the bundle `given` names, as the library does (and only reading).
    ///
    /// # Errors
    /// The path does not exist, a directory holds no bundle, or the bundle is unreadable or
    /// corrupt (the message names the file).
    pub(crate) fn locate(given: &Path) -> Result<Self> {
        if !given.exists() {
            bail!("cannot resume from {}: no such file or directory", given.display());
        }
        let found = checkpoint::locate(given).map_err(|e| match e {
            CheckpointError::NotFound { .. } => {
                anyhow!("cannot resume from {}: no checkpoint in it", given.display())
            }
            e => refusal(given, &e),
        })?;
        let ckpt = &found.checkpoint;
        let epochs = ckpt.epoch_metrics().map_err(|e| refusal(&found.path, &e))?;
        let devices = ckpt.saved_devices().map_err(|e| refusal(&found.path, &e))?;
        Ok(ResumePoint {
            epochs,
            world: ckpt.world_size,
            saved: ckpt.optimizer.iter().map(|s| !s.is_empty()).collect(),
            devices,
            skipped: found.skipped.into_iter().map(|(p, e)| (p, e.to_string())).collect(),
            step: found.checkpoint.global_step,
            epochs_done: found.checkpoint.epoch,
            bundle: found.path,
        })
    }

    /// What changes when this bundle resumes onto `devices` (one per rank), as one line, when
    /// anything does: "resuming 3 ranks onto 2: optimizer states 0←0, 1←1 (dropped: rank 2);
    /// devices cpu, cpu, cpu → cpu, cpu; ElChe re-calibrates; the rest of the open epochs is
    /// re-sharded".
    pub(crate) fn changes(&self, devices: &[String]) -> Option<String> {
        let map = RankMap::new(self.world, devices.len(), &self.saved);
        // Another count of the same devices is said by the map; other devices are named.
        let kinds = |d: &[String]| d.iter().cloned().collect::<std::collections::BTreeSet<_>>();
        let moved = self.devices.as_deref().is_some_and(|d| kinds(d) != kinds(devices));
        if map.same_world() && !moved {
            return None;
        }
        let mut line = format!("resuming {map}");
        if let Some(before) = self.devices.as_deref().filter(|_| moved) {
            line.push_str(&format!("; devices {} → {}", before.join(", "), devices.join(", ")));
        }
        if !map.same_world() {
            line.push_str("; ElChe re-calibrates; the rest of the open epochs is re-sharded");
        }
        Some(line)
    }

    /// What the trainer reads: the bundle located here (so the run resumes exactly the bundle
    /// shown).
    pub(crate) fn source(&self) -> ResumeFrom {
        ResumeFrom::File(self.bundle.clone())
    }
}

/// The one-line refusal of `bundle` for `error`.
fn refusal(bundle: &Path, error: &CheckpointError) -> anyhow::Error {
    let hint = match error {
        CheckpointError::ConfigMismatch { .. } | CheckpointError::TermMismatch { .. } => {
            " (policy, backend, batch size, training set, seed, lr, schedule and warmup must be \
             those of the run that saved it; every schedule but constant also spans --epochs; \
             ranks and devices may differ)"
        }
        CheckpointError::WorldSizeMismatch { .. } => {
            " (use as many ranks as the run that saved it)"
        }
        CheckpointError::SignatureMismatch { .. } => {
            " (use the hidden widths of the run that saved it)"
        }
        _ => "",
    };
    let why = match error {
        // The library's message carries two 64-digit hashes; the first 12 digits tell them apart.
        CheckpointError::ConfigMismatch { expected, found } => {
            let short =
                |h: &dyn std::fmt::Display| h.to_string().chars().take(12).collect::<String>();
            format!(
                "checkpoint was saved by a run with another configuration (hash {}, this run {})",
                short(found),
                short(expected)
            )
        }
        other => other.to_string(),
    };
    anyhow!("cannot resume from {}: {why}{hint}", bundle.display())
}

/// Turns a library error into the CLI's error: a checkpoint refusal names the bundle resumed
/// from, and an unrecoverable or diverged run names its failure bundle.
pub(crate) fn explain(error: Error, resume: Option<&ResumePoint>) -> anyhow::Error {
    match (error, resume) {
        (Error::Checkpoint(e), Some(point)) if is_refusal(&e) => refusal(&point.bundle, &e),
        (Error::Unrecoverable { reason, detail, bundle: Some(path), last }, _) => {
            // The detail often quotes the last error's root cause already.
            let cause = last
                .filter(|l| !detail.contains(&root_cause(l.as_ref())))
                .map(|l| format!(": {l}"))
                .unwrap_or_default();
            anyhow::Error::new(CannotGoOn(format!(
                "the run cannot go on ({reason:?}): {detail}{cause}; its state is saved in {} \
                 (resume with --resume {})",
                path.display(),
                path.display()
            )))
        }
        (Error::Diverged { rank, step, cause, bundle: Some(path) }, _) => anyhow!(
            "training diverged on rank {rank} at step {step}: {cause}; the last good state is \
             saved in {}",
            path.display()
        ),
        // The CLI stops and aborts runs only on a signal.
        (Error::Stopped { bundle }, _) => match crate::interrupt::first() {
            Some(signal) => {
                anyhow::Error::new(crate::interrupt::Interrupted { signal, bundle: Some(bundle) })
            }
            None => anyhow::Error::new(Error::Stopped { bundle }).context("training failed"),
        },
        (Error::Aborted, _) => match crate::interrupt::first() {
            Some(signal) => {
                anyhow::Error::new(crate::interrupt::Interrupted { signal, bundle: None })
            }
            None => anyhow::Error::new(Error::Aborted).context("training failed"),
        },
        (e, _) => anyhow::Error::new(e).context("training failed"),
    }
}

/// A run that ended because it could not go on (ranks lost, reduces stalled) with its state
/// saved: `fdl` exits with [`CannotGoOn::EXIT`], on which `fdl launch --mpi` restarts the job
/// from the checkpoint.
#[derive(Debug)]
pub(crate) struct CannotGoOn(String);

impl CannotGoOn {
    /// The exit status of such a run.
    pub(crate) const EXIT: u8 = 3;

    /// Whether `error` is such a run's.
    pub(crate) fn is(error: &anyhow::Error) -> bool {
        error.downcast_ref::<CannotGoOn>().is_some()
            || matches!(error.downcast_ref::<Error>(), Some(Error::Unrecoverable { .. }))
    }
}

impl std::fmt::Display for CannotGoOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CannotGoOn {}

/// The text of the innermost source of `error`.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut e = error;
    while let Some(source) = e.source() {
        e = source;
    }
    e.to_string()
}

/// Whether a checkpoint error says the bundle does not fit this run or cannot be read (as
/// opposed to a failure to save one).
fn is_refusal(error: &CheckpointError) -> bool {
    !matches!(error, CheckpointError::Io { .. } | CheckpointError::Encode { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    use flodl_ddp::RankFailure;
    use flodl_ddp::checkpoint::SaveReason;

    fn point() -> ResumePoint {
        ResumePoint {
            bundle: "ck/latest.fdlck".into(),
            skipped: Vec::new(),
            step: 10,
            epochs_done: 1,
            epochs: Vec::new(),
            world: 3,
            saved: vec![true; 3],
            devices: Some(vec!["cpu".into(); 3]),
        }
    }

    /// Each error maps to one line naming the right file and saying why.
    #[test]
    fn errors_become_one_line_naming_the_bundle() {
        let cases: Vec<(Error, Option<ResumePoint>, Vec<&str>)> = vec![
            (
                Error::Checkpoint(CheckpointError::WorldSizeMismatch { expected: 3, found: 2 }),
                Some(point()),
                vec!["cannot resume from ck/latest.fdlck", "world size 2", "3", "ranks"],
            ),
            (
                Error::Checkpoint(CheckpointError::TermMismatch {
                    field: "seed",
                    expected: "4".into(),
                    found: "9".into(),
                }),
                Some(point()),
                vec!["ck/latest.fdlck", "another seed: 9, this run has 4", "ranks and devices may"],
            ),
            (
                Error::Checkpoint(CheckpointError::ChecksumMismatch),
                Some(point()),
                vec!["ck/latest.fdlck", "corrupt"],
            ),
            (
                Error::Unrecoverable {
                    reason: SaveReason::AllRanksLost,
                    detail: "every rank died".into(),
                    bundle: Some("ck/failure.fdlck".into()),
                    last: Some(Box::new(Error::Rank {
                        rank: 1,
                        failure: RankFailure::panicked("boom"),
                    })),
                },
                None,
                vec![
                    "AllRanksLost",
                    "every rank died",
                    "rank 1 panicked: boom",
                    "ck/failure.fdlck",
                ],
            ),
            (
                Error::Unrecoverable {
                    reason: SaveReason::AllRanksLost,
                    detail: "rank 0, the last one alive, failed: replica: gone".into(),
                    bundle: Some("ck/failure.fdlck".into()),
                    last: Some(Box::new(Error::Rank {
                        rank: 0,
                        failure: RankFailure::from(&Error::replica("gone")),
                    })),
                },
                None,
                vec!["alive, failed: replica: gone; its state is saved in ck/failure.fdlck"],
            ),
            (
                Error::Diverged {
                    rank: 1,
                    step: 12,
                    cause: flodl_ddp::Divergence::Loss(f32::NAN),
                    bundle: Some("ck/failure.fdlck".into()),
                },
                None,
                vec!["diverged on rank 1 at step 12", "loss is NaN", "ck/failure.fdlck"],
            ),
            (Error::Aborted, Some(point()), vec!["training failed", "run aborted"]),
        ];
        for (error, resume, needles) in cases {
            let text = format!("{:#}", explain(error, resume.as_ref()));
            assert!(!text.contains('\n'), "{text}");
            for n in needles {
                assert!(text.contains(n), "{n:?} missing from {text:?}");
            }
        }
    }

    /// An elastic resume says what changes; the same world on the same devices says nothing.
    #[test]
    fn changes_name_ranks_devices_and_resharding() -> Result<()> {
        let names = |n: usize, d: &str| vec![d.to_owned(); n];
        let cases: [(Vec<String>, Option<&str>); 4] = [
            (names(3, "cpu"), None),
            (
                names(2, "cpu"),
                Some(
                    "resuming 3 ranks onto 2: optimizer states 0←0, 1←1 (dropped: rank 2); \
                     ElChe re-calibrates; the rest of the open epochs is re-sharded",
                ),
            ),
            (
                names(4, "cpu"),
                Some("resuming 3 ranks onto 4: optimizer states 0←0, 1←1, 2←2, 3←0; ElChe"),
            ),
            (
                names(3, "cuda:0"),
                Some(
                    "resuming 3 ranks onto 3: optimizer states 0←0, 1←1, 2←2; devices cpu, cpu, cpu → cuda:0, cuda:0, cuda:0",
                ),
            ),
        ];
        for (devices, want) in cases {
            let got = point().changes(&devices);
            match (want, got.as_deref()) {
                (None, None) => {}
                (Some(w), Some(g)) if g.starts_with(w) => {}
                (w, g) => bail!("{devices:?}: want {w:?}, got {g:?}"),
            }
        }
        Ok(())
    }

    #[test]
    fn locate_refuses_missing_empty_and_corrupt_paths() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        let missing = tmp.path().join("nowhere");
        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty)?;
        let garbage = tmp.path().join("garbage.fdlck");
        std::fs::write(&garbage, [b'x'; 100])?;
        for (path, why) in
            [(&missing, "no such file"), (&empty, "no checkpoint"), (&garbage, "not a flodl")]
        {
            let err = ResumePoint::locate(path).err().map(|e| format!("{e:#}"));
            let shown = path.display().to_string();
            assert!(
                err.as_deref().is_some_and(|e| e.contains(&shown) && e.contains(why)),
                "{why}: {err:?}"
            );
        }
        Ok(())
    }
}

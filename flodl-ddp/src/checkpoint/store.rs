//! Files on disk: atomic saves, `latest` plus `step-N` naming with retention, and loading.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::bundle::Checkpoint;
use super::error::{CheckpointError, Result};
use super::format::{Encoded, ReadLimits};
use super::location::{EXTENSION, LATEST, STEP_PREFIX, locate, parse_step, step_bundles};
use super::signature::Expectation;

/// Marker in the names of temporary files of saves in progress.
const TMP_MARKER: &str = ".tmp-";

/// A point in an atomic save, reported to a fault-injection hook (the crate's crash tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SaveStage {
    /// The temporary file exists and is empty.
    TempCreated,
    /// Header and metadata are written, tensor data is not.
    PartlyWritten,
    /// Everything is written, not yet synced.
    Written,
    /// The temporary file is synced to disk, not yet renamed.
    Synced,
    /// The temporary file has been renamed over the target (directory not yet synced).
    Renamed,
}

/// A hook called at each [`SaveStage`] with the final target path; an `Err` stops the save right
/// there, leaving the files as a crash at that point would (no clean-up).
pub(crate) type SaveHook<'a> = &'a mut dyn FnMut(SaveStage, &Path) -> io::Result<()>;

fn no_hook(_: SaveStage, _: &Path) -> io::Result<()> {
    Ok(())
}

/// Why a file write stopped: a real i/o error (clean up) or the hook (leave files as they are).
enum WriteStop {
    Io(io::Error),
    Hook(io::Error),
}

fn temp_path(target: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    target.with_file_name(format!(".{name}{TMP_MARKER}{}-{n}", std::process::id()))
}

fn parent_dir(target: &Path) -> &Path {
    match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Syncs a directory so a rename in it is durable.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Directories cannot be opened for syncing here; the rename is as durable as the platform makes
/// it.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

/// Whether `file_name` is a temporary file of one of our saves.
fn is_temp_name(file_name: &str) -> bool {
    file_name.starts_with('.') && file_name.contains(&format!(".{EXTENSION}{TMP_MARKER}"))
}

/// Runs the temp-file part of an atomic write; `fill` writes the content.
fn write_temp(
    target: &Path,
    temp: &Path,
    hook: SaveHook<'_>,
    fill: impl FnOnce(&mut BufWriter<File>, SaveHook<'_>) -> std::result::Result<(), WriteStop>,
) -> std::result::Result<(), WriteStop> {
    let file = File::create_new(temp).map_err(WriteStop::Io)?;
    hook(SaveStage::TempCreated, target).map_err(WriteStop::Hook)?;
    let mut w = BufWriter::new(file);
    fill(&mut w, &mut *hook)?;
    let file = w.into_inner().map_err(|e| WriteStop::Io(e.into_error()))?;
    hook(SaveStage::Written, target).map_err(WriteStop::Hook)?;
    file.sync_all().map_err(WriteStop::Io)?;
    hook(SaveStage::Synced, target).map_err(WriteStop::Hook)?;
    fs::rename(temp, target).map_err(WriteStop::Io)?;
    hook(SaveStage::Renamed, target).map_err(WriteStop::Hook)?;
    sync_dir(parent_dir(target)).map_err(WriteStop::Io)
}

/// Atomic write: temporary file in the target's directory, write, fsync, rename, fsync dir.
fn write_atomic(
    target: &Path,
    hook: SaveHook<'_>,
    fill: impl FnOnce(&mut BufWriter<File>, SaveHook<'_>) -> std::result::Result<(), WriteStop>,
) -> Result<()> {
    let temp = temp_path(target);
    match write_temp(target, &temp, hook, fill) {
        Ok(()) => Ok(()),
        Err(WriteStop::Hook(e)) => Err(CheckpointError::io(target, e)),
        Err(WriteStop::Io(e)) => {
            // Best effort: the temporary file may not exist or may already be renamed.
            let _ = fs::remove_file(&temp);
            Err(CheckpointError::io(target, e))
        }
    }
}

fn write_bundle(target: &Path, encoded: &Encoded<'_>, hook: SaveHook<'_>) -> Result<()> {
    write_atomic(target, hook, |w, hook| {
        encoded.write_head(w).map_err(WriteStop::Io)?;
        w.flush().map_err(WriteStop::Io)?;
        hook(SaveStage::PartlyWritten, target).map_err(WriteStop::Hook)?;
        encoded.write_data(w).map_err(WriteStop::Io)
    })
}

impl Checkpoint {
    /// Writes the bundle to `path` atomically: a reader sees the old file or the new one, and a
    /// crash at any point leaves the old file intact.
    ///
    /// # Errors
    /// Encoding errors as [`Checkpoint::to_bytes`], and [`CheckpointError::Io`].
    pub fn save(&self, path: &Path) -> Result<()> {
        self.save_with_hook(path, &mut no_hook)
    }

    /// [`Checkpoint::save`] with a fault-injection hook called at each [`SaveStage`].
    ///
    /// # Errors
    /// As [`Checkpoint::save`]; a hook error is returned as [`CheckpointError::Io`].
    pub(crate) fn save_with_hook(&self, path: &Path, hook: SaveHook<'_>) -> Result<()> {
        write_bundle(path, &Encoded::new(self)?, hook)
    }

    /// Reads and fully validates the bundle at `path` (integrity only, not compatibility).
    /// Peak memory is about twice the bundle: the verified file, then the tensors split out.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] and every integrity error; never a partial result.
    pub fn read(path: &Path) -> Result<Checkpoint> {
        Self::read_with_limits(path, ReadLimits::default())
    }

    /// [`Checkpoint::read`] under explicit [`ReadLimits`].
    ///
    /// # Errors
    /// As [`Checkpoint::read`].
    pub fn read_with_limits(path: &Path, limits: ReadLimits) -> Result<Checkpoint> {
        let io_err = |e| CheckpointError::io(path, e);
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        Checkpoint::read_from(&mut BufReader::new(file), len, limits, path)
    }

    /// Reads the bundle at `path` and checks it belongs to the run described by `expect`.
    ///
    /// # Errors
    /// As [`Checkpoint::read`], plus [`Checkpoint::check_compatible`]'s mismatches.
    pub fn load(path: &Path, expect: &Expectation) -> Result<Checkpoint> {
        let ckpt = Self::read(path)?;
        ckpt.check_compatible(expect)?;
        Ok(ckpt)
    }
}

/// A checkpoint directory: `latest.fdlck` (the newest save) plus the last `keep`
/// `step-<global_step>.fdlck` bundles.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
    keep: usize,
}

impl CheckpointStore {
    /// Opens (creating it if needed) a store in `dir` keeping `keep` step bundles (at least 1),
    /// and removes temporary files left there by interrupted saves.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the directory cannot be created or listed.
    pub fn open(dir: impl Into<PathBuf>, keep: usize) -> Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|e| CheckpointError::io(&dir, e))?;
        let store = CheckpointStore { dir, keep: keep.max(1) };
        for entry in store.entries()? {
            if is_temp_name(&entry) {
                let path = store.dir.join(&entry);
                fs::remove_file(&path).map_err(|e| CheckpointError::io(path, e))?;
            }
        }
        Ok(store)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many step bundles are kept.
    pub fn keep(&self) -> usize {
        self.keep
    }

    /// Path of the bundle named `name` (`<dir>/<name>.fdlck`).
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.{EXTENSION}"))
    }

    /// Path of the step bundle for `global_step`.
    pub fn step_path(&self, global_step: u64) -> PathBuf {
        self.path_of(&format!("{STEP_PREFIX}{global_step}"))
    }

    /// Saves `ckpt` as `step-<global_step>` and then as `latest` (each atomically), and deletes
    /// step bundles beyond the newest `keep`. Returns the step bundle's path.
    ///
    /// # Errors
    /// As [`Checkpoint::save`]. A failure at any point leaves the previous `latest` loadable.
    pub fn save(&self, ckpt: &Checkpoint) -> Result<PathBuf> {
        self.save_with_hook(ckpt, &mut no_hook)
    }

    /// [`CheckpointStore::save`] with a fault-injection hook (called for each file written).
    ///
    /// # Errors
    /// As [`CheckpointStore::save`].
    pub(crate) fn save_with_hook(&self, ckpt: &Checkpoint, hook: SaveHook<'_>) -> Result<PathBuf> {
        let encoded = Encoded::new(ckpt)?;
        let step = self.step_path(ckpt.global_step);
        write_bundle(&step, &encoded, &mut *hook)?;
        let latest = self.path_of(LATEST);
        self.link_latest(&step, &latest, &encoded, hook)?;
        self.prune()?;
        Ok(step)
    }

    /// Points `latest` at the step bundle: a hard link renamed over `latest` (no copy), or an
    /// atomic copy where the filesystem has no hard links.
    fn link_latest(
        &self,
        step: &Path,
        latest: &Path,
        encoded: &Encoded<'_>,
        hook: SaveHook<'_>,
    ) -> Result<()> {
        let temp = temp_path(latest);
        if fs::hard_link(step, &temp).is_err() {
            return write_bundle(latest, encoded, hook);
        }
        let linked = (|| {
            hook(SaveStage::Synced, latest).map_err(WriteStop::Hook)?;
            fs::rename(&temp, latest).map_err(WriteStop::Io)?;
            hook(SaveStage::Renamed, latest).map_err(WriteStop::Hook)?;
            sync_dir(&self.dir).map_err(WriteStop::Io)
        })();
        match linked {
            Ok(()) => Ok(()),
            Err(WriteStop::Hook(e)) => Err(CheckpointError::io(latest, e)),
            Err(WriteStop::Io(e)) => {
                // Best effort: the link may already be renamed.
                let _ = fs::remove_file(&temp);
                Err(CheckpointError::io(latest, e))
            }
        }
    }

    /// Saves `ckpt` under `name` (e.g. `"final"`, `"crash"`) atomically, leaving `latest` and
    /// the step bundles alone. Returns its path.
    ///
    /// # Errors
    /// [`CheckpointError::InvalidName`] for an empty name, one with a path separator, a leading
    /// dot, or `latest`; otherwise as [`Checkpoint::save`].
    pub fn save_named(&self, name: &str, ckpt: &Checkpoint) -> Result<PathBuf> {
        let bad = name.is_empty()
            || name.starts_with('.')
            || name.contains(['/', '\\'])
            || name == LATEST
            || parse_step(&format!("{name}.{EXTENSION}")).is_some();
        if bad {
            return Err(CheckpointError::InvalidName { name: name.to_string() });
        }
        let path = self.path_of(name);
        ckpt.save(&path)?;
        Ok(path)
    }

    /// The step bundles present, sorted by step (oldest first).
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the directory cannot be listed.
    pub fn steps(&self) -> Result<Vec<(u64, PathBuf)>> {
        step_bundles(&self.dir)
    }

    /// Loads the newest bundle as [`locate`] finds it (`latest`, or the highest step bundle
    /// when `latest` is missing or corrupt) and checks it belongs to the run of `expect`.
    ///
    /// # Errors
    /// As [`locate`] ([`CheckpointError::NotFound`] when the directory is gone or holds no
    /// bundle), plus [`Checkpoint::check_compatible`]'s mismatches.
    pub fn load_latest(&self, expect: &Expectation) -> Result<Checkpoint> {
        if !self.dir.is_dir() {
            return Err(CheckpointError::NotFound { dir: self.dir.clone() });
        }
        let found = locate(&self.dir)?;
        found.checkpoint.check_compatible(expect)?;
        Ok(found.checkpoint)
    }

    /// Deletes step bundles older than the newest `keep`.
    fn prune(&self) -> Result<()> {
        let steps = self.steps()?;
        let excess = steps.len().saturating_sub(self.keep);
        for (_, path) in &steps[..excess] {
            fs::remove_file(path).map_err(|e| CheckpointError::io(path, e))?;
        }
        Ok(())
    }

    fn entries(&self) -> Result<Vec<String>> {
        let io_err = |e| CheckpointError::io(&self.dir, e);
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    //! A crash at every point of a save leaves the previous bundle loadable (the hook is the
    //! crash: it stops the save and leaves the files as they are).

    use std::io;
    use std::path::Path;

    use super::super::bundle::Checkpoint;
    use super::super::config_hash::ConfigHash;
    use super::super::error::CheckpointError;
    use super::super::record::{TensorRecord, TensorSet};
    use super::super::signature::Expectation;
    use super::{CheckpointStore, SaveStage};

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    /// A bundle of one tensor (what is saved does not matter here, only that it changes).
    fn small_checkpoint() -> std::result::Result<Checkpoint, Box<dyn std::error::Error>> {
        let w = TensorRecord::from_f32("w", vec![2, 3], &[0.5, -1.0, 2.0, 3.5, 0.0, -0.0])?;
        let mut ckpt =
            Checkpoint::new(TensorSet::from_records(vec![w])?, 2, ConfigHash::of("crash"));
        ckpt.global_step = 17;
        Ok(ckpt)
    }

    fn expectation_of(ckpt: &Checkpoint) -> Expectation {
        Expectation {
            signature: ckpt.signature(),
            world_size: ckpt.world_size,
            config_hash: ckpt.config_hash,
        }
    }

    /// Saves `next` over a store holding `prev`, failing at the `fail_at`-th hook call; then
    /// checks that the newest loadable bundle is `prev` or, only once `latest` was renamed,
    /// `next`.
    fn crash_case(fail_at: usize, prev: &Checkpoint, next: &Checkpoint) -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = CheckpointStore::open(dir.path(), 3)?;
        store.save(prev)?;
        let mut calls = 0usize;
        let mut latest_renamed = false;
        let mut hook = |stage: SaveStage, target: &Path| -> io::Result<()> {
            calls += 1;
            // `Renamed` is reported after the rename: even a crash right then has the new file.
            if stage == SaveStage::Renamed && target.ends_with("latest.fdlck") {
                latest_renamed = true;
            }
            if calls == fail_at {
                return Err(io::Error::other(format!("injected crash at {stage:?}")));
            }
            Ok(())
        };
        let finished = store.save_with_hook(next, &mut hook).is_ok();
        let expect = expectation_of(prev);
        let want = if latest_renamed { next } else { prev };
        assert!(
            store.load_latest(&expect)? == *want,
            "crash at hook call {fail_at} (finished {finished}): latest is neither intact old nor new"
        );
        // Reopening clears the temporaries of the crash (and nothing else); saving again works.
        std::fs::write(dir.path().join(".notes.tmp-1"), b"not ours")?;
        let store = CheckpointStore::open(dir.path(), 3)?;
        let dotfiles: Vec<String> = std::fs::read_dir(dir.path())?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert_eq!(dotfiles, [".notes.tmp-1"], "dotfiles after reopening");
        store.save(next)?;
        assert!(
            store.load_latest(&expect)? == *next,
            "crash at {fail_at}: a later save does not load"
        );
        Ok(())
    }

    #[test]
    fn a_crash_during_a_save_leaves_the_previous_bundle_intact() -> TestResult {
        let prev = small_checkpoint()?;
        let mut next = prev.clone();
        next.global_step = prev.global_step + 5;
        next.params = TensorSet::from_records(
            prev.params
                .records()
                .iter()
                .map(|r| {
                    let flipped: Vec<u8> = r.data().iter().map(|b| !b).collect();
                    TensorRecord::from_le_bytes(r.name(), r.dtype(), r.shape().to_vec(), flipped)
                })
                .collect::<std::result::Result<_, _>>()?,
        )?;
        // Count the hook calls of an uninterrupted save, then crash at each one in turn.
        let dir = tempfile::tempdir()?;
        let mut total = 0usize;
        CheckpointStore::open(dir.path(), 3)?.save_with_hook(&next, &mut |_, _| {
            total += 1;
            Ok(())
        })?;
        assert!(total >= 5, "only {total} save stages reported");
        for fail_at in 1..=total {
            crash_case(fail_at, &prev, &next)?;
        }
        // A single-file save that dies mid-way leaves the old file as it was.
        let path = dir.path().join("single.fdlck");
        prev.save(&path)?;
        let before = std::fs::read(&path)?;
        for stop in [
            SaveStage::TempCreated,
            SaveStage::PartlyWritten,
            SaveStage::Written,
            SaveStage::Synced,
        ] {
            let r = next.save_with_hook(&path, &mut |stage, _| {
                if stage == stop { Err(io::Error::other("writer died")) } else { Ok(()) }
            });
            assert!(matches!(r, Err(CheckpointError::Io { .. })), "failure at {stop:?}: {r:?}");
            assert!(
                std::fs::read(&path)? == before && Checkpoint::read(&path)? == prev,
                "failure at {stop:?} altered the previous bundle"
            );
        }
        Ok(())
    }
}

//! Finding the bundle to resume from: one rule for the trainer, the store and the CLI.
//!
//! [`locate`] only reads: it never creates, deletes or renames a file (temporary files of
//! interrupted saves are cleared by [`CheckpointStore::open`](super::CheckpointStore::open),
//! which a run that saves calls, not by a reader).

use std::fs;
use std::path::{Path, PathBuf};

use super::bundle::Checkpoint;
use super::error::{CheckpointError, Result};

/// File extension of bundles.
pub(crate) const EXTENSION: &str = "fdlck";
/// Name (without extension) of the bundle that always holds the newest save.
pub(crate) const LATEST: &str = "latest";
/// Prefix of the step-numbered bundles (`step-<global_step>.fdlck`).
pub(crate) const STEP_PREFIX: &str = "step-";

/// The bundle [`locate`] chose, read and checked for integrity (not for compatibility).
#[derive(Debug)]
pub struct Located {
    /// The bundle file.
    pub path: PathBuf,
    /// Its content.
    pub checkpoint: Checkpoint,
    /// Newer bundles of the directory that were passed over, with why (unreadable or corrupt),
    /// newest first.
    pub skipped: Vec<(PathBuf, CheckpointError)>,
}

/// Finds and reads the bundle to resume from at `path`.
///
/// A file is itself. A directory gives its `latest.fdlck` when that reads as an intact bundle,
/// else its highest `step-<n>.fdlck` that does (a corrupt or half-written `latest` is skipped,
/// and so is a corrupt step bundle). Compatibility with a run (model, world size, configuration)
/// is the caller's to check.
///
/// # Errors
/// [`CheckpointError::NotFound`] when `path` does not exist or a directory holds no bundle;
/// for a file, every error of [`Checkpoint::read`]; for a directory whose bundles are all
/// unreadable, the error of the newest one; [`CheckpointError::Io`] when the directory cannot
/// be listed.
pub fn locate(path: &Path) -> Result<Located> {
    if path.is_file() {
        let checkpoint = Checkpoint::read(path)?;
        return Ok(Located { path: path.to_path_buf(), checkpoint, skipped: Vec::new() });
    }
    if !path.is_dir() {
        return Err(CheckpointError::NotFound { dir: path.to_path_buf() });
    }
    let latest = path.join(format!("{LATEST}.{EXTENSION}"));
    let candidates = latest
        .is_file()
        .then_some(latest)
        .into_iter()
        .chain(step_bundles(path)?.into_iter().rev().map(|(_, p)| p));
    let mut skipped = Vec::new();
    for candidate in candidates {
        match Checkpoint::read(&candidate) {
            Ok(checkpoint) => return Ok(Located { path: candidate, checkpoint, skipped }),
            Err(e) => skipped.push((candidate, e)),
        }
    }
    match skipped.into_iter().next() {
        Some((_, newest)) => Err(newest),
        None => Err(CheckpointError::NotFound { dir: path.to_path_buf() }),
    }
}

/// The `step-<n>.fdlck` bundles in `dir`, sorted by step (oldest first). Only lists.
///
/// # Errors
/// [`CheckpointError::Io`] when the directory cannot be listed.
pub fn step_bundles(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let io_err = |e| CheckpointError::io(dir, e);
    let mut steps = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        if let Some(step) = entry.file_name().to_str().and_then(parse_step) {
            steps.push((step, entry.path()));
        }
    }
    steps.sort_unstable();
    Ok(steps)
}

/// The step number of a file named `step-<n>.fdlck`.
pub(crate) fn parse_step(file_name: &str) -> Option<u64> {
    let digits = file_name.strip_prefix(STEP_PREFIX)?.strip_suffix(EXTENSION)?.strip_suffix('.')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

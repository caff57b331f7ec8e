//! Data coverage: which sample ranges of an epoch are done, and which must be re-dispatched.

use serde::{Deserialize, Serialize};

use super::error::{CheckpointError, Result};

/// A half-open range `[offset, offset + size)` of positions in an epoch's permutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SampleRange {
    /// First position.
    pub offset: usize,
    /// Number of positions.
    pub size: usize,
}

impl SampleRange {
    /// The range `[offset, offset + size)`.
    pub fn new(offset: usize, size: usize) -> Self {
        SampleRange { offset, size }
    }

    /// One past the last position, or `None` when that overflows.
    pub fn end(&self) -> Option<usize> {
        self.offset.checked_add(self.size)
    }

    fn end_within(&self, total: usize) -> Result<usize> {
        match self.end() {
            Some(end) if end <= total => Ok(end),
            _ => Err(CheckpointError::RangeOutOfBounds {
                offset: self.offset,
                size: self.size,
                total,
            }),
        }
    }
}

/// Sorts ranges, drops empty ones and merges overlapping or adjacent ones, all within
/// `0..total`.
///
/// # Errors
/// [`CheckpointError::RangeOutOfBounds`] when a range ends past `total` (or its end overflows).
pub(crate) fn normalise(ranges: &[SampleRange], total: usize) -> Result<Vec<SampleRange>> {
    let mut spans = Vec::with_capacity(ranges.len());
    for r in ranges {
        let end = r.end_within(total)?;
        if r.size > 0 {
            spans.push((r.offset, end));
        }
    }
    spans.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
    for (start, end) in spans {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    Ok(merged.into_iter().map(|(start, end)| SampleRange::new(start, end - start)).collect())
}

/// The gaps of `0..total` between normalised ranges.
fn gaps(normalised: &[SampleRange], total: usize) -> Vec<SampleRange> {
    let mut gaps = Vec::new();
    let mut cursor = 0;
    for r in normalised {
        if r.offset > cursor {
            gaps.push(SampleRange::new(cursor, r.offset - cursor));
        }
        cursor = r.offset + r.size;
    }
    if cursor < total {
        gaps.push(SampleRange::new(cursor, total - cursor));
    }
    gaps
}

/// The progress of one epoch: its permutation seed, its sample count and the completed ranges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochCoverage {
    /// The epoch index.
    pub epoch: u64,
    /// The seed of the epoch's permutation.
    pub seed: u64,
    /// Number of positions in the epoch.
    pub total: usize,
    completed: Vec<SampleRange>,
}

impl EpochCoverage {
    /// An epoch with nothing completed yet.
    pub fn new(epoch: u64, seed: u64, total: usize) -> Self {
        EpochCoverage { epoch, seed, total, completed: Vec::new() }
    }

    /// An epoch with `completed` ranges done (normalised).
    ///
    /// # Errors
    /// [`CheckpointError::RangeOutOfBounds`] when a range ends past `total`.
    pub fn with_completed(
        epoch: u64,
        seed: u64,
        total: usize,
        completed: &[SampleRange],
    ) -> Result<Self> {
        Ok(EpochCoverage { epoch, seed, total, completed: normalise(completed, total)? })
    }

    /// Records `range` as done.
    ///
    /// # Errors
    /// [`CheckpointError::RangeOutOfBounds`] when it ends past `total`; the coverage is unchanged.
    pub fn mark_done(&mut self, range: SampleRange) -> Result<()> {
        range.end_within(self.total)?;
        let mut all = self.completed.clone();
        all.push(range);
        self.completed = normalise(&all, self.total)?;
        Ok(())
    }

    /// The completed ranges, sorted, disjoint and non-adjacent.
    pub fn completed(&self) -> &[SampleRange] {
        &self.completed
    }

    /// The ranges still to do, sorted and disjoint.
    pub fn uncovered(&self) -> Vec<SampleRange> {
        gaps(&self.completed, self.total)
    }

    /// Number of positions done.
    pub fn done_count(&self) -> usize {
        self.completed.iter().map(|r| r.size).sum()
    }

    /// Whether every position is done.
    pub fn is_complete(&self) -> bool {
        self.done_count() == self.total
    }

    /// Checks the invariants a decoded value must hold (normalised, within `total`).
    pub(crate) fn validate(&self) -> Result<()> {
        let normal = normalise(&self.completed, self.total)?;
        if normal != self.completed {
            return Err(CheckpointError::malformed(format!(
                "epoch {} coverage is not normalised",
                self.epoch
            )));
        }
        Ok(())
    }
}

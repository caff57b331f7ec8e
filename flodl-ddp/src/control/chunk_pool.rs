//! One epoch's pool of permutation positions, handed out to ranks as chunks and credited back.
//!
//! Positions index the epoch's permutation (`0..samples`); a chunk is a contiguous run of whole
//! batches. Every position is handed out at most once, except that the unfinished chunks of a
//! retired (dead) rank return to the pool and are handed out again, so each position is trained
//! exactly once per epoch by a rank that finishes it. The pool records which ranges are done
//! ([`ChunkPool::coverage`]) so a checkpoint can resume with only the rest.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::control::logic_error::{LogicError, LogicResult};

/// A contiguous run of one epoch's permutation handed to one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Chunk {
    /// The epoch whose permutation is sliced.
    pub epoch: usize,
    /// First position in the permutation.
    pub offset: usize,
    /// Number of positions: whole batches, plus the short last batch under [`Tail::Keep`].
    pub len: usize,
}

impl Chunk {
    /// One past the last position.
    pub fn end(&self) -> usize {
        self.offset + self.len
    }

    /// Batches in the chunk (a short last batch counts as one).
    pub fn batches(&self, batch_size: usize) -> usize {
        self.len.div_ceil(batch_size.max(1))
    }
}

/// What happens to the `samples % batch_size` positions that do not fill a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Tail {
    /// They are not trained this epoch (another permutation covers them next epoch).
    #[default]
    Drop,
    /// They form one short last batch.
    Keep,
}

impl Tail {
    /// Positions of an epoch of `samples` that are handed out under this rule.
    pub fn total(self, samples: usize, batch_size: usize) -> usize {
        match self {
            Tail::Drop => samples / batch_size.max(1) * batch_size.max(1),
            Tail::Keep => samples,
        }
    }
}

/// Which ranges of one epoch's permutation are done: enough to resume the epoch exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// The epoch.
    pub epoch: usize,
    /// Positions the epoch hands out in all.
    pub total: usize,
    /// Completed half-open ranges `(start, end)`, sorted and disjoint.
    pub done: Vec<(usize, usize)>,
}

impl Coverage {
    /// Positions completed.
    pub fn done_len(&self) -> usize {
        self.done.iter().map(|(s, e)| e - s).sum()
    }
}

/// One epoch's pool (see the module documentation).
#[derive(Debug, Clone)]
pub struct ChunkPool {
    epoch: usize,
    batch_size: usize,
    total: usize,
    cursor: usize,
    // Ranges returned by retired ranks or left uncovered by a resumed checkpoint; served first.
    requeue: VecDeque<(usize, usize)>,
    outstanding: Vec<Vec<Chunk>>,
    retired: Vec<bool>,
    done: Vec<(usize, usize)>,
}

impl ChunkPool {
    /// A pool for `epoch` over `samples` positions in batches of `batch_size` for `world` ranks.
    ///
    /// # Errors
    /// [`LogicError::WorldTooSmall`] for an empty world; [`LogicError::InvalidValue`] for a zero
    /// batch size.
    pub fn new(
        epoch: usize,
        samples: usize,
        batch_size: usize,
        world: usize,
        tail: Tail,
    ) -> LogicResult<ChunkPool> {
        if world == 0 {
            return Err(LogicError::WorldTooSmall { what: "ChunkPool", world, min: 1 });
        }
        if batch_size == 0 {
            return Err(LogicError::InvalidValue { what: "batch size", value: 0.0 });
        }
        Ok(ChunkPool {
            epoch,
            batch_size,
            total: tail.total(samples, batch_size),
            cursor: 0,
            requeue: VecDeque::new(),
            outstanding: vec![Vec::new(); world],
            retired: vec![false; world],
            done: Vec::new(),
        })
    }

    /// A pool that hands out only what `coverage` does not mark done (resume from a checkpoint).
    ///
    /// # Errors
    /// As [`ChunkPool::new`]; [`LogicError::InvalidCoverage`] when the ranges are unsorted,
    /// overlapping, past the total, or not batch-aligned.
    pub fn resume(
        coverage: &Coverage,
        batch_size: usize,
        world: usize,
        tail: Tail,
    ) -> LogicResult<ChunkPool> {
        let mut pool = ChunkPool::new(coverage.epoch, 0, batch_size, world, tail)?;
        pool.total = coverage.total;
        let bad = |reason| LogicError::InvalidCoverage { epoch: coverage.epoch, reason };
        let mut at = 0;
        for &(s, e) in &coverage.done {
            if s < at || e <= s || e > coverage.total {
                return Err(bad("ranges must be sorted, disjoint, non-empty and within the total"));
            }
            if s % batch_size != 0 || (e % batch_size != 0 && e != coverage.total) {
                return Err(bad("ranges must start and end on batch boundaries"));
            }
            if s > at {
                pool.requeue.push_back((at, s));
            }
            at = e;
        }
        if at < coverage.total {
            pool.requeue.push_back((at, coverage.total));
        }
        pool.cursor = coverage.total;
        pool.done = coverage.done.clone();
        Ok(pool)
    }

    /// The epoch.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.outstanding.len()
    }

    /// Batch size.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Positions the epoch hands out in all.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Positions not yet handed out.
    pub fn remaining(&self) -> usize {
        let requeued: usize = self.requeue.iter().map(|(s, e)| e - s).sum();
        self.total - self.cursor + requeued
    }

    /// Batches not yet handed out (a short last batch counts as one).
    pub fn remaining_batches(&self) -> usize {
        let requeued: usize =
            self.requeue.iter().map(|(s, e)| (e - s).div_ceil(self.batch_size)).sum();
        (self.total - self.cursor).div_ceil(self.batch_size) + requeued
    }

    /// True when every position has been handed out.
    pub fn is_exhausted(&self) -> bool {
        self.remaining() == 0
    }

    /// True when every position has been handed out and every chunk credited.
    pub fn is_done(&self) -> bool {
        self.is_exhausted() && self.outstanding.iter().all(Vec::is_empty)
    }

    /// Positions handed to `rank` and not yet credited (0 for an unknown rank).
    pub fn in_flight(&self, rank: usize) -> usize {
        self.outstanding.get(rank).map_or(0, |v| v.iter().map(|c| c.len).sum())
    }

    /// Batches handed to `rank` and not yet credited.
    pub fn in_flight_batches(&self, rank: usize) -> usize {
        self.outstanding.get(rank).map_or(0, |v| v.iter().map(|c| c.batches(self.batch_size)).sum())
    }

    /// The chunks `rank` holds, oldest first.
    pub fn held(&self, rank: usize) -> &[Chunk] {
        self.outstanding.get(rank).map_or(&[], Vec::as_slice)
    }

    /// True when `rank` was retired.
    pub fn is_retired(&self, rank: usize) -> bool {
        self.retired.get(rank).copied().unwrap_or(false)
    }

    /// Hands `rank` the next chunk of up to `batches` batches (at least one), or `None` when the
    /// pool is exhausted. Returned ranges are served before fresh positions. Under
    /// [`Tail::Keep`] a chunk that would leave only a short batch behind takes it along.
    ///
    /// # Errors
    /// [`LogicError::RankOutOfRange`]; [`LogicError::RankRetired`].
    pub fn take(&mut self, rank: usize, batches: usize) -> LogicResult<Option<Chunk>> {
        self.check_live(rank)?;
        let want = batches.max(1) * self.batch_size;
        let chunk = if let Some((s, e)) = self.requeue.pop_front() {
            let mut len = want.min(e - s);
            if e - (s + len) < self.batch_size {
                len = e - s;
            }
            if s + len < e {
                self.requeue.push_front((s + len, e));
            }
            Chunk { epoch: self.epoch, offset: s, len }
        } else if self.cursor < self.total {
            let left = self.total - self.cursor;
            let len = if left - want.min(left) < self.batch_size { left } else { want };
            let chunk = Chunk { epoch: self.epoch, offset: self.cursor, len };
            self.cursor += len;
            chunk
        } else {
            return Ok(None);
        };
        self.outstanding[rank].push(chunk);
        Ok(Some(chunk))
    }

    /// Credits a chunk `rank` finished.
    ///
    /// # Errors
    /// [`LogicError::RankOutOfRange`]; [`LogicError::UnknownChunk`] when `rank` does not hold
    /// that chunk (never handed out, already credited, or re-queued when the rank retired).
    pub fn credit(&mut self, rank: usize, chunk: &Chunk) -> LogicResult<()> {
        self.check_rank(rank)?;
        let unknown = LogicError::UnknownChunk { rank, epoch: chunk.epoch, offset: chunk.offset };
        let held = &mut self.outstanding[rank];
        let i = held.iter().position(|c| c == chunk).ok_or(unknown)?;
        held.remove(i);
        self.mark_done(chunk.offset, chunk.end());
        Ok(())
    }

    /// Retires `rank`: it takes no more chunks and the chunks it holds return to the pool (they
    /// are handed out again before fresh positions). Returns the re-queued chunks.
    ///
    /// # Errors
    /// [`LogicError::RankOutOfRange`].
    pub fn retire(&mut self, rank: usize) -> LogicResult<Vec<Chunk>> {
        self.check_rank(rank)?;
        self.retired[rank] = true;
        let back = std::mem::take(&mut self.outstanding[rank]);
        for c in back.iter().rev() {
            self.requeue.push_front((c.offset, c.end()));
        }
        Ok(back)
    }

    /// The completed ranges, for a checkpoint (in-flight chunks count as not done).
    pub fn coverage(&self) -> Coverage {
        Coverage { epoch: self.epoch, total: self.total, done: self.done.clone() }
    }

    fn check_rank(&self, rank: usize) -> LogicResult<()> {
        if rank >= self.world() {
            return Err(LogicError::RankOutOfRange { rank, world: self.world() });
        }
        Ok(())
    }

    fn check_live(&self, rank: usize) -> LogicResult<()> {
        self.check_rank(rank)?;
        if self.retired[rank] {
            return Err(LogicError::RankRetired { rank });
        }
        Ok(())
    }

    /// Inserts `[s, e)` into the sorted disjoint done list, merging neighbours.
    fn mark_done(&mut self, s: usize, e: usize) {
        let i = self.done.partition_point(|&(_, end)| end < s);
        let mut j = i;
        let (mut lo, mut hi) = (s, e);
        while j < self.done.len() && self.done[j].0 <= hi {
            lo = lo.min(self.done[j].0);
            hi = hi.max(self.done[j].1);
            j += 1;
        }
        self.done.splice(i..j, [(lo, hi)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Ranges = &'static [(usize, usize)];

    #[test]
    fn mark_done_merges() -> LogicResult<()> {
        let cases: [(Ranges, Ranges); 4] = [
            (&[(0, 4), (8, 12), (4, 8)], &[(0, 12)]),
            (&[(8, 12), (0, 4)], &[(0, 4), (8, 12)]),
            (&[(4, 8), (12, 16), (0, 4), (8, 12)], &[(0, 16)]),
            (&[(20, 24), (0, 4), (10, 12)], &[(0, 4), (10, 12), (20, 24)]),
        ];
        for (inserts, want) in cases {
            let mut pool = ChunkPool::new(0, 0, 1, 1, Tail::Drop)?;
            for &(s, e) in inserts {
                pool.mark_done(s, e);
            }
            assert_eq!(pool.done, want, "{inserts:?}");
        }
        Ok(())
    }
}

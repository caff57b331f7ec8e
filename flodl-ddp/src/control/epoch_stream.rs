//! The run's sequence of epoch pools: ranks stream into the next epoch, epochs finish in order.
//!
//! Pools open on demand, at most `lookahead` epochs past the oldest unfinished one. A rank's next
//! chunk comes from the oldest open epoch that still has positions (so re-queued work of a dead
//! rank is done first), and epochs are reported finished strictly in order: a fast rank can
//! never finish the last epoch and end the run while a slow rank still owes earlier work.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::control::chunk_pool::{Chunk, ChunkPool, Coverage, Tail};
use crate::control::logic_error::{LogicError, LogicResult};

/// Where a run's dispatch stands, for a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCoverage {
    /// The oldest unfinished epoch.
    pub oldest: usize,
    /// Coverage of each open pool, oldest first (epochs past these are untouched).
    pub pools: Vec<Coverage>,
}

/// The epoch pools of one run (see the module documentation).
#[derive(Debug, Clone)]
pub struct EpochStream {
    epochs: usize,
    samples: usize,
    batch_size: usize,
    world: usize,
    tail: Tail,
    lookahead: usize,
    oldest: usize,
    pools: VecDeque<ChunkPool>,
    retired: Vec<bool>,
}

impl EpochStream {
    /// A stream of `epochs` epochs of `samples` positions, batches of `batch_size`, `world`
    /// ranks; a rank may work up to `lookahead` epochs past the oldest unfinished one (0: epoch
    /// barrier, as `Sync`/`Cadence`; 1: the `Async` lookahead).
    ///
    /// # Errors
    /// As [`ChunkPool::new`].
    pub fn new(
        epochs: usize,
        samples: usize,
        batch_size: usize,
        world: usize,
        tail: Tail,
        lookahead: usize,
    ) -> LogicResult<EpochStream> {
        ChunkPool::new(0, samples, batch_size, world, tail)?;
        Ok(EpochStream {
            epochs,
            samples,
            batch_size,
            world,
            tail,
            lookahead,
            oldest: 0,
            pools: VecDeque::new(),
            retired: vec![false; world],
        })
    }

    /// Resumes a stream from a checkpoint's coverage: open pools hand out only their uncovered
    /// ranges.
    ///
    /// # Errors
    /// As [`EpochStream::new`] and [`ChunkPool::resume`]; [`LogicError::InvalidCoverage`] when
    /// the pools are not consecutive epochs from `oldest` or their totals do not match.
    pub fn resume(
        coverage: &StreamCoverage,
        epochs: usize,
        samples: usize,
        batch_size: usize,
        world: usize,
        tail: Tail,
        lookahead: usize,
    ) -> LogicResult<EpochStream> {
        let mut stream = EpochStream::new(epochs, samples, batch_size, world, tail, lookahead)?;
        stream.oldest = coverage.oldest;
        for (i, c) in coverage.pools.iter().enumerate() {
            if c.epoch != coverage.oldest + i || c.total != tail.total(samples, batch_size) {
                return Err(LogicError::InvalidCoverage {
                    epoch: c.epoch,
                    reason: "pools must be consecutive epochs of this run's size",
                });
            }
            stream.pools.push_back(ChunkPool::resume(c, batch_size, world, tail)?);
        }
        Ok(stream)
    }

    /// Number of epochs in the run.
    pub fn epochs(&self) -> usize {
        self.epochs
    }

    /// The oldest unfinished epoch (`epochs` once all are finished).
    pub fn oldest(&self) -> usize {
        self.oldest
    }

    /// True when every epoch has finished.
    pub fn is_finished(&self) -> bool {
        self.oldest >= self.epochs
    }

    /// The open pool of `epoch`, if any.
    pub fn pool(&self, epoch: usize) -> Option<&ChunkPool> {
        self.pools.iter().find(|p| p.epoch() == epoch)
    }

    /// Positions `rank` holds across all open pools.
    pub fn in_flight(&self, rank: usize) -> usize {
        self.pools.iter().map(|p| p.in_flight(rank)).sum()
    }

    /// Hands `rank` its next chunk from the oldest open epoch with positions left, sized by
    /// `size(pool)` (in batches), or `None` when nothing may be handed out now (everything
    /// within the lookahead is handed out, or the run is finished).
    ///
    /// # Errors
    /// [`LogicError::RankOutOfRange`]; [`LogicError::RankRetired`].
    pub fn next_chunk(
        &mut self,
        rank: usize,
        mut size: impl FnMut(&ChunkPool) -> usize,
    ) -> LogicResult<Option<Chunk>> {
        if rank >= self.world {
            return Err(LogicError::RankOutOfRange { rank, world: self.world });
        }
        if self.retired[rank] {
            return Err(LogicError::RankRetired { rank });
        }
        let last = (self.oldest + self.lookahead).min(self.epochs.saturating_sub(1));
        for epoch in self.oldest..=last {
            if epoch >= self.epochs {
                break;
            }
            let pool = self.open(epoch)?;
            if pool.is_exhausted() {
                continue;
            }
            let batches = size(pool);
            return pool.take(rank, batches);
        }
        Ok(None)
    }

    /// Credits a chunk `rank` finished.
    ///
    /// # Errors
    /// [`LogicError::UnknownChunk`] when no open pool holds that chunk for `rank`;
    /// [`LogicError::RankOutOfRange`].
    pub fn credit(&mut self, rank: usize, chunk: &Chunk) -> LogicResult<()> {
        let unknown = LogicError::UnknownChunk { rank, epoch: chunk.epoch, offset: chunk.offset };
        let pool = self.pools.iter_mut().find(|p| p.epoch() == chunk.epoch).ok_or(unknown)?;
        pool.credit(rank, chunk)
    }

    /// Removes and returns the oldest epoch if it is finished (call until `None` after each
    /// credit); its final coverage is returned with it.
    ///
    /// # Errors
    /// Only as [`ChunkPool::new`] when opening the pool, which cannot fail for a valid stream.
    pub fn pop_finished(&mut self) -> LogicResult<Option<Coverage>> {
        if self.is_finished() {
            return Ok(None);
        }
        let oldest = self.oldest;
        if !self.open(oldest)?.is_done() {
            return Ok(None);
        }
        let pool = self.pools.pop_front();
        self.oldest += 1;
        Ok(pool.map(|p| p.coverage()))
    }

    /// Retires `rank` in every open pool (its unfinished chunks return to their pools) and in
    /// pools opened later. Returns the re-queued chunks.
    ///
    /// # Errors
    /// [`LogicError::RankOutOfRange`].
    pub fn retire(&mut self, rank: usize) -> LogicResult<Vec<Chunk>> {
        if rank >= self.world {
            return Err(LogicError::RankOutOfRange { rank, world: self.world });
        }
        self.retired[rank] = true;
        let mut back = Vec::new();
        for pool in &mut self.pools {
            back.extend(pool.retire(rank)?);
        }
        Ok(back)
    }

    /// The coverage of every open pool, for a checkpoint.
    pub fn coverage(&self) -> StreamCoverage {
        StreamCoverage {
            oldest: self.oldest,
            pools: self.pools.iter().map(|p| p.coverage()).collect(),
        }
    }

    /// The pool of `epoch`, opening it (and any epochs before it) when needed.
    fn open(&mut self, epoch: usize) -> LogicResult<&mut ChunkPool> {
        while self.pools.back().map_or(self.oldest, |p| p.epoch() + 1) <= epoch {
            let next = self.pools.back().map_or(self.oldest, |p| p.epoch() + 1);
            let mut pool =
                ChunkPool::new(next, self.samples, self.batch_size, self.world, self.tail)?;
            for r in (0..self.world).filter(|&r| self.retired[r]) {
                pool.retire(r)?;
            }
            self.pools.push_back(pool);
        }
        let i = epoch - self.oldest;
        Ok(&mut self.pools[i])
    }
}

//! The coordinator's book of epochs: which chunks were handed out, which came back, and when
//! an epoch is complete.

use std::collections::VecDeque;
use std::time::Instant;

use crate::message::Chunk;
use crate::metrics::{EpochTally, WorkTally};

/// How an epoch is cut into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cutting {
    /// One fixed contiguous share per rank (equal batch counts, remainder to the first ranks):
    /// the same cut every run, so `Sync` is deterministic.
    Static,
    /// Progressive dispatch: small chunks handed out on demand, sized from ElChe's counts.
    Progressive {
        /// Smallest chunk in batches.
        min_chunk: usize,
    },
}

/// One epoch's pool of positions.
#[derive(Debug)]
struct Pool {
    epoch: usize,
    /// Positions handed out so far (progressive) — the next chunk starts here.
    cursor: usize,
    /// Static cut: whether each rank has taken its share.
    taken: Vec<bool>,
    /// Chunks handed out and not yet completed.
    outstanding: usize,
    started: Option<Instant>,
    finished: Option<Instant>,
    tally: EpochTally,
}

/// Every epoch not yet complete, oldest first; pools open on demand, at most one epoch ahead of
/// the oldest incomplete one.
#[derive(Debug)]
pub(crate) struct Dispatcher {
    world: usize,
    batch_size: usize,
    batches: usize,
    epochs: usize,
    cutting: Cutting,
    pools: VecDeque<Pool>,
    /// The oldest epoch not yet complete.
    oldest: usize,
}

impl Dispatcher {
    /// A book for `epochs` epochs of `batches` full batches of `batch_size` over `world` ranks.
    pub(crate) fn new(
        world: usize,
        batch_size: usize,
        batches: usize,
        epochs: usize,
        cutting: Cutting,
    ) -> Self {
        Dispatcher {
            world,
            batch_size,
            batches,
            epochs,
            cutting,
            pools: VecDeque::new(),
            oldest: 0,
        }
    }

    /// The oldest epoch not yet complete (`epochs` when all are).
    pub(crate) fn oldest(&self) -> usize {
        self.oldest
    }

    /// Whether the oldest incomplete epoch is the last one (nothing to stream into after it).
    pub(crate) fn in_last_epoch(&self) -> bool {
        self.oldest + 1 >= self.epochs
    }

    /// Whether every epoch is complete.
    pub(crate) fn all_done(&self) -> bool {
        self.oldest >= self.epochs
    }

    fn pool_mut(&mut self, epoch: usize) -> Option<&mut Pool> {
        if epoch >= self.epochs || epoch < self.oldest || epoch > self.oldest + 1 {
            return None;
        }
        while self.pools.back().is_none_or(|p| p.epoch < epoch) {
            let next = self.pools.back().map_or(self.oldest, |p| p.epoch + 1);
            self.pools.push_back(Pool {
                epoch: next,
                cursor: 0,
                taken: vec![false; self.world],
                outstanding: 0,
                started: None,
                finished: None,
                tally: EpochTally::new(self.world),
            });
        }
        self.pools.iter_mut().find(|p| p.epoch == epoch)
    }

    /// The static share of `rank`: (first batch, batches).
    fn share(&self, rank: usize) -> (usize, usize) {
        let base = self.batches / self.world;
        let extra = self.batches % self.world;
        let first = rank * base + rank.min(extra);
        (first, base + usize::from(rank < extra))
    }

    /// The next chunk for `rank`, if any may be handed out now. `counts` are ElChe's batches per
    /// window (used to size progressive chunks once `calibrated`).
    pub(crate) fn next_chunk(
        &mut self,
        rank: usize,
        counts: &[usize],
        calibrated: bool,
    ) -> Option<Chunk> {
        let bs = self.batch_size;
        let (world, batches) = (self.world, self.batches);
        let share = self.share(rank);
        let cutting = self.cutting;
        for epoch in self.oldest..(self.oldest + 2).min(self.epochs) {
            let Some(pool) = self.pool_mut(epoch) else { continue };
            let chunk = match cutting {
                Cutting::Static => {
                    if pool.taken.get(rank).copied().unwrap_or(true) {
                        continue;
                    }
                    pool.taken[rank] = true;
                    Chunk { epoch, offset: share.0 * bs, len: share.1 * bs }
                }
                Cutting::Progressive { min_chunk } => {
                    let rem = batches - pool.cursor / bs;
                    if rem == 0 {
                        continue;
                    }
                    let mine = counts.get(rank).copied().unwrap_or(1).max(1);
                    let size = if calibrated {
                        let total: usize = counts.iter().sum::<usize>().max(1);
                        let fair = (rem * mine).div_ceil(total);
                        (2 * mine).max(min_chunk).min(fair.max(min_chunk))
                    } else {
                        (batches / (world * 10)).max(min_chunk)
                    };
                    let size = size.min(rem);
                    let chunk = Chunk { epoch, offset: pool.cursor, len: size * bs };
                    pool.cursor += size * bs;
                    chunk
                }
            };
            pool.started.get_or_insert_with(Instant::now);
            if chunk.len == 0 {
                // An empty static share: nothing to train, nothing outstanding.
                continue;
            }
            pool.outstanding += 1;
            return Some(chunk);
        }
        None
    }

    /// Credits a completed chunk and its work.
    pub(crate) fn complete(&mut self, rank: usize, chunk: &Chunk, work: &WorkTally) {
        if let Some(pool) = self.pools.iter_mut().find(|p| p.epoch == chunk.epoch) {
            pool.outstanding = pool.outstanding.saturating_sub(1);
            pool.tally.add(rank, work);
            pool.finished = Some(Instant::now());
        }
    }

    /// Counts a reduce toward the oldest incomplete epoch.
    pub(crate) fn add_reduce(&mut self, sync_ms: f64) {
        let oldest = self.oldest;
        if let Some(pool) = self.pools.iter_mut().find(|p| p.epoch == oldest) {
            pool.tally.add_reduce(sync_ms);
        }
    }

    /// Removes the oldest epoch if it is complete: its number, tally and wall time in ms.
    pub(crate) fn pop_complete(&mut self) -> Option<(usize, EpochTally, f64)> {
        let bs = self.batch_size;
        let batches = self.batches;
        let cutting = self.cutting;
        let oldest = self.oldest;
        let pool = self.pool_mut(oldest)?;
        let handed_out = match cutting {
            Cutting::Static => pool.taken.iter().all(|&t| t),
            Cutting::Progressive { .. } => pool.cursor >= batches * bs,
        };
        if !handed_out || pool.outstanding > 0 {
            return None;
        }
        let pool = self.pools.pop_front()?;
        self.oldest += 1;
        let ms = match (pool.started, pool.finished) {
            (Some(s), Some(f)) => f.saturating_duration_since(s).as_secs_f64() * 1000.0,
            _ => 0.0,
        };
        Some((pool.epoch, pool.tally, ms))
    }

    /// Whether any chunk is handed out and not yet completed.
    pub(crate) fn any_outstanding(&self) -> bool {
        self.pools.iter().any(|p| p.outstanding > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    /// Hands out and completes chunks in a random rank order; every position of every epoch is
    /// handed out exactly once and epochs complete in order.
    #[test]
    fn every_position_once_per_epoch() -> Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        for case in 0..200 {
            let world = rng.random_range(1..6);
            let bs = rng.random_range(1..5);
            let batches = rng.random_range(world..60);
            let epochs = rng.random_range(1..4);
            let cutting = if case % 2 == 0 {
                Cutting::Static
            } else {
                Cutting::Progressive { min_chunk: rng.random_range(1..5) }
            };
            let counts: Vec<usize> = (0..world).map(|_| rng.random_range(1..8)).collect();
            let mut d = Dispatcher::new(world, bs, batches, epochs, cutting);
            let mut seen = vec![vec![0u32; batches * bs]; epochs];
            let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); world];
            let mut done = Vec::new();
            for _ in 0..100_000 {
                if d.all_done() {
                    break;
                }
                let r = rng.random_range(0..world);
                if rng.random_bool(0.5) {
                    if let Some(c) = d.next_chunk(r, &counts, case % 4 == 1) {
                        for n in &mut seen[c.epoch][c.offset..c.offset + c.len] {
                            *n += 1;
                        }
                        held[r].push(c);
                    }
                } else if let Some(c) = held[r].pop() {
                    let w = WorkTally { batches: c.len / bs, samples: c.len, ..Default::default() };
                    d.complete(r, &c, &w);
                }
                while let Some((e, tally, _)) = d.pop_complete() {
                    let m = tally.finish(e, 1.0, &[]);
                    if m.samples != batches * bs {
                        return Err(format!("epoch {e}: {} samples", m.samples));
                    }
                    done.push(e);
                }
            }
            if !d.all_done() || done != (0..epochs).collect::<Vec<_>>() {
                return Err(format!("case {case}: epochs done {done:?}"));
            }
            if seen.iter().flatten().any(|&n| n != 1) {
                return Err(format!("case {case}: a position was not handed out exactly once"));
            }
        }
        Ok(())
    }
}

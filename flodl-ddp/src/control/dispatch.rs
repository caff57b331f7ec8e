//! The coordinator's book of epochs: which chunks were handed out, which came back, which must
//! be handed out again (a dead rank's), and when an epoch is complete.

use std::collections::VecDeque;
use std::time::Instant;

use crate::checkpoint::SampleRange;
use crate::control::partition;
use crate::link::wire::Chunk;
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

/// A half-open span of permutation positions, `start..end`.
type Span = (usize, usize);

/// One epoch's pool of positions.
#[derive(Debug)]
struct Pool {
    epoch: usize,
    /// Static cut: the spans each rank is still to be handed, in order.
    assigned: Vec<VecDeque<Span>>,
    /// Spans anyone may be handed (progressive: the whole epoch at first; both cuts: a dead
    /// rank's work), in position order.
    free: VecDeque<Span>,
    /// Chunks handed out and not yet completed, per rank.
    held: Vec<Vec<Chunk>>,
    /// Completed spans.
    done: Vec<Span>,
    started: Option<Instant>,
    finished: Option<Instant>,
    tally: EpochTally,
}

impl Pool {
    fn handed_out(&self) -> bool {
        self.free.is_empty() && self.assigned.iter().all(VecDeque::is_empty)
    }

    fn outstanding(&self) -> bool {
        self.held.iter().any(|h| !h.is_empty())
    }
}

/// Every epoch not yet complete, oldest first; pools open on demand, at most one epoch ahead of
/// the oldest incomplete one.
///
/// A retired (dead) rank is handed nothing more; what it held and had not completed, and under
/// the static cut what it was still to be handed, is split over the live ranks (static) or put
/// back in the free spans (progressive), so every position of an epoch is still completed once.
#[derive(Debug)]
pub(crate) struct Dispatcher {
    world: usize,
    batch_size: usize,
    batches: usize,
    epochs: usize,
    cutting: Cutting,
    live: Vec<bool>,
    pools: VecDeque<Pool>,
    /// The oldest epoch not yet complete.
    oldest: usize,
    /// Completed spans of epochs not yet opened (from a resumed checkpoint).
    resumed: Vec<(usize, Vec<Span>)>,
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
            live: vec![true; world],
            pools: VecDeque::new(),
            oldest: 0,
            resumed: Vec::new(),
        }
    }

    /// A book that resumes at epoch `oldest`, where `coverage` lists, per epoch, the position
    /// ranges already completed: only the rest is handed out. Under the static cut each rank is
    /// handed what is left of its own share, so a resumed `Sync` run trains exactly the
    /// batches the interrupted one would have.
    ///
    /// # Errors
    /// A range not aligned to the batch size or past the epoch, or coverage of an epoch before
    /// `oldest` (coverage of epochs past this book's last is ignored: they are not trained).
    pub(crate) fn resume(
        mut self,
        oldest: usize,
        coverage: &[(usize, Vec<SampleRange>)],
    ) -> std::result::Result<Self, String> {
        let total = self.batches * self.batch_size;
        if oldest > self.epochs {
            return Err(format!("resumes at epoch {oldest} of a {}-epoch run", self.epochs));
        }
        for (epoch, ranges) in coverage {
            if *epoch >= self.epochs {
                // A run resumed with fewer epochs than the one that saved never trains it.
                continue;
            }
            if *epoch < oldest {
                return Err(format!(
                    "coverage of epoch {epoch}, before the resumed epoch {oldest}"
                ));
            }
            let mut spans = Vec::with_capacity(ranges.len());
            for r in ranges {
                let end = r.offset.checked_add(r.size).filter(|&e| e <= total);
                let Some(end) = end else {
                    return Err(format!("range {r:?} of epoch {epoch} runs past {total}"));
                };
                if r.offset % self.batch_size != 0 || r.size % self.batch_size != 0 {
                    return Err(format!(
                        "range {r:?} is not aligned to batches of {}",
                        self.batch_size
                    ));
                }
                spans.push((r.offset, end));
            }
            self.resumed.push((*epoch, spans));
        }
        self.oldest = oldest;
        Ok(self)
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

    /// Whether `rank` is still handed work (not retired).
    pub(crate) fn is_live(&self, rank: usize) -> bool {
        self.live.get(rank).copied().unwrap_or(false)
    }

    /// The static shares of `members` ranks, as spans of positions: equal batch counts, one
    /// more for the first ranks ([`partition::equal_sizes`]).
    fn shares(&self, members: usize) -> Vec<Span> {
        let sizes = partition::equal_sizes(self.batches, members).unwrap_or_default();
        let bs = self.batch_size;
        partition::shares(&sizes).iter().map(|s| (s.offset * bs, (s.offset + s.len) * bs)).collect()
    }

    fn open(&mut self, epoch: usize) -> Pool {
        let total = self.batches * self.batch_size;
        let done = match self.resumed.iter().position(|(e, _)| *e == epoch) {
            Some(i) => self.resumed.swap_remove(i).1,
            None => Vec::new(),
        };
        let mut assigned = vec![VecDeque::new(); self.world];
        let mut free = VecDeque::new();
        match self.cutting {
            Cutting::Static => {
                let members: Vec<usize> = (0..self.world).filter(|&r| self.live[r]).collect();
                for (&rank, share) in members.iter().zip(self.shares(members.len())) {
                    assigned[rank] = subtract(&[share], &done).into();
                }
            }
            Cutting::Progressive { .. } => free = subtract(&[(0, total)], &done).into(),
        }
        Pool {
            epoch,
            assigned,
            free,
            held: vec![Vec::new(); self.world],
            done,
            started: None,
            finished: None,
            tally: EpochTally::new(self.world),
        }
    }

    fn pool_mut(&mut self, epoch: usize) -> Option<&mut Pool> {
        if epoch >= self.epochs || epoch < self.oldest || epoch > self.oldest + 1 {
            return None;
        }
        while self.pools.back().is_none_or(|p| p.epoch < epoch) {
            let next = self.pools.back().map_or(self.oldest, |p| p.epoch + 1);
            let pool = self.open(next);
            self.pools.push_back(pool);
        }
        self.pools.iter_mut().find(|p| p.epoch == epoch)
    }

    /// The next chunk for `rank`, if any may be handed out now. `counts` are ElChe's batches per
    /// window (used to size progressive chunks once `calibrated`).
    pub(crate) fn next_chunk(
        &mut self,
        rank: usize,
        counts: &[usize],
        calibrated: bool,
    ) -> Option<Chunk> {
        if !self.is_live(rank) {
            return None;
        }
        let bs = self.batch_size;
        let (world, batches) = (self.world, self.batches);
        let cutting = self.cutting;
        for epoch in self.oldest..(self.oldest + 2).min(self.epochs) {
            let Some(pool) = self.pool_mut(epoch) else { continue };
            let span = match cutting {
                Cutting::Static => {
                    pool.assigned[rank].pop_front().or_else(|| pool.free.pop_front())
                }
                Cutting::Progressive { min_chunk } => {
                    let rem: usize = pool.free.iter().map(|s| (s.1 - s.0) / bs).sum();
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
                    pool.free.pop_front().map(|(start, end)| {
                        let cut = (start + size * bs).min(end);
                        if cut < end {
                            pool.free.push_front((cut, end));
                        }
                        (start, cut)
                    })
                }
            };
            let Some((start, end)) = span else { continue };
            let chunk = Chunk { epoch, offset: start, len: end - start };
            pool.started.get_or_insert_with(Instant::now);
            pool.held[rank].push(chunk);
            return Some(chunk);
        }
        None
    }

    /// Credits a completed chunk and its work; `false` (and nothing credited) when `rank` does
    /// not hold it (a retired rank's late report).
    pub(crate) fn complete(&mut self, rank: usize, chunk: &Chunk, work: &WorkTally) -> bool {
        let Some(pool) = self.pools.iter_mut().find(|p| p.epoch == chunk.epoch) else {
            return false;
        };
        let Some(held) = pool.held.get_mut(rank) else { return false };
        let Some(i) = held.iter().position(|c| c == chunk) else { return false };
        held.remove(i);
        pool.done.push((chunk.offset, chunk.offset + chunk.len));
        pool.tally.add(rank, work);
        pool.finished = Some(Instant::now());
        true
    }

    /// Retires `rank`: it is handed nothing more, and its unfinished work goes back to the live
    /// ranks (split evenly in batches under the static cut, to the free spans otherwise).
    /// Returns the chunks it held, now re-queued. Retiring twice is a no-op.
    pub(crate) fn retire(&mut self, rank: usize) -> Vec<Chunk> {
        if !self.is_live(rank) {
            return Vec::new();
        }
        self.live[rank] = false;
        let live: Vec<usize> = (0..self.world).filter(|&r| self.live[r]).collect();
        let (bs, cutting) = (self.batch_size, self.cutting);
        let mut requeued = Vec::new();
        for pool in &mut self.pools {
            let held = std::mem::take(&mut pool.held[rank]);
            let mut orphans: Vec<Span> =
                held.iter().map(|c| (c.offset, c.offset + c.len)).collect();
            orphans.extend(pool.assigned[rank].drain(..));
            orphans.sort_unstable();
            requeued.extend(held);
            match cutting {
                Cutting::Static if !live.is_empty() => {
                    for (piece, &to) in split(&orphans, live.len(), bs).into_iter().zip(&live) {
                        pool.assigned[to].extend(piece);
                    }
                }
                _ => {
                    let mut free: Vec<Span> = pool.free.drain(..).chain(orphans).collect();
                    free.sort_unstable();
                    pool.free = free.into();
                }
            }
        }
        requeued
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
        let oldest = self.oldest;
        let pool = self.pool_mut(oldest)?;
        if !pool.handed_out() || pool.outstanding() {
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
        self.pools.iter().any(Pool::outstanding)
    }

    /// The completed position ranges of every epoch not yet complete (those opened and those
    /// resumed but not yet opened), plus `partial`: `(epoch, range)`, the leading part of held
    /// chunks that their ranks report trained. Epochs with nothing done are left out.
    pub(crate) fn coverage(
        &self,
        partial: &[(usize, SampleRange)],
    ) -> Vec<(usize, Vec<SampleRange>)> {
        let mut out: Vec<(usize, Vec<SampleRange>)> = Vec::new();
        let spans =
            self.pools.iter().map(|p| (p.epoch, &p.done)).chain(
                self.resumed.iter().filter(|(e, _)| *e >= self.oldest).map(|(e, d)| (*e, d)),
            );
        for (epoch, done) in spans {
            let mut ranges: Vec<SampleRange> =
                done.iter().map(|&(s, e)| SampleRange::new(s, e - s)).collect();
            if let Some(pool) = self.pools.iter().find(|p| p.epoch == epoch) {
                for chunk in pool.held.iter().flatten() {
                    let (s, e) = (chunk.offset, chunk.offset + chunk.len);
                    let inside = |r: &SampleRange| r.offset == s && r.offset + r.size <= e;
                    ranges.extend(
                        partial.iter().filter(|(pe, r)| *pe == epoch && inside(r)).map(|(_, r)| *r),
                    );
                }
            }
            if !ranges.is_empty() {
                ranges.sort_unstable();
                out.push((epoch, ranges));
            }
        }
        out
    }
}

/// `from` minus `done`: the sub-spans of `from` no span of `done` covers, in order.
fn subtract(from: &[Span], done: &[Span]) -> Vec<Span> {
    let mut done = done.to_vec();
    done.sort_unstable();
    let mut out = Vec::new();
    for &(mut start, end) in from {
        for &(ds, de) in &done {
            if de <= start || ds >= end {
                continue;
            }
            if ds > start {
                out.push((start, ds));
            }
            start = start.max(de);
        }
        if start < end {
            out.push((start, end));
        }
    }
    out
}

/// Cuts `spans` (in order) into `parts` consecutive pieces of whole batches, as equal as
/// possible (the first pieces one batch larger, as [`partition::equal_sizes`] cuts).
fn split(spans: &[Span], parts: usize, bs: usize) -> Vec<Vec<Span>> {
    let total: usize = spans.iter().map(|s| (s.1 - s.0) / bs).sum();
    let sizes = partition::equal_sizes(total, parts).unwrap_or_default();
    let mut out = vec![Vec::new(); sizes.len()];
    let mut spans = spans.iter().copied();
    let mut current = spans.next();
    for (piece, size) in out.iter_mut().zip(sizes) {
        let mut want = size * bs;
        while want > 0 {
            let Some((s, e)) = current else { break };
            let cut = (s + want).min(e);
            piece.push((s, cut));
            want -= cut - s;
            current = if cut < e { Some((cut, e)) } else { spans.next() };
        }
    }
    out
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
                    if !d.complete(r, &c, &w) {
                        return Err(format!("case {case}: {c:?} not held by rank {r}"));
                    }
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

    /// Random deaths at random moments: every position of every epoch is still completed
    /// exactly once by a live rank, a retired rank is handed nothing, and its late report is
    /// refused.
    #[test]
    fn retired_work_is_completed_once_by_the_living() -> Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
        for case in 0..300 {
            let world = rng.random_range(2..6);
            let bs = rng.random_range(1..4);
            let batches = rng.random_range(world..50);
            let epochs = rng.random_range(1..4);
            let cutting = if case % 2 == 0 {
                Cutting::Static
            } else {
                Cutting::Progressive { min_chunk: rng.random_range(1..4) }
            };
            let counts = vec![3; world];
            let mut d = Dispatcher::new(world, bs, batches, epochs, cutting);
            let mut completed = vec![vec![0u32; batches * bs]; epochs];
            let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); world];
            let mut dead = vec![false; world];
            for _ in 0..100_000 {
                if d.all_done() {
                    break;
                }
                let r = rng.random_range(0..world);
                let alive = dead.iter().filter(|&&x| !x).count();
                if alive > 1 && rng.random_bool(0.01) {
                    let requeued = d.retire(r);
                    if !dead[r] && requeued.len() != held[r].len() {
                        return Err(format!(
                            "case {case}: requeued {requeued:?}, held {:?}",
                            held[r]
                        ));
                    }
                    dead[r] = true;
                    // A late report of a dead rank is refused.
                    if let Some(c) = held[r].pop()
                        && d.complete(r, &c, &WorkTally::default())
                    {
                        return Err(format!("case {case}: a retired rank's chunk was credited"));
                    }
                    held[r].clear();
                } else if rng.random_bool(0.5) {
                    if let Some(c) = d.next_chunk(r, &counts, true) {
                        if dead[r] {
                            return Err(format!("case {case}: retired rank {r} was handed {c:?}"));
                        }
                        held[r].push(c);
                    }
                } else if let Some(c) = held[r].pop() {
                    let w = WorkTally { batches: c.len / bs, samples: c.len, ..Default::default() };
                    if !d.complete(r, &c, &w) {
                        return Err(format!("case {case}: {c:?} refused"));
                    }
                    for n in &mut completed[c.epoch][c.offset..c.offset + c.len] {
                        *n += 1;
                    }
                }
                while d.pop_complete().is_some() {}
            }
            if !d.all_done() {
                return Err(format!("case {case}: the run did not finish"));
            }
            if completed.iter().flatten().any(|&n| n != 1) {
                return Err(format!("case {case}: a position was not completed exactly once"));
            }
        }
        Ok(())
    }

    /// Interrupts a book at a random moment, resumes a new one from its coverage (completed
    /// chunks plus the trained part of held ones): together they complete every position once,
    /// and under the static cut each rank is handed exactly the positions it would have been.
    #[test]
    fn resume_hands_out_only_the_uncovered_rest() -> Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(13);
        for case in 0..300 {
            let world = rng.random_range(1..5);
            let bs = rng.random_range(1..4);
            let batches = rng.random_range(world..40);
            let epochs = rng.random_range(1..4);
            let cutting = if case % 2 == 0 {
                Cutting::Static
            } else {
                Cutting::Progressive { min_chunk: rng.random_range(1..4) }
            };
            let counts = vec![2; world];
            // Reference: which rank trains each position, uninterrupted (static only).
            let mut owner = vec![vec![usize::MAX; batches * bs]; epochs];
            let mut completed = vec![vec![0u32; batches * bs]; epochs];
            let mut d = Dispatcher::new(world, bs, batches, epochs, cutting);
            let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); world];
            let stop_after = rng.random_range(0..200);
            for _ in 0..stop_after {
                if d.all_done() {
                    break;
                }
                let r = rng.random_range(0..world);
                if rng.random_bool(0.5) {
                    if let Some(c) = d.next_chunk(r, &counts, false) {
                        held[r].push(c);
                    }
                } else if let Some(c) = held[r].pop() {
                    d.complete(r, &c, &WorkTally::default());
                    for p in c.offset..c.offset + c.len {
                        completed[c.epoch][p] += 1;
                        owner[c.epoch][p] = r;
                    }
                }
                while d.pop_complete().is_some() {}
            }
            // Each held chunk was partly trained: a random number of leading batches.
            let mut partial = Vec::new();
            for (r, hs) in held.iter().enumerate() {
                for c in hs {
                    let k = rng.random_range(0..=c.len / bs);
                    if k > 0 {
                        partial.push((c.epoch, SampleRange::new(c.offset, k * bs)));
                        for p in c.offset..c.offset + k * bs {
                            completed[c.epoch][p] += 1;
                            owner[c.epoch][p] = r;
                        }
                    }
                }
            }
            let coverage = d.coverage(&partial);
            let oldest = d.oldest();
            let mut e = Dispatcher::new(world, bs, batches, epochs, cutting)
                .resume(oldest, &coverage)
                .map_err(|e| format!("case {case}: {e}"))?;
            let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); world];
            for _ in 0..100_000 {
                if e.all_done() {
                    break;
                }
                let r = rng.random_range(0..world);
                if rng.random_bool(0.5) {
                    if let Some(c) = e.next_chunk(r, &counts, false) {
                        held[r].push(c);
                    }
                } else if let Some(c) = held[r].pop() {
                    e.complete(r, &c, &WorkTally::default());
                    for p in c.offset..c.offset + c.len {
                        completed[c.epoch][p] += 1;
                        if cutting == Cutting::Static && owner[c.epoch][p] != usize::MAX {
                            return Err(format!("case {case}: position {p} trained twice"));
                        }
                        owner[c.epoch][p] = r;
                    }
                }
                while e.pop_complete().is_some() {}
            }
            if !e.all_done() {
                return Err(format!("case {case}: the resumed run did not finish"));
            }
            if completed.iter().flatten().any(|&n| n != 1) {
                return Err(format!("case {case}: a position was not completed exactly once"));
            }
            if cutting == Cutting::Static {
                let reference = Dispatcher::new(world, bs, batches, epochs, cutting);
                for (epoch, owners) in owner.iter().enumerate() {
                    for (index, (s, e)) in reference.shares(world).into_iter().enumerate() {
                        if owners[s..e].iter().any(|&o| o != index) {
                            return Err(format!("case {case}: epoch {epoch} share {index} moved"));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A book with fewer epochs than the run that saved the coverage ignores the epochs it will
    /// not train; coverage of an epoch before the resumed one is refused.
    #[test]
    fn resume_into_fewer_epochs_ignores_the_later_ones() -> Result<(), String> {
        let covered = vec![(1, vec![SampleRange::new(0, 8)]), (2, vec![SampleRange::new(0, 4)])];
        let mut d = Dispatcher::new(2, 2, 6, 2, Cutting::Progressive { min_chunk: 1 })
            .resume(1, &covered)?;
        let mut trained = Vec::new();
        while let Some(c) = d.next_chunk(0, &[1, 1], false) {
            d.complete(0, &c, &WorkTally::default());
            trained.push(c);
            while d.pop_complete().is_some() {}
        }
        assert!(d.all_done(), "the resumed epoch did not finish");
        assert!(trained.iter().all(|c| c.epoch == 1 && c.offset >= 8), "{trained:?}");
        assert_eq!(trained.iter().map(|c| c.len).sum::<usize>(), 4, "{trained:?}");
        let early = Dispatcher::new(2, 2, 6, 3, Cutting::Static).resume(2, &covered);
        assert!(early.is_err(), "coverage before the resumed epoch was accepted");
        Ok(())
    }
}

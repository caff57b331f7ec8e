//! The coordinator's book of epochs: which chunks were handed out, which came back, which must
//! be handed out again (a dead rank's), how far the consensus holds each rank's work, and when
//! an epoch is complete.
//!
//! Positions index an epoch's permutation (`0..batches × batch_size`; the `samples % batch_size`
//! tail is not trained that epoch). A chunk is a contiguous run of whole batches handed to one
//! rank, which trains its chunks in the order it was handed them.

use std::collections::VecDeque;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::checkpoint::{EpochCoverage, SampleRange};
use crate::control::change::Change;
use crate::control::logic_error::{LogicError, LogicResult};
use crate::control::metrics::{EpochTally, WorkTally};
use crate::control::partition;
use crate::control::policy::Policy;

/// A batch-aligned slice of one epoch's permutation handed to one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Chunk {
    /// The epoch whose permutation is sliced.
    pub epoch: usize,
    /// First position in the permutation.
    pub offset: usize,
    /// Number of positions (a whole number of batches).
    pub len: usize,
}

impl Chunk {
    /// One past the last position.
    pub fn end(&self) -> usize {
        self.offset + self.len
    }

    /// Whole batches of `batch_size` in the chunk.
    pub fn batches(&self, batch_size: usize) -> usize {
        self.len / batch_size.max(1)
    }
}

/// How an epoch is cut into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cutting {
    /// One fixed contiguous share per rank (equal batch counts, remainder to the first ranks):
    /// the same cut every run, so `Sync` is deterministic.
    Static,
    /// Progressive dispatch: small chunks handed out on demand, sized from ElChe's counts
    /// (see [`Dispatcher::next_chunk`]).
    Progressive {
        /// Smallest chunk in batches.
        min_chunk: usize,
    },
}

impl Cutting {
    /// The cut `policy` trains with: static shares under `Sync` (deterministic runs),
    /// progressive chunks of at least `min_chunk` batches otherwise.
    pub fn for_policy(policy: Policy, min_chunk: usize) -> Cutting {
        if policy.is_progressive() { Cutting::Progressive { min_chunk } } else { Cutting::Static }
    }
}

/// A half-open span of permutation positions, `start..end`.
type Span = (usize, usize);

/// A chunk handed out and not yet completed, with where it starts in its rank's stream of
/// batches (the batches handed to the rank before it).
#[derive(Debug, Clone, Copy)]
struct Held {
    chunk: Chunk,
    first: u64,
}

/// One epoch's pool of positions.
#[derive(Debug)]
struct Pool {
    epoch: usize,
    /// Static cut: the spans each rank is still to be handed, in order.
    assigned: Vec<VecDeque<Span>>,
    /// Spans anyone may be handed (progressive: the whole epoch at first; both cuts: a dead
    /// rank's work), in position order.
    free: VecDeque<Span>,
    /// Chunks handed out and not yet completed, per rank, in the order they were handed.
    held: Vec<Vec<Held>>,
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
/// the oldest incomplete one (under every policy: a rank done with its part of an epoch starts
/// on the next one instead of idling at the epoch's end).
///
/// A retired (dead) rank is handed nothing more. What it held and the consensus does not hold
/// (the batches past those it trained into completed reduces, see [`Dispatcher::add_reduce`]),
/// and under the static cut what it was still to be handed, is split over the live ranks
/// (static) or put back in the free spans (progressive); what the consensus holds counts as
/// completed, by the dead rank. So every position of an epoch is trained into the consensus
/// once, except a batch a rank trained and died before reducing.
#[derive(Debug)]
pub struct Dispatcher {
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
    /// Static cut of a resumed epoch: split its rest evenly over the ranks (a resume onto
    /// another world) instead of handing each rank the rest of its own share.
    reshard: bool,
    /// Per rank: batches handed to it so far, and how many of them the consensus holds (the
    /// sum of its steps in completed reduces). It trains them in the order handed.
    handed: Vec<u64>,
    reduced: Vec<u64>,
}

impl Dispatcher {
    /// A book for `epochs` epochs of `batches` full batches of `batch_size` over `world` ranks.
    pub fn new(
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
            reshard: false,
            handed: vec![0; world],
            reduced: vec![0; world],
        }
    }

    /// A book that resumes at epoch `oldest`, where `coverage` lists, per epoch, the position
    /// ranges already completed (as a checkpoint stores them): only the rest is handed out.
    /// Under the static cut each rank is handed what is left of its own share, so a resumed
    /// `Sync` run trains exactly the batches the interrupted one would have.
    ///
    /// # Errors
    /// [`LogicError::InvalidCoverage`] for coverage of another epoch size, a range not aligned
    /// to the batch size, or coverage of an epoch before `oldest` (coverage of epochs past this
    /// book's last is ignored: they are not trained); [`LogicError::InvalidValue`] when
    /// `oldest` is past the last epoch.
    pub fn resume(mut self, oldest: usize, coverage: &[EpochCoverage]) -> LogicResult<Self> {
        let total = self.batches * self.batch_size;
        if oldest > self.epochs {
            return Err(LogicError::InvalidValue { what: "resumed epoch", value: oldest as f64 });
        }
        for c in coverage {
            let epoch = usize::try_from(c.epoch).unwrap_or(usize::MAX);
            if epoch >= self.epochs {
                // A run resumed with fewer epochs than the one that saved never trains it.
                continue;
            }
            let bad = |reason| LogicError::InvalidCoverage { epoch, reason };
            if epoch < oldest {
                return Err(bad("the epoch is before the resumed one"));
            }
            if c.total != total {
                return Err(bad("the epoch's size differs from this run's"));
            }
            let mut spans = Vec::with_capacity(c.completed().len());
            for r in c.completed() {
                if r.offset % self.batch_size != 0 || r.size % self.batch_size != 0 {
                    return Err(bad("a range is not aligned to the batch size"));
                }
                // Within the total: the coverage is validated when built or decoded.
                spans.push((r.offset, r.offset + r.size));
            }
            self.resumed.push((epoch, spans));
        }
        self.oldest = oldest;
        Ok(self)
    }

    /// A resumed book whose resumed epochs are re-sharded: under the static cut the rest of
    /// each (what its coverage leaves) is split evenly in whole batches over the live ranks, in
    /// position order, as a resume onto a world of another size needs (the saving world's
    /// shares minus what was done would leave the new ranks unequal parts). Progressive cuts
    /// hand out the rest on demand anyway. Epochs with no coverage are cut as usual.
    pub fn reshard(mut self) -> Self {
        self.reshard = true;
        self
    }

    /// The oldest epoch not yet complete (`epochs` when all are).
    pub fn oldest(&self) -> usize {
        self.oldest
    }

    /// Whether the oldest incomplete epoch is the last one (nothing to stream into after it).
    pub fn in_last_epoch(&self) -> bool {
        self.oldest + 1 >= self.epochs
    }

    /// Whether every epoch is complete.
    pub fn all_done(&self) -> bool {
        self.oldest >= self.epochs
    }

    /// Whether `rank` is still handed work (not retired).
    pub fn is_live(&self, rank: usize) -> bool {
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
        let (done, resumed) = match self.resumed.iter().position(|(e, _)| *e == epoch) {
            Some(i) => (self.resumed.swap_remove(i).1, true),
            None => (Vec::new(), false),
        };
        let mut assigned = vec![VecDeque::new(); self.world];
        let mut free = VecDeque::new();
        match self.cutting {
            Cutting::Static if resumed && self.reshard => {
                let members: Vec<usize> = (0..self.world).filter(|&r| self.live[r]).collect();
                let rest = subtract(&[(0, total)], &done);
                for (&rank, piece) in
                    members.iter().zip(split(&rest, members.len(), self.batch_size))
                {
                    assigned[rank] = piece.into();
                }
            }
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

    /// The next chunk for `rank`, if any may be handed out now, from the oldest open epoch
    /// with positions left.
    ///
    /// Static cut: the rest of the rank's share, then any dead rank's work. Progressive:
    /// `counts` are ElChe's batches per window; once `calibrated` a chunk is the rank's share of
    /// what is left (`ceil(left × counts[r] / Σcounts)`) but at most two of its windows, so
    /// most of an epoch stays in the pool to follow a change of speed or a death; before, a
    /// probe of `batches / (world × 10)`. Never under `min_chunk` batches, unless less is left
    /// in the span it is cut from.
    ///
    /// `now` is when it is handed out: the first chunk of an epoch starts the epoch's clock.
    pub fn next_chunk(
        &mut self,
        rank: usize,
        counts: &[usize],
        calibrated: bool,
        now: Instant,
    ) -> Option<Chunk> {
        if !self.is_live(rank) {
            return None;
        }
        let bs = self.batch_size;
        let (world, batches) = (self.world, self.batches);
        let cutting = self.cutting;
        let first = self.handed[rank];
        for epoch in self.oldest..(self.oldest + 2).min(self.epochs) {
            let Some(pool) = self.pool_mut(epoch) else { continue };
            let span = match cutting {
                Cutting::Static => {
                    pool.assigned[rank].pop_front().or_else(|| pool.free.pop_front())
                }
                Cutting::Progressive { min_chunk } => {
                    let left: usize = pool.free.iter().map(|s| (s.1 - s.0) / bs).sum();
                    if left == 0 {
                        continue;
                    }
                    let mine = counts.get(rank).copied().unwrap_or(1).max(1);
                    let size = if calibrated {
                        let total: usize = counts.iter().sum::<usize>().max(1);
                        let fair = (left * mine).div_ceil(total);
                        fair.min(2 * mine).max(min_chunk)
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
            pool.started.get_or_insert(now);
            pool.held[rank].push(Held { chunk, first });
            self.handed[rank] += chunk.batches(bs) as u64;
            return Some(chunk);
        }
        None
    }

    /// What `rank` will train next, as chunks in order: the chunks it holds (from its oldest),
    /// then a forecast of what it will be handed, at most `horizon` batches in all, walking from
    /// the oldest open epoch into the next. This is the stage advisory the coordinator sends
    /// (BEHAVIOUR §9.3): its own span first, then speculative margins.
    ///
    /// Static cut: the rest of its share, exactly (then its share of the next epoch).
    /// Progressive: the free spans are cut as [`next_chunk`](Self::next_chunk) would for ranks
    /// asking in the order their held work runs out at the speeds `counts` (batches per window)
    /// describe; the pieces that would fall to `rank` are its forecast. Speculative: another
    /// rank may get them, which costs only the reads (only dispatched chunks are trained).
    pub fn forecast(
        &self,
        rank: usize,
        counts: &[usize],
        calibrated: bool,
        horizon: usize,
    ) -> Vec<Chunk> {
        let mut out = Vec::new();
        if !self.is_live(rank) {
            return out;
        }
        let bs = self.batch_size;
        let mut budget = horizon;
        let take = |out: &mut Vec<Chunk>, budget: &mut usize, c: Chunk| -> bool {
            let n = c.batches(bs).min(*budget);
            if n > 0 {
                out.push(Chunk { epoch: c.epoch, offset: c.offset, len: n * bs });
                *budget -= n;
            }
            *budget > 0
        };
        for pool in &self.pools {
            for h in &pool.held[rank] {
                if !take(&mut out, &mut budget, h.chunk) {
                    return out;
                }
            }
        }
        let last = (self.oldest + 2).min(self.epochs);
        // The spans still to be handed out, per epoch from the oldest: (epoch, assigned to
        // each rank, free).
        let total = self.batches * bs;
        let members: Vec<usize> = (0..self.world).filter(|&r| self.live[r]).collect();
        let mut left: Vec<(usize, Vec<VecDeque<Span>>, VecDeque<Span>)> = Vec::new();
        for epoch in self.oldest..last {
            match self.pools.iter().find(|p| p.epoch == epoch) {
                Some(p) => left.push((epoch, p.assigned.clone(), p.free.clone())),
                None => {
                    let done: &[Span] = self
                        .resumed
                        .iter()
                        .find(|(e, _)| *e == epoch)
                        .map_or(&[], |(_, d)| d.as_slice());
                    let mut assigned = vec![VecDeque::new(); self.world];
                    let mut free = VecDeque::new();
                    match self.cutting {
                        Cutting::Static => {
                            for (&r, share) in members.iter().zip(self.shares(members.len())) {
                                assigned[r] = subtract(&[share], done).into();
                            }
                        }
                        Cutting::Progressive { .. } => free = subtract(&[(0, total)], done).into(),
                    }
                    left.push((epoch, assigned, free));
                }
            }
        }
        match self.cutting {
            Cutting::Static => {
                for (epoch, assigned, _) in &left {
                    for &(start, end) in &assigned[rank] {
                        let c = Chunk { epoch: *epoch, offset: start, len: end - start };
                        if !take(&mut out, &mut budget, c) {
                            return out;
                        }
                    }
                }
            }
            Cutting::Progressive { min_chunk } => {
                // When each live rank asks next, in units of windows: its held batches over
                // its batches per window.
                let speed = |r: usize| counts.get(r).copied().unwrap_or(1).max(1) as f64;
                let mut clock: Vec<f64> = (0..self.world)
                    .map(|r| {
                        let held: usize = self
                            .pools
                            .iter()
                            .flat_map(|p| &p.held[r])
                            .map(|h| h.chunk.batches(bs))
                            .sum();
                        held as f64 / speed(r)
                    })
                    .collect();
                let world = self.world;
                for (epoch, _, free) in &mut left {
                    let mut guard = 0usize;
                    while let Some((start, end)) = free.pop_front() {
                        guard += 1;
                        if guard > 100_000 {
                            return out;
                        }
                        let Some(&q) = members
                            .iter()
                            .min_by(|&&a, &&b| clock[a].total_cmp(&clock[b]).then(a.cmp(&b)))
                        else {
                            return out;
                        };
                        let remaining: usize = (end - start) / bs
                            + free.iter().map(|s| (s.1 - s.0) / bs).sum::<usize>();
                        let mine = counts.get(q).copied().unwrap_or(1).max(1);
                        let size = if calibrated {
                            let sum: usize = counts.iter().sum::<usize>().max(1);
                            (remaining * mine).div_ceil(sum).min(2 * mine).max(min_chunk)
                        } else {
                            (self.batches / (world * 10)).max(min_chunk)
                        }
                        .max(1);
                        let cut = (start + size * bs).min(end);
                        if cut < end {
                            free.push_front((cut, end));
                        }
                        clock[q] += ((cut - start) / bs) as f64 / speed(q);
                        if q == rank {
                            let c = Chunk { epoch: *epoch, offset: start, len: cut - start };
                            if !take(&mut out, &mut budget, c) {
                                return out;
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Credits a completed chunk and its work; `false` (and nothing credited) when `rank` does
    /// not hold it (a retired rank's late report). `now` is when it was reported: the last
    /// completion of an epoch stops its clock.
    pub fn complete(&mut self, rank: usize, chunk: &Chunk, work: &WorkTally, now: Instant) -> bool {
        let Some(pool) = self.pools.iter_mut().find(|p| p.epoch == chunk.epoch) else {
            return false;
        };
        let Some(held) = pool.held.get_mut(rank) else { return false };
        let Some(i) = held.iter().position(|h| h.chunk == *chunk) else { return false };
        held.remove(i);
        pool.done.push((chunk.offset, chunk.end()));
        pool.tally.add(rank, work);
        pool.finished = Some(now);
        true
    }

    /// Retires `rank`: it is handed nothing more. Of each chunk it held, the leading batches
    /// the consensus holds count as completed (by it, in the epoch's metrics) and the rest goes
    /// back to the live ranks with what it was still to be handed (split evenly in batches
    /// under the static cut, to the free spans otherwise). The consensus holds the rank's steps
    /// in the reduces recorded by [`add_reduce`](Self::add_reduce) plus `pending`: its steps in
    /// a reduce still in progress that already holds them (its collective returned, or its
    /// snapshot is being averaged). Returns the re-queued parts of its chunks. Retiring twice
    /// is a no-op. `now` is when it died (the batches the consensus holds complete then).
    pub fn retire(&mut self, rank: usize, pending: usize, now: Instant) -> Vec<Chunk> {
        if !self.is_live(rank) {
            return Vec::new();
        }
        self.live[rank] = false;
        let live: Vec<usize> = (0..self.world).filter(|&r| self.live[r]).collect();
        let (bs, cutting) = (self.batch_size, self.cutting);
        let reduced = self.reduced[rank] + pending as u64;
        let mut requeued = Vec::new();
        for pool in &mut self.pools {
            let mut orphans: Vec<Span> = Vec::new();
            for Held { chunk, first } in std::mem::take(&mut pool.held[rank]) {
                let batches = chunk.batches(bs);
                let held = usize::try_from(reduced.saturating_sub(first)).unwrap_or(usize::MAX);
                let kept = held.min(batches);
                if kept > 0 {
                    let end = chunk.offset + kept * bs;
                    pool.done.push((chunk.offset, end));
                    pool.tally.add_unreported(rank, kept, kept * bs);
                    pool.finished = Some(now);
                }
                if kept < batches {
                    let offset = chunk.offset + kept * bs;
                    orphans.push((offset, chunk.end()));
                    requeued.push(Chunk { epoch: chunk.epoch, offset, len: chunk.end() - offset });
                }
            }
            orphans.extend(pool.assigned[rank].drain(..));
            orphans.sort_unstable();
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

    /// Admits a retired `rank` again (a process that joined the run again): it is handed work
    /// from the free spans from now on (under the static cut, its share from the next epoch
    /// opened) and counts as having nothing in the consensus yet. False when it was live or is
    /// no rank.
    pub fn admit(&mut self, rank: usize) -> bool {
        if rank >= self.world || self.is_live(rank) {
            return false;
        }
        self.live[rank] = true;
        // Its new life starts with nothing handed that the consensus does not hold.
        self.reduced[rank] = self.handed[rank];
        true
    }

    /// Follows a change of the run's members: a rank out of the run (vacant, or dead with
    /// `held` steps in the reduce in progress) is retired, one that joined again is admitted.
    /// Returns the re-queued parts of a retired rank's chunks.
    pub(crate) fn apply(&mut self, change: &Change) -> Vec<Chunk> {
        match *change {
            Change::Vacated { rank, at } => self.retire(rank, 0, at),
            Change::Died { rank, at, held } => self.retire(rank, held, at),
            Change::Joined { rank } => {
                self.admit(rank);
                Vec::new()
            }
        }
    }

    /// Records a completed reduce: `steps[r]` batches of rank `r` (trained since its previous
    /// reduce) are now in the consensus, and the reduce took `sync_ms` (counted toward the
    /// oldest incomplete epoch).
    pub fn add_reduce(&mut self, sync_ms: f64, steps: &[usize]) {
        for (rank, &s) in steps.iter().enumerate() {
            if self.is_live(rank) {
                self.reduced[rank] += s as u64;
            }
        }
        let oldest = self.oldest;
        if let Some(pool) = self.pools.iter_mut().find(|p| p.epoch == oldest) {
            pool.tally.add_reduce(sync_ms);
        }
    }

    /// Removes the oldest epoch if it is complete: its number, tally and wall time in ms.
    pub fn pop_complete(&mut self) -> Option<(usize, EpochTally, f64)> {
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
    pub fn any_outstanding(&self) -> bool {
        self.pools.iter().any(Pool::outstanding)
    }

    /// The coverage of every epoch not yet complete (those opened and those resumed but not
    /// yet opened), as a checkpoint stores it with the permutations' `seed`: the completed
    /// ranges plus `partial`, `(epoch, range)` leading parts of held chunks that their ranks
    /// report trained. Epochs with nothing done are left out.
    ///
    /// # Errors
    /// [`crate::checkpoint::CheckpointError::RangeOutOfBounds`] for a partial range past the
    /// epoch.
    pub fn coverage(
        &self,
        partial: &[(usize, SampleRange)],
        seed: u64,
    ) -> crate::checkpoint::Result<Vec<EpochCoverage>> {
        let total = self.batches * self.batch_size;
        let mut out = Vec::new();
        let spans =
            self.pools.iter().map(|p| (p.epoch, &p.done)).chain(
                self.resumed.iter().filter(|(e, _)| *e >= self.oldest).map(|(e, d)| (*e, d)),
            );
        for (epoch, done) in spans {
            let mut ranges: Vec<SampleRange> =
                done.iter().map(|&(s, e)| SampleRange::new(s, e - s)).collect();
            if let Some(pool) = self.pools.iter().find(|p| p.epoch == epoch) {
                for Held { chunk, .. } in pool.held.iter().flatten() {
                    let (s, e) = (chunk.offset, chunk.end());
                    let inside = |r: &SampleRange| r.offset == s && r.offset + r.size <= e;
                    ranges.extend(
                        partial.iter().filter(|(pe, r)| *pe == epoch && inside(r)).map(|(_, r)| *r),
                    );
                }
            }
            if !ranges.is_empty() {
                out.push(EpochCoverage::with_completed(epoch as u64, seed, total, &ranges)?);
            }
        }
        out.sort_by_key(|c| c.epoch);
        Ok(out)
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

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// The book reads no clock: an epoch's wall time is the span between the times it was
    /// given for the first hand-out and the last completion, exactly.
    #[test]
    fn epoch_wall_time_comes_from_the_times_given() -> TestResult {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + std::time::Duration::from_millis(ms);
        for (handed, done, expected) in [(0, 250, 250.0), (40, 40, 0.0), (7, 1007, 1000.0)] {
            let mut d = Dispatcher::new(1, 2, 4, 1, Cutting::Static);
            let c = d.next_chunk(0, &[1], true, at(handed)).ok_or("no chunk")?;
            let w = WorkTally { batches: c.batches(2), samples: c.len, ..Default::default() };
            if !d.complete(0, &c, &w, at(done)) {
                return Err("the chunk was not credited".into());
            }
            let (_, _, ms) = d.pop_complete().ok_or("the epoch did not complete")?;
            if (ms - expected).abs() > 1e-9 {
                return Err(format!("handed at {handed}, done at {done}: {ms} ms").into());
            }
        }
        Ok(())
    }

    /// Hands out and completes chunks in a random rank order; every position of every epoch is
    /// handed out exactly once and epochs complete in order.
    #[test]
    fn every_position_once_per_epoch() -> TestResult {
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
                    if let Some(c) = d.next_chunk(r, &counts, case % 4 == 1, Instant::now()) {
                        for n in &mut seen[c.epoch][c.offset..c.offset + c.len] {
                            *n += 1;
                        }
                        held[r].push(c);
                    }
                } else if let Some(c) = held[r].pop() {
                    let w = WorkTally { batches: c.len / bs, samples: c.len, ..Default::default() };
                    if !d.complete(r, &c, &w, Instant::now()) {
                        return Err(format!("case {case}: {c:?} not held by rank {r}").into());
                    }
                }
                while let Some((e, tally, _)) = d.pop_complete() {
                    let m = tally.finish(e, 1.0, &[]);
                    if m.samples != batches * bs {
                        return Err(format!("epoch {e}: {} samples", m.samples).into());
                    }
                    done.push(e);
                }
            }
            if !d.all_done() || done != (0..epochs).collect::<Vec<_>>() {
                return Err(format!("case {case}: epochs done {done:?}").into());
            }
            if seen.iter().flatten().any(|&n| n != 1) {
                return Err(
                    format!("case {case}: a position was not handed out exactly once").into()
                );
            }
        }
        Ok(())
    }

    /// Random deaths and rejoins at random moments: every position of every epoch is still
    /// completed exactly once by a live rank, a retired rank is handed nothing until it is
    /// admitted again, its late report is refused, and only a retired rank can be admitted.
    #[test]
    fn retired_work_is_completed_once_by_the_living() -> TestResult {
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
                    // No reduce is recorded: everything the rank held goes back.
                    let requeued = d.retire(r, 0, Instant::now());
                    if !dead[r] && requeued.len() != held[r].len() {
                        return Err(format!(
                            "case {case}: requeued {requeued:?}, held {:?}",
                            held[r]
                        )
                        .into());
                    }
                    dead[r] = true;
                    // A late report of a dead rank is refused.
                    if let Some(c) = held[r].pop()
                        && d.complete(r, &c, &WorkTally::default(), Instant::now())
                    {
                        return Err(
                            format!("case {case}: a retired rank's chunk was credited").into()
                        );
                    }
                    held[r].clear();
                } else if rng.random_bool(0.01) {
                    // A process joins again as rank r (refused while r is live).
                    if d.admit(r) != dead[r] {
                        return Err(
                            format!("case {case}: admit({r}) when dead = {}", dead[r]).into()
                        );
                    }
                    dead[r] = false;
                } else if rng.random_bool(0.5) {
                    if let Some(c) = d.next_chunk(r, &counts, true, Instant::now()) {
                        if dead[r] {
                            return Err(
                                format!("case {case}: retired rank {r} was handed {c:?}").into()
                            );
                        }
                        held[r].push(c);
                    }
                } else if let Some(c) = held[r].pop() {
                    let w = WorkTally { batches: c.len / bs, samples: c.len, ..Default::default() };
                    if !d.complete(r, &c, &w, Instant::now()) {
                        return Err(format!("case {case}: {c:?} refused").into());
                    }
                    for n in &mut completed[c.epoch][c.offset..c.offset + c.len] {
                        *n += 1;
                    }
                }
                while d.pop_complete().is_some() {}
            }
            if !d.all_done() {
                return Err(format!("case {case}: the run did not finish").into());
            }
            if completed.iter().flatten().any(|&n| n != 1) {
                return Err(
                    format!("case {case}: a position was not completed exactly once").into()
                );
            }
        }
        Ok(())
    }

    /// Interrupts a book at a random moment, resumes a new one from its coverage (completed
    /// chunks plus the trained part of held ones): together they complete every position once,
    /// and under the static cut each rank is handed exactly the positions it would have been.
    #[test]
    fn resume_hands_out_only_the_uncovered_rest() -> TestResult {
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
                    if let Some(c) = d.next_chunk(r, &counts, false, Instant::now()) {
                        held[r].push(c);
                    }
                } else if let Some(c) = held[r].pop() {
                    d.complete(r, &c, &WorkTally::default(), Instant::now());
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
            let coverage = d.coverage(&partial, 42)?;
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
                    if let Some(c) = e.next_chunk(r, &counts, false, Instant::now()) {
                        held[r].push(c);
                    }
                } else if let Some(c) = held[r].pop() {
                    e.complete(r, &c, &WorkTally::default(), Instant::now());
                    for p in c.offset..c.offset + c.len {
                        completed[c.epoch][p] += 1;
                        if cutting == Cutting::Static && owner[c.epoch][p] != usize::MAX {
                            return Err(format!("case {case}: position {p} trained twice").into());
                        }
                        owner[c.epoch][p] = r;
                    }
                }
                while e.pop_complete().is_some() {}
            }
            if !e.all_done() {
                return Err(format!("case {case}: the resumed run did not finish").into());
            }
            if completed.iter().flatten().any(|&n| n != 1) {
                return Err(
                    format!("case {case}: a position was not completed exactly once").into()
                );
            }
            if cutting == Cutting::Static {
                let reference = Dispatcher::new(world, bs, batches, epochs, cutting);
                for (epoch, owners) in owner.iter().enumerate() {
                    for (index, (s, e)) in reference.shares(world).into_iter().enumerate() {
                        if owners[s..e].iter().any(|&o| o != index) {
                            return Err(
                                format!("case {case}: epoch {epoch} share {index} moved").into()
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A forecast starts with the chunks the rank holds and, where the dispatcher's choice
    /// depends on nobody else (the static cut, a world of one), is exactly what it hands the
    /// rank next, cut at the horizon; a retired rank gets none.
    #[test]
    fn forecast_is_what_the_rank_is_handed_next() -> TestResult {
        // (cutting, world, batch size, batches, epochs, calibrated)
        let cases = [
            (Cutting::Static, 3, 2, 31, 3, false),
            (Cutting::Static, 2, 4, 10, 2, true),
            (Cutting::Progressive { min_chunk: 2 }, 1, 2, 50, 3, false),
            (Cutting::Progressive { min_chunk: 1 }, 1, 3, 40, 2, true),
        ];
        for (i, (cutting, world, bs, batches, epochs, calibrated)) in cases.into_iter().enumerate()
        {
            let counts = vec![3; world];
            let mut d = Dispatcher::new(world, bs, batches, epochs, cutting);
            let mut held = Vec::new();
            for r in 0..world {
                let c = d
                    .next_chunk(r, &counts, calibrated, Instant::now())
                    .ok_or(format!("case {i}: none"))?;
                if r == 0 {
                    held.push(c);
                }
            }
            for horizon in [1, 5, usize::MAX] {
                let forecast = d.forecast(0, &counts, calibrated, horizon);
                let mut probe = Dispatcher::new(world, bs, batches, epochs, cutting);
                let mut want = Vec::new();
                for r in 0..world {
                    let c = probe.next_chunk(r, &counts, calibrated, Instant::now());
                    if r == 0 {
                        want.extend(c);
                    }
                }
                while let Some(c) = probe.next_chunk(0, &counts, calibrated, Instant::now()) {
                    want.push(c);
                }
                // The same positions in the same order, cut at the horizon.
                let flat = |cs: &[Chunk]| -> Vec<(usize, usize)> {
                    cs.iter().flat_map(|c| (c.offset..c.end()).map(move |p| (c.epoch, p))).collect()
                };
                let mut want = flat(&want);
                want.truncate(horizon.saturating_mul(bs));
                let starts_held = horizon < usize::MAX || forecast.first() == held.first();
                if flat(&forecast) != want || !starts_held {
                    return Err(format!("case {i} horizon {horizon}: {forecast:?}").into());
                }
            }
        }
        let mut d = Dispatcher::new(2, 1, 10, 1, Cutting::Static);
        d.next_chunk(1, &[1, 1], false, Instant::now());
        d.retire(1, 0, Instant::now());
        assert!(d.forecast(1, &[1, 1], false, 100).is_empty());
        Ok(())
    }

    /// Elastic resume: a book of one world size interrupted at a random moment, resumed and
    /// re-sharded on another world size. Together they complete every position once; under
    /// the static cut the rest of the interrupted epoch is split over the new ranks with batch
    /// counts at most one apart.
    #[test]
    fn reshard_onto_another_world_trains_the_rest_once() -> TestResult {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(17);
        for case in 0..300 {
            let from = rng.random_range(1..5);
            let to = rng.random_range(1..5);
            let bs = rng.random_range(1..4);
            let batches = rng.random_range(from.max(to)..40);
            let epochs = rng.random_range(1..4);
            let cutting = if case % 2 == 0 {
                Cutting::Static
            } else {
                Cutting::Progressive { min_chunk: rng.random_range(1..4) }
            };
            let mut completed = vec![vec![0u32; batches * bs]; epochs];
            let mut d = Dispatcher::new(from, bs, batches, epochs, cutting);
            let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); from];
            for _ in 0..rng.random_range(0..200) {
                if d.all_done() {
                    break;
                }
                let r = rng.random_range(0..from);
                if rng.random_bool(0.5) {
                    if let Some(c) = d.next_chunk(r, &vec![2; from], false, Instant::now()) {
                        held[r].push(c);
                    }
                } else if let Some(c) = held[r].pop() {
                    d.complete(r, &c, &WorkTally::default(), Instant::now());
                    for n in &mut completed[c.epoch][c.offset..c.end()] {
                        *n += 1;
                    }
                }
                while d.pop_complete().is_some() {}
            }
            let coverage = d.coverage(&[], 42)?;
            let oldest = d.oldest();
            let mut e = Dispatcher::new(to, bs, batches, epochs, cutting)
                .resume(oldest, &coverage)
                .map_err(|e| format!("case {case}: {e}"))?
                .reshard();
            // Static: what each new rank is handed of the resumed epoch, before anything ends.
            if cutting == Cutting::Static && oldest < epochs {
                let mut mine = vec![0usize; to];
                e.pool_mut(oldest);
                for (r, n) in mine.iter_mut().enumerate() {
                    while e
                        .pools
                        .front()
                        .is_some_and(|p| p.epoch == oldest && !p.assigned[r].is_empty())
                    {
                        let c = e
                            .next_chunk(r, &[], false, Instant::now())
                            .ok_or("an assigned span not handed")?;
                        *n += c.batches(bs);
                        held_push(&mut e, &mut completed, r, c)?;
                    }
                }
                let (lo, hi) = (mine.iter().min(), mine.iter().max());
                if let (Some(lo), Some(hi)) = (lo, hi)
                    && hi - lo > 1
                {
                    return Err(format!("case {case}: {from}→{to} shares {mine:?}").into());
                }
                while e.pop_complete().is_some() {}
            }
            let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); to];
            for _ in 0..100_000 {
                if e.all_done() {
                    break;
                }
                let r = rng.random_range(0..to);
                if rng.random_bool(0.5) {
                    if let Some(c) = e.next_chunk(r, &vec![2; to], false, Instant::now()) {
                        held[r].push(c);
                    }
                } else if let Some(c) = held[r].pop() {
                    held_push(&mut e, &mut completed, r, c)?;
                }
                while e.pop_complete().is_some() {}
            }
            if !e.all_done() {
                return Err(format!("case {case}: the resumed run did not finish").into());
            }
            if completed.iter().flatten().any(|&n| n != 1) {
                return Err(format!("case {case}: {from}→{to}: a position not trained once").into());
            }
        }
        Ok(())
    }

    /// Completes chunk `c` of rank `r` in `e` and counts its positions.
    fn held_push(e: &mut Dispatcher, completed: &mut [Vec<u32>], r: usize, c: Chunk) -> TestResult {
        if !e.complete(r, &c, &WorkTally::default(), Instant::now()) {
            return Err(format!("rank {r} did not hold {c:?}").into());
        }
        for n in &mut completed[c.epoch][c.offset..c.end()] {
            *n += 1;
        }
        Ok(())
    }

    /// A book with fewer epochs than the run that saved the coverage ignores the epochs it will
    /// not train; coverage of an epoch before the resumed one is refused.
    #[test]
    fn resume_into_fewer_epochs_ignores_the_later_ones() -> TestResult {
        let covered = vec![
            EpochCoverage::with_completed(1, 42, 12, &[SampleRange::new(0, 8)])?,
            EpochCoverage::with_completed(2, 42, 12, &[SampleRange::new(0, 4)])?,
        ];
        let mut d = Dispatcher::new(2, 2, 6, 2, Cutting::Progressive { min_chunk: 1 })
            .resume(1, &covered)?;
        let mut trained = Vec::new();
        while let Some(c) = d.next_chunk(0, &[1, 1], false, Instant::now()) {
            d.complete(0, &c, &WorkTally::default(), Instant::now());
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

    /// The work of `c`'s batches as a rank reports it when the chunk is done.
    fn work_of(c: &Chunk, bs: usize) -> WorkTally {
        WorkTally { batches: c.batches(bs), samples: c.len, ..Default::default() }
    }

    /// Hand-computed retirements: what the consensus holds of a dead rank's chunks stays done
    /// and counts for it in the epoch's metrics; only the rest is handed out again.
    #[test]
    fn a_dead_ranks_reduced_batches_stay_done() -> TestResult {
        // (cutting, world, batch size, batches, chunks each rank takes first, reduces of one
        // step per rank, steps of a reduce in progress, the dead rank, re-queued chunks, the
        // dead rank's batches in the epoch's metrics)
        type Case = (Cutting, usize, usize, usize, usize, usize, usize, usize, Vec<Chunk>, usize);
        let c = |offset, len| Chunk { epoch: 0, offset, len };
        let progressive = Cutting::Progressive { min_chunk: 4 };
        let cases: [Case; 6] = [
            // Static shares of 10 batches of 2: rank 1 holds 20..40 and trained 4 into reduces.
            (Cutting::Static, 3, 2, 30, 1, 4, 0, 1, vec![c(28, 12)], 4),
            // ... and a fifth in a reduce its collective finished before it died.
            (Cutting::Static, 3, 2, 30, 1, 4, 1, 1, vec![c(30, 10)], 5),
            // Nothing reduced yet: the whole share goes back.
            (Cutting::Static, 3, 2, 30, 1, 0, 0, 1, vec![c(20, 20)], 0),
            // The whole share reduced: nothing goes back.
            (Cutting::Static, 3, 2, 30, 1, 10, 0, 2, vec![], 10),
            // Progressive probes of 80 / (2 × 10) = 4 batches, two per rank (rank 0: 0..4 and
            // 8..12): 6 steps reduced cover its first chunk and half its second.
            (progressive, 2, 1, 80, 2, 6, 0, 0, vec![c(10, 2)], 6),
            (progressive, 2, 1, 80, 2, 1, 0, 1, vec![c(5, 3), c(12, 4)], 1),
        ];
        for (i, (cutting, world, bs, batches, take, reduces, pending, dead, want, mine)) in
            cases.into_iter().enumerate()
        {
            let mut d = Dispatcher::new(world, bs, batches, 1, cutting);
            let counts = vec![4; world];
            for _ in 0..take {
                for r in 0..world {
                    d.next_chunk(r, &counts, false, Instant::now())
                        .ok_or(format!("case {i}: no chunk"))?;
                }
            }
            for _ in 0..reduces {
                d.add_reduce(0.0, &vec![1; world]);
            }
            let requeued = d.retire(dead, pending, Instant::now());
            if requeued != want {
                return Err(format!("case {i}: re-queued {requeued:?}, want {want:?}").into());
            }
            // The living finish the epoch: every chunk they hold, then what they are handed.
            let mut held: Vec<Vec<Chunk>> = vec![Vec::new(); world];
            let live: Vec<usize> = (0..world).filter(|&r| r != dead).collect();
            for (r, h) in held.iter_mut().enumerate() {
                if r != dead {
                    *h = d.pools[0].held[r].iter().map(|h| h.chunk).collect();
                }
            }
            let mut metrics = None;
            for _ in 0..10_000 {
                for &r in &live {
                    if let Some(c) = held[r].pop() {
                        d.complete(r, &c, &work_of(&c, bs), Instant::now());
                    } else if let Some(c) = d.next_chunk(r, &counts, true, Instant::now()) {
                        held[r].push(c);
                    }
                }
                if let Some((e, tally, _)) = d.pop_complete() {
                    metrics = Some(tally.finish(e, 1.0, &[]));
                    break;
                }
            }
            let m = metrics.ok_or(format!("case {i}: the epoch did not complete"))?;
            if m.samples != batches * bs || m.ranks[dead].batches != mine {
                return Err(format!(
                    "case {i}: {} samples, the dead rank {} batches (want {mine})",
                    m.samples, m.ranks[dead].batches
                )
                .into());
            }
        }
        Ok(())
    }

    /// Ranks train their chunks batch by batch in the order handed, reduces at random moments
    /// put what each live rank trained since its last reduce into the consensus, ranks die at
    /// random moments (sometimes right after their part of a reduce in progress): every
    /// position enters the consensus exactly once, except the batches of a dead rank's
    /// completed chunks it never reduced (counted done, lost); each epoch's metrics count every
    /// position once, for the rank whose training of it the consensus holds.
    #[test]
    fn the_consensus_holds_every_position_once() -> TestResult {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(17);
        for case in 0..400 {
            let world = rng.random_range(2..6);
            let bs = rng.random_range(1..4);
            let batches = rng.random_range(world..50);
            let epochs = rng.random_range(1..4);
            let cutting = if case % 2 == 0 {
                Cutting::Static
            } else {
                Cutting::Progressive { min_chunk: rng.random_range(1..4) }
            };
            let counts: Vec<usize> = (0..world).map(|_| rng.random_range(1..6)).collect();
            let mut d = Dispatcher::new(world, bs, batches, epochs, cutting);
            // Per rank: chunks held in the order handed with the batches trained of the first,
            // and the batches trained since its last reduce: (epoch, offset, in a done chunk).
            let mut queue: Vec<VecDeque<Chunk>> = vec![VecDeque::new(); world];
            let mut trained = vec![0usize; world];
            let mut since: Vec<Vec<(usize, usize, bool)>> = vec![Vec::new(); world];
            let mut dead = vec![false; world];
            // Per epoch and position: times in the consensus, the rank that put it there, lost.
            let mut held_by = vec![vec![Vec::<usize>::new(); batches * bs]; epochs];
            let mut lost = vec![vec![None::<usize>; batches * bs]; epochs];
            let mut book = Vec::new();
            let reduce = |since: &mut [Vec<(usize, usize, bool)>],
                          held_by: &mut [Vec<Vec<usize>>],
                          only: Option<usize>| {
                let mut steps = vec![0; since.len()];
                for (r, s) in since.iter_mut().enumerate() {
                    if only.is_some_and(|o| o != r) {
                        continue;
                    }
                    steps[r] = s.len();
                    for (e, off, _) in s.drain(..) {
                        held_by[e][off..off + bs].iter_mut().for_each(|by| by.push(r));
                    }
                }
                steps
            };
            for _ in 0..200_000 {
                if d.all_done() {
                    break;
                }
                let live: Vec<usize> = (0..world).filter(|&r| !dead[r]).collect();
                let r = live[rng.random_range(0..live.len())];
                let roll = rng.random_range(0..100);
                if roll < 30 {
                    if queue[r].len() < 2
                        && let Some(c) = d.next_chunk(r, &counts, case % 4 == 1, Instant::now())
                    {
                        queue[r].push_back(c);
                    }
                } else if roll < 90 {
                    let Some(&c) = queue[r].front() else { continue };
                    since[r].push((c.epoch, c.offset + trained[r] * bs, false));
                    trained[r] += 1;
                    if trained[r] == c.batches(bs) {
                        queue[r].pop_front();
                        trained[r] = 0;
                        let done = since[r].len().saturating_sub(c.batches(bs));
                        since[r][done..].iter_mut().for_each(|b| b.2 = true);
                        if !d.complete(r, &c, &work_of(&c, bs), Instant::now()) {
                            return Err(format!("case {case}: {c:?} refused").into());
                        }
                    }
                } else if roll < 99 || live.len() == 1 {
                    let steps = reduce(&mut since, &mut held_by, None);
                    d.add_reduce(0.0, &steps);
                } else {
                    // A death; half the time its part of a reduce in progress was done.
                    let pending = if rng.random_bool(0.5) {
                        reduce(&mut since, &mut held_by, Some(r))[r]
                    } else {
                        0
                    };
                    for (e, off, done) in since[r].drain(..) {
                        if done {
                            (off..off + bs).for_each(|p| lost[e][p] = Some(r));
                        }
                    }
                    d.retire(r, pending, Instant::now());
                    dead[r] = true;
                    queue[r].clear();
                    trained[r] = 0;
                }
                while let Some((e, tally, _)) = d.pop_complete() {
                    book.push(tally.finish(e, 1.0, &[]));
                }
            }
            if !d.all_done() {
                return Err(format!("case {case}: the run did not finish").into());
            }
            // The last reduce, at the end of the run.
            reduce(&mut since, &mut held_by, None);
            for (e, positions) in held_by.iter().enumerate() {
                for (p, by) in positions.iter().enumerate() {
                    let ok = matches!((by.as_slice(), lost[e][p]), ([_], None) | ([], Some(_)));
                    if !ok {
                        return Err(format!(
                            "case {case} epoch {e} position {p}: held by {by:?}, lost {:?}",
                            lost[e][p]
                        )
                        .into());
                    }
                }
                for rank in 0..world {
                    let mine = positions
                        .iter()
                        .zip(&lost[e])
                        .filter(|(by, l)| by.first() == Some(&rank) || **l == Some(rank))
                        .count();
                    if book[e].ranks[rank].samples != mine {
                        return Err(format!(
                            "case {case} epoch {e}: rank {rank} counted {} samples, trained {mine}",
                            book[e].ranks[rank].samples
                        )
                        .into());
                    }
                }
            }
        }
        Ok(())
    }
}

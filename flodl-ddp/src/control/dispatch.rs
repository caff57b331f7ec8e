//! The coordinator's book of epochs: which chunks were handed out, which came back, which must
//! be handed out again (a dead rank's), how far the consensus holds each rank's work, and when
//! an epoch is complete.
//!
//! Positions index an epoch's permutation (`0..batches × batch_size`; the `samples % batch_size`
//! tail is not trained that epoch). A chunk is a contiguous run of whole batches handed to one
//! rank, which trains its chunks in the order it was handed them.

mod chunk;
mod pool;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::time::Instant;

use crate::checkpoint::{EpochCoverage, SampleRange};
use crate::control::change::Change;
use crate::control::logic_error::{LogicError, LogicResult};
use crate::control::metrics::{EpochTally, WorkTally};
use crate::control::partition;

pub use chunk::{Chunk, Cutting};
use pool::{Held, Pool, Span, Stage, split, subtract};

/// Every epoch not yet complete, oldest first; pools open on demand, at most one epoch ahead of
/// the oldest incomplete one (under every policy: a rank done with its part of an epoch starts
/// on the next one instead of idling at the epoch's end).
///
/// A chunk is completed when its rank reported it trained *and* reduces hold all of it (the
/// rank's batches in completed reduces reach its end, see [`Dispatcher::add_reduce`]); until
/// then it stays held by its rank, and its epoch is not complete. A retired (dead) rank is
/// handed nothing more. What it held and the consensus does not hold (the batches past those
/// it trained into completed reduces, whether it reported their chunk trained or not), and
/// under the static cut what it was still to be handed, is split over the live ranks (static)
/// or put back in the free spans (progressive); what the consensus holds counts as completed,
/// by the dead rank. So every position of an epoch is trained into the consensus exactly once,
/// and counted once in the epoch's metrics.
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
    /// `counts` are ElChe's batches per window; once `calibrated` a chunk is the rank's
    /// `share`: its part of what is left, but at most two of its windows, so most of an epoch
    /// stays in the pool to follow a change of speed or a death, and for a rank that still holds
    /// work no more than takes it to when all would finish together (nothing, for now, when it
    /// holds that much already); before, a probe of `batches / (world × 10)`. Never under
    /// `min_chunk` batches, unless less is left in the span it is cut from or the rank's part
    /// of what is left is less.
    ///
    /// `now` is when it is handed out: the first chunk of an epoch starts the epoch's clock.
    pub fn next_chunk(
        &mut self,
        rank: usize,
        counts: &[usize],
        calibrated: bool,
        now: Instant,
    ) -> Option<Chunk> {
        self.next_chunk_after(rank, counts, calibrated, &[], now)
    }

    /// [`next_chunk`](Self::next_chunk), knowing that each rank `r` has trained about
    /// `trained[r]` batches more than this book has heard of (since its last reduce, or its
    /// last chunk reported done, whichever is later; missing ranks: none). The book counts a
    /// rank's chunk untrained until a reduce or its report says otherwise, so without the
    /// estimate a rank asking while its peers are deep into their chunks counts their progress
    /// as work still to do, takes more than its part of the end, and finishes after them.
    pub fn next_chunk_after(
        &mut self,
        rank: usize,
        counts: &[usize],
        calibrated: bool,
        trained: &[usize],
        now: Instant,
    ) -> Option<Chunk> {
        if !self.is_live(rank) {
            return None;
        }
        let bs = self.batch_size;
        let (world, batches) = (self.world, self.batches);
        let cutting = self.cutting;
        let first = self.handed[rank];
        let live = self.live.clone();
        let mut ahead_of = self.untrained();
        for (held, &done) in ahead_of.iter_mut().zip(trained) {
            *held = held.saturating_sub(done);
        }
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
                    let size = if calibrated {
                        match share(left, rank, counts, &live, &ahead_of, min_chunk) {
                            // It holds its part of the end already: more would keep the
                            // others waiting for it. It asks again when its work runs out.
                            0 => return None,
                            size => size,
                        }
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
            pool.held[rank].push(Held { chunk, first, stage: Stage::Handed });
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
            for h in pool.held[rank].iter().filter(|h| matches!(h.stage, Stage::Handed)) {
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
                            .filter(|h| matches!(h.stage, Stage::Handed))
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
                        let size = if calibrated {
                            // What each peer holds when `q` asks: its work past `q`'s clock.
                            let held: Vec<usize> = (0..world)
                                .map(|r| ((clock[r] - clock[q]).max(0.0) * speed(r)) as usize)
                                .collect();
                            match share(remaining, q, counts, &self.live, &held, min_chunk) {
                                0 => min_chunk,
                                size => size,
                            }
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

    /// Per rank, the batches it holds handed and not yet known trained: its handed chunks past
    /// the batches completed reduces hold of them.
    fn untrained(&self) -> Vec<usize> {
        let bs = self.batch_size;
        let mut out = vec![0; self.world];
        for pool in &self.pools {
            for (rank, held) in pool.held.iter().enumerate() {
                let reduced = self.reduced.get(rank).copied().unwrap_or(0);
                for h in held.iter().filter(|h| matches!(h.stage, Stage::Handed)) {
                    let done =
                        usize::try_from(reduced.saturating_sub(h.first)).unwrap_or(usize::MAX);
                    out[rank] += h.chunk.batches(bs).saturating_sub(done);
                }
            }
        }
        out
    }

    /// Takes `rank`'s report that it trained `chunk`, with its work: the chunk is completed
    /// (and the work credited) once reduces hold all of it, at once if they do already; until
    /// then the report is kept with the chunk. `false` (and nothing taken) when `rank` does
    /// not hold the chunk untrained (a retired rank's late report, a report repeated). `now`
    /// is when it was reported: the last report of an epoch stops its clock.
    pub fn complete(&mut self, rank: usize, chunk: &Chunk, work: &WorkTally, now: Instant) -> bool {
        let (bs, reduced) = (self.batch_size, self.reduced.get(rank).copied().unwrap_or(0));
        let Some(pool) = self.pools.iter_mut().find(|p| p.epoch == chunk.epoch) else {
            return false;
        };
        let Some(held) = pool.held.get_mut(rank) else { return false };
        let Some(h) =
            held.iter_mut().find(|h| h.chunk == *chunk && matches!(h.stage, Stage::Handed))
        else {
            return false;
        };
        h.stage = Stage::Trained(Box::new(work.clone()));
        pool.finished = Some(now);
        pool.settle(rank, reduced, bs);
        true
    }

    /// Retires `rank`: it is handed nothing more. Of each chunk it held (trained or not), the
    /// leading batches the consensus holds count as completed (by it, in the epoch's metrics:
    /// with its report when they are the whole chunk, as unreported batches otherwise) and the
    /// rest goes back to the live ranks with what it was still to be handed (split evenly in
    /// batches under the static cut, to the free spans otherwise); the report of a chunk not
    /// wholly held is dropped, so its re-trained part counts once. The consensus holds the rank's steps
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
            for Held { chunk, first, stage } in std::mem::take(&mut pool.held[rank]) {
                let batches = chunk.batches(bs);
                let held = usize::try_from(reduced.saturating_sub(first)).unwrap_or(usize::MAX);
                let kept = held.min(batches);
                if let Stage::Trained(work) = stage
                    && kept == batches
                {
                    pool.done.push((chunk.offset, chunk.end()));
                    pool.tally.add(rank, &work);
                    pool.finished = Some(now);
                    continue;
                }
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
    /// reduce) are now in the consensus, which completes the trained chunks they cover; the
    /// reduce took `sync_ms` (counted toward the oldest incomplete epoch).
    pub fn add_reduce(&mut self, sync_ms: f64, steps: &[usize]) {
        let bs = self.batch_size;
        for (rank, &s) in steps.iter().enumerate() {
            if s > 0 && self.is_live(rank) {
                self.reduced[rank] += s as u64;
                let reduced = self.reduced[rank];
                for pool in &mut self.pools {
                    pool.settle(rank, reduced, bs);
                }
            }
        }
        let oldest = self.oldest;
        if let Some(pool) = self.pools.iter_mut().find(|p| p.epoch == oldest) {
            pool.tally.add_reduce(sync_ms);
        }
    }

    /// Removes the oldest epoch if it is complete (every position handed out, trained and held
    /// by the consensus): its number, tally and wall time in ms.
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

    /// Whether a reduce holding `steps[r]` batches of each rank `r` holds the rest of the run:
    /// every epoch is open and handed out, and each live rank's batches handed so far are in
    /// the consensus once the reduce completes (then no reduce follows it, unless a death
    /// re-queues work). Ranks past `steps` count no step.
    pub fn completes_the_run(&self, steps: &[usize]) -> bool {
        if self.all_done() {
            return true;
        }
        let last_open = self.pools.back().is_some_and(|p| p.epoch + 1 >= self.epochs);
        last_open
            && self.pools.iter().all(Pool::handed_out)
            && (0..self.world).filter(|&r| self.is_live(r)).all(|r| {
                let held = steps.get(r).copied().unwrap_or(0) as u64;
                self.reduced[r].saturating_add(held) >= self.handed[r]
            })
    }

    /// Whether any chunk is handed out and not yet completed (trained into the consensus).
    pub fn any_outstanding(&self) -> bool {
        self.pools.iter().any(Pool::outstanding)
    }

    /// The leading parts of the chunks handed out and not reported trained that the consensus
    /// holds (each rank's reduced batches reach into them): what [`Dispatcher::coverage`]
    /// takes as `partial` for a cut at a completed reduce, read from this book alone.
    pub fn reduced_parts(&self) -> Vec<(usize, SampleRange)> {
        let bs = self.batch_size;
        let mut parts = Vec::new();
        for pool in &self.pools {
            for (rank, held) in pool.held.iter().enumerate() {
                let reduced = self.reduced.get(rank).copied().unwrap_or(0);
                for h in held.iter().filter(|h| matches!(h.stage, Stage::Handed)) {
                    let batches = usize::try_from(reduced.saturating_sub(h.first)).unwrap_or(0);
                    let len = batches.saturating_mul(bs).min(h.chunk.len);
                    if len > 0 {
                        parts.push((pool.epoch, SampleRange::new(h.chunk.offset, len)));
                    }
                }
            }
        }
        parts
    }

    /// The coverage of every epoch not yet complete (those opened and those resumed but not
    /// yet opened), as a checkpoint stores it with the permutations' `seed`: the completed
    /// ranges, the chunks reported trained, and `partial`, `(epoch, range)` leading parts of
    /// held chunks that their ranks report trained (a checkpoint is cut with every rank paused
    /// at a reduce that takes in all they trained). Epochs with nothing done are left out.
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
                for Held { chunk, stage, .. } in pool.held.iter().flatten() {
                    let (s, e) = (chunk.offset, chunk.end());
                    if matches!(stage, Stage::Trained(_)) {
                        ranges.push(SampleRange::new(s, e - s));
                        continue;
                    }
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

/// The batches a chunk for `rank` holds under the progressive cut, from `left` batches free:
/// its part of `left` at its speed (`ceil(left × counts[r] / Σcounts)`, over the live ranks), at
/// most two of its windows, and never more than takes it to when every live rank would finish
/// together, counting the `held` batches each still has untrained (`ceil(counts[r] × (left +
/// Σheld) / Σcounts) − held[r]`): 0 when it holds that much already. The last bound only ever
/// trims the chunk of a rank that asks while it still holds one: a slow rank that took chunks
/// ahead into an epoch's pool while it was full would otherwise train them at the end while
/// the fast ranks wait. A chunk (when not 0) holds at least `min_chunk` batches, or the rank's
/// part of `left` when that is less: at the end of the run a slow rank's part is a batch or
/// two, and a floor of `min_chunk` of its batches held every faster rank waiting for it (a
/// 10× rank's 4 batches are 40 of the fastest rank's).
fn share(
    left: usize,
    rank: usize,
    counts: &[usize],
    live: &[bool],
    held: &[usize],
    min_chunk: usize,
) -> usize {
    let count = |r: usize| counts.get(r).copied().unwrap_or(1).max(1);
    let members = (0..live.len()).filter(|&r| live[r]);
    let speed: usize = members.clone().map(count).sum::<usize>().max(1);
    let backlog: usize = left + members.map(|r| held.get(r).copied().unwrap_or(0)).sum::<usize>();
    let mine = count(rank);
    let of_left = left.saturating_mul(mine).div_ceil(speed);
    let together = backlog.saturating_mul(mine).div_ceil(speed);
    match of_left.min(together.saturating_sub(held.get(rank).copied().unwrap_or(0))).min(2 * mine) {
        0 => 0,
        size => size.max(min_chunk.min(of_left)),
    }
}

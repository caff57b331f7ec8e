//! One epoch's pool of positions: what is still to be handed out, what is held by which rank,
//! and what came back; with the span arithmetic the pools are kept by.

use std::collections::VecDeque;
use std::time::Instant;

use crate::control::metrics::{EpochTally, WorkTally};
use crate::control::partition;

use super::chunk::Chunk;

/// A half-open span of permutation positions, `start..end`.
pub(super) type Span = (usize, usize);

/// A chunk handed out whose training the consensus does not hold all of yet, with where it
/// starts in its rank's stream of batches (the batches handed to the rank before it).
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) chunk: Chunk,
    pub(super) first: u64,
    pub(super) stage: Stage,
}

/// How far a held chunk is: handed out, or reported trained and waiting for reduces to take
/// all of it into the consensus (its rank's report kept until then: a rank that dies first
/// loses the part no reduce took, which is handed out again and must not count twice).
#[derive(Debug, Clone)]
pub(super) enum Stage {
    Handed,
    Trained(Box<WorkTally>),
}

impl Held {
    /// One past its last batch in its rank's stream: the consensus holds all of it once the
    /// rank's reduced batches reach this.
    pub(super) fn end(&self, batch_size: usize) -> u64 {
        self.first + self.chunk.batches(batch_size) as u64
    }
}

/// One epoch's pool of positions.
#[derive(Debug)]
pub(super) struct Pool {
    pub(super) epoch: usize,
    /// Static cut: the spans each rank is still to be handed, in order.
    pub(super) assigned: Vec<VecDeque<Span>>,
    /// Spans anyone may be handed (progressive: the whole epoch at first; both cuts: a dead
    /// rank's work), in position order.
    pub(super) free: VecDeque<Span>,
    /// Chunks handed out whose training the consensus does not hold all of yet, per rank, in
    /// the order they were handed.
    pub(super) held: Vec<Vec<Held>>,
    /// Completed spans: trained, and held by the consensus (or by a checkpoint resumed).
    pub(super) done: Vec<Span>,
    pub(super) started: Option<Instant>,
    pub(super) finished: Option<Instant>,
    pub(super) tally: EpochTally,
}

impl Pool {
    pub(super) fn handed_out(&self) -> bool {
        self.free.is_empty() && self.assigned.iter().all(VecDeque::is_empty)
    }

    pub(super) fn outstanding(&self) -> bool {
        self.held.iter().any(|h| !h.is_empty())
    }

    /// Completes `rank`'s trained chunks that its first `reduced` batches cover: they are in
    /// the consensus, and their reports count in the epoch's tally (in the order trained).
    pub(super) fn settle(&mut self, rank: usize, reduced: u64, batch_size: usize) {
        let Some(held) = self.held.get_mut(rank) else { return };
        let mut kept = Vec::with_capacity(held.len());
        for h in held.drain(..) {
            let covered = h.end(batch_size) <= reduced;
            match h.stage {
                Stage::Trained(work) if covered => {
                    self.done.push((h.chunk.offset, h.chunk.end()));
                    self.tally.add(rank, &work);
                }
                stage => kept.push(Held { stage, ..h }),
            }
        }
        *held = kept;
    }
}

/// `from` minus `done`: the sub-spans of `from` no span of `done` covers, in order.
pub(super) fn subtract(from: &[Span], done: &[Span]) -> Vec<Span> {
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
pub(super) fn split(spans: &[Span], parts: usize, bs: usize) -> Vec<Vec<Span>> {
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

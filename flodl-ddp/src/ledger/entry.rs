//! The ledger's lines: a header, then reduces and deaths as they happen, then the end.

use serde::{Deserialize, Serialize};

/// A run of positions of one epoch's permutation: `offset..offset + len` (written `[e, o, l]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(from = "(usize, usize, usize)", into = "(usize, usize, usize)")]
pub struct Span {
    /// The epoch whose permutation it indexes.
    pub epoch: usize,
    /// First position.
    pub offset: usize,
    /// Number of positions.
    pub len: usize,
}

impl Span {
    /// One past the last position.
    pub fn end(&self) -> usize {
        self.offset.saturating_add(self.len)
    }
}

impl From<(usize, usize, usize)> for Span {
    fn from((epoch, offset, len): (usize, usize, usize)) -> Self {
        Span { epoch, offset, len }
    }
}

impl From<Span> for (usize, usize, usize) {
    fn from(s: Span) -> Self {
        (s.epoch, s.offset, s.len)
    }
}

/// A span one rank trained into a consensus (written `[rank, e, o, l]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(usize, usize, usize, usize)", into = "(usize, usize, usize, usize)")]
pub struct RankSpan {
    /// The rank whose training of it the consensus holds.
    pub rank: usize,
    /// The positions.
    pub span: Span,
}

impl From<(usize, usize, usize, usize)> for RankSpan {
    fn from((rank, epoch, offset, len): (usize, usize, usize, usize)) -> Self {
        RankSpan { rank, span: Span { epoch, offset, len } }
    }
}

impl From<RankSpan> for (usize, usize, usize, usize) {
    fn from(r: RankSpan) -> Self {
        (r.rank, r.span.epoch, r.span.offset, r.span.len)
    }
}

/// What a resumed run starts from: the checkpoint's cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resume {
    /// The oldest epoch not complete at the cut (every earlier one was complete).
    pub epoch: usize,
    /// Reduces completed at the cut.
    pub reduces: u64,
    /// What the consensus at the cut holds of the epochs from `epoch` on.
    pub coverage: Vec<Span>,
}

/// The run the ledger is of (its first line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The format version ([`crate::ledger::VERSION`]).
    pub version: u32,
    /// Ranks in the run.
    pub world: usize,
    /// Epochs of the run.
    pub epochs: usize,
    /// Samples per batch.
    pub batch_size: usize,
    /// Full batches per epoch (an epoch's positions are `0..batches × batch_size`).
    pub batches: usize,
    /// The checkpoint's cut, when the run resumed from one.
    pub resumed: Option<Resume>,
}

impl Header {
    /// Positions per epoch.
    pub fn positions(&self) -> usize {
        self.batches.saturating_mul(self.batch_size)
    }
}

/// One line of the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Entry {
    /// The run (first line).
    Run(Header),
    /// A completed reduce: the spans its consensus holds that no earlier one did.
    Reduce {
        /// Reduces completed with this one (the run's count, a resumed run's included).
        n: u64,
        /// What each rank trained since its previous reduce.
        spans: Vec<RankSpan>,
    },
    /// A rank declared dead after `after` completed reduces.
    Death {
        /// The dead rank.
        rank: usize,
        /// Reduces completed before it.
        after: u64,
        /// Its part of a reduce in progress that the consensus holds already.
        kept: Vec<Span>,
        /// Handed to it and not in the consensus: the work its death threw away, at most (it
        /// may not have trained all of it).
        unreduced: Vec<Span>,
        /// What the dispatcher handed out again.
        requeued: Vec<Span>,
    },
    /// The run finished after `reduces` completed reduces: the last consensus is the final
    /// model.
    End {
        /// Reduces completed in all.
        reduces: u64,
    },
}

//! The unit of hand-out: a batch-aligned slice of one epoch's permutation, and how an epoch is cut
//! into such slices.

use serde::{Deserialize, Serialize};

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
    /// (see [`Dispatcher::next_chunk`](super::Dispatcher::next_chunk)).
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

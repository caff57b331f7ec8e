//! A rank's failure as it travels to the coordinator: plain data, its kind and its message.
//!
//! The crate's [`Error`](crate::Error) holds boxed sources and process-local state, so it
//! cannot cross a process boundary; a rank sends this description instead, and the
//! coordinator answers [`Error::Rank`](crate::Error::Rank) with it. The conversion from an
//! error lives beside the error (`error.rs`), so this file imports nothing above the wire.

use serde::{Deserialize, Serialize};

use super::text::WireText;
use crate::contract::capability::{Capability, TrainerOption};

/// What kind of failure ended a rank, as it travels over the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum FailureKind {
    /// The user's replica returned an error.
    Replica,
    /// The replica does not match what the runtime or another rank expects.
    ReplicaMismatch,
    /// A trainer option needs a part of the replica contract the replica does not offer.
    MissingCapability {
        /// The option set.
        option: TrainerOption,
        /// What it needs of the replica.
        capability: Capability,
    },
    /// The rank's thread panicked (in the replica or the runtime).
    Panicked,
    /// A wait of the rank's passed its deadline.
    Timeout,
    /// A tensor operation failed.
    Tensor,
    /// A collective operation failed outside a group fault.
    Collective,
    /// The data plane failed (a fetch, the prefetcher).
    Data,
    /// Reading or restoring a checkpoint part failed.
    Checkpoint,
    /// A message contradicted the protocol.
    Protocol,
    /// The coordinator went away.
    PeerGone,
    /// Anything else the rank's runtime refused.
    Runtime,
}

/// A rank's failure described as plain data: its kind and its message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}: {message}", if self.kind == FailureKind::Panicked { "panicked" } else { "failed" })]
pub struct RankFailure {
    /// What kind of failure it was.
    pub kind: FailureKind,
    /// The error's message (the panic's payload for [`FailureKind::Panicked`]).
    pub message: WireText,
}

impl RankFailure {
    /// A panic, with its payload's text.
    pub fn panicked(message: impl Into<String>) -> RankFailure {
        RankFailure { kind: FailureKind::Panicked, message: WireText::from(message.into()) }
    }
}

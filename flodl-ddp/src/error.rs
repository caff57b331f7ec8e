//! The crate's error type.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Everything that can go wrong in flodl-ddp.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The trainer was configured with values that cannot run (reported by `run()`).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// [`crate::Trainer::slowdown`] was given a number of factors other than one per rank.
    #[error("slowdown: {factors} factors given for {ranks} ranks (give one per rank, or none)")]
    SlowdownCount {
        /// Factors given.
        factors: usize,
        /// Ranks in the run.
        ranks: usize,
    },
    /// Training diverged numerically: a rank's loss, or its parameters at a reduce, are not
    /// finite. The run stops (a divergence is no fault of one rank: every rank would die of it in
    /// turn); with a checkpoint directory it first re-saves its last good bundle (or its starting
    /// state) as `failure.fdlck`.
    #[error("training diverged on rank {rank} at step {step}: {cause}")]
    Diverged {
        /// The rank that found it.
        rank: usize,
        /// The rank's cohort step (the schedule's index) when it found it.
        step: u64,
        /// What was not finite.
        cause: Divergence,
        /// The failure bundle holding the last good state, when one was written.
        bundle: Option<PathBuf>,
    },
    /// A rank failed; the run stopped and this is the first failure.
    #[error("rank {rank} failed: {source}")]
    Rank {
        /// The rank that failed.
        rank: usize,
        /// Why.
        #[source]
        source: Box<Error>,
    },
    /// A rank's thread panicked (in the replica or the runtime).
    #[error("rank {rank} panicked: {message}")]
    Panicked {
        /// The rank whose thread panicked.
        rank: usize,
        /// The panic payload, when it is a string.
        message: String,
    },
    /// A user replica failed.
    #[error("replica: {0}")]
    Replica(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A replica does not match what the runtime or another replica expects.
    #[error("replica mismatch: {0}")]
    ReplicaMismatch(String),
    /// A wait passed its deadline (a peer or the coordinator stopped answering).
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// What was being waited for.
        what: &'static str,
        /// How long it waited.
        after: Duration,
    },
    /// A host-averaging round missed its snapshot deadline too many times in a row.
    #[error("host averaging stalled: {attempts} rounds in a row missed their snapshot deadline")]
    ReduceStalled {
        /// Rounds that were soft-aborted in a row.
        attempts: usize,
    },
    /// A runtime thread went away without saying why (its channel disconnected).
    #[error("the {0} disconnected")]
    Disconnected(&'static str),
    /// The run was aborted through its handle.
    #[error("run aborted")]
    Aborted,
    /// The run stopped on request after saving a checkpoint
    /// ([`crate::DdpHandle::stop_with_checkpoint`]).
    #[error("stopped at a checkpoint: {}", bundle.display())]
    Stopped {
        /// The bundle saved before stopping.
        bundle: std::path::PathBuf,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] flodl_tensor::Error),
    /// A collective operation failed.
    #[error(transparent)]
    Collective(#[from] flodl_nccl::Error),
    /// The data plane failed.
    #[error(transparent)]
    Data(#[from] flodl_data::Error),
    /// Saving, reading or resuming a checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// A rank's prefetcher delivered something other than the batch the rank was to train.
    #[error("prefetch out of step: {0}")]
    Prefetch(String),
    /// The run cannot go on after rank failures: every rank died, a lone survivor of an NCCL
    /// group is left (NCCL groups are not shrunk to one), or reduces keep failing with nobody
    /// to blame.
    #[error("the run cannot go on ({reason:?}): {detail}")]
    Unrecoverable {
        /// Why, as the failure bundle records it.
        reason: crate::checkpoint::SaveReason,
        /// What happened last.
        detail: String,
        /// The failure bundle written on the way out, when one was.
        bundle: Option<std::path::PathBuf>,
        /// The error of the rank whose death made the run unrecoverable, when it reported one
        /// (wrapped in [`Error::Rank`]).
        #[source]
        last: Option<Box<Error>>,
    },
}

impl Error {
    /// Wraps any error a user replica raises.
    pub fn replica(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Replica(err.into())
    }

    /// This error with `bundle` as its failure bundle, when it is a [`Error::Diverged`].
    pub(crate) fn with_failure_bundle(self, bundle: Option<PathBuf>) -> Self {
        match self {
            Error::Diverged { rank, step, cause, .. } => {
                Error::Diverged { rank, step, cause, bundle }
            }
            other => other,
        }
    }
}

/// What was not finite when training diverged ([`Error::Diverged`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Divergence {
    /// The loss of a training step (its value: NaN or infinite).
    Loss(f32),
    /// The parameters: after a collective reduce, or in the snapshot a rank sends to a host
    /// average.
    Parameters,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Divergence::Loss(loss) => write!(f, "its loss is {loss}"),
            Divergence::Parameters => write!(f, "its parameters are not finite at a reduce"),
        }
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

//! The crate's error type.

use std::fmt::Display;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::contract::capability::{Capability, TrainerOption};
use crate::control::logic_error::LogicError;
use crate::link::failure::{FailureKind, RankFailure};
use crate::link::text::WireText;

/// Everything that can go wrong in flodl-ddp.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An option of the run cannot run ([`crate::RunSpec::check`]): the field and what is wrong.
    #[error("invalid configuration: {0}")]
    Invalid(#[from] crate::config_error::ConfigError),
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
    /// The pure control logic refused a value while the run went on (ElChe, the outer
    /// optimizer, work weights).
    #[error(transparent)]
    Logic(#[from] LogicError),
    /// A rank failed; the run stopped and this is the failure, as the rank described it.
    #[error("rank {rank} {failure}")]
    Rank {
        /// The rank that failed.
        rank: usize,
        /// What went wrong, as it travelled from the rank.
        #[source]
        failure: RankFailure,
    },
    /// The coordinator's own thread panicked.
    #[error("the coordinator panicked: {message}")]
    CoordinatorPanicked {
        /// The panic payload, when it is a string.
        message: String,
    },
    /// A thread of the runtime could not be started.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// Which thread.
        what: &'static str,
        /// The operating system's refusal.
        #[source]
        source: std::io::Error,
    },
    /// A message or state contradicts the protocol between the coordinator and the ranks
    /// (a batch past its epoch, a regroup naming a stranger, a bundle with no consensus).
    #[error("protocol violation: {detail}")]
    Protocol {
        /// What did not fit.
        detail: String,
    },
    /// A cooperative worker and its rank out of step: an order or an answer that does not fit
    /// where the other stands (the worker's loop called out of turn). Not a wire violation: both
    /// ends are in this process.
    #[error("cooperative worker out of step: {got} {during}")]
    OutOfStep {
        /// What arrived (the order or the answer).
        got: &'static str,
        /// Where it arrived: the phase it arrived in, or the order it answered.
        during: &'static str,
    },
    /// A cooperative rank asked for its worker's ends a second time: a cooperative rank is
    /// built once ([`crate::Trainer::run_cooperative`] hands out one [`Worker`](crate::Worker)
    /// per rank).
    #[error("rank {rank}'s cooperative worker was already handed out")]
    WorkerTaken {
        /// The rank built again.
        rank: usize,
    },
    /// A rule the runtime keeps for itself was broken: a defect of flodl-ddp, not of a rank,
    /// the wire or the user's input.
    #[error("internal error: {0}")]
    Internal(#[from] Internal),
    /// The collective backend was asked to reduce on a rank that has no communicator.
    #[error("the collective backend has no communicator on this rank")]
    NoCommunicator,
    /// A user replica failed.
    #[error("replica: {0}")]
    Replica(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A cooperative rank's [`Worker`](crate::Worker) is gone: dropped before the run was over
    /// (its thread ended or panicked). The rank fails with it and is declared dead.
    #[error(
        "the cooperative worker of rank {rank} is gone (dropped: its thread ended or panicked)"
    )]
    WorkerGone {
        /// The rank whose worker is gone.
        rank: usize,
    },
    /// A cooperative [`Step`](crate::Step) was dropped without reporting its loss, and its
    /// worker was asked for the next one.
    #[error("rank {rank}'s last cooperative step was dropped without finish()")]
    StepUnfinished {
        /// The worker's rank.
        rank: usize,
    },
    /// A trainer option needs a part of the [`crate::Replica`] contract that the replica does
    /// not offer (reported by `run()`, when the replicas are built).
    #[error("{option} needs a replica with {capability}")]
    MissingCapability {
        /// The option set.
        option: TrainerOption,
        /// What it needs of the replica.
        capability: Capability,
    },
    /// A replica does not match what the runtime or another replica expects (built with
    /// [`Error::mismatch`]).
    #[error("replica mismatch{}: {what}: expected {expected}, found {found}", on_rank(.rank))]
    ReplicaMismatch {
        /// What was compared (a parameter count, a batch's fields, a tensor's shape).
        what: &'static str,
        /// What the runtime, the run or the other replica expected.
        expected: String,
        /// What this replica (or its state) has.
        found: String,
        /// The rank whose replica it is, when known.
        rank: Option<usize>,
    },
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
    /// A peer's end of the link is gone (its thread or process ended, its connection closed)
    /// without saying why.
    #[error("{0} is gone")]
    PeerGone(Peer),
    /// The controller told this rank to stop (it was evicted, or the run ended) and then ended
    /// its connection: the controller lives, so this rank neither follows a standby nor retries.
    #[error("the controller stopped this rank and ended its connection")]
    Evicted,
    /// The run was aborted through its handle.
    /// A cluster run's controller gave up waiting for ranks to join.
    #[error("ranks {missing:?} did not join the controller within {after:?}")]
    RanksMissing {
        /// The ranks that never joined.
        missing: Vec<usize>,
        /// How long the controller waited.
        after: Duration,
    },
    /// A rank of a cluster run runs another run specification than the controller.
    #[error(
        "rank {rank} runs another run specification than the controller (its spec hash differs)"
    )]
    RunMismatch {
        /// The rank refused.
        rank: usize,
    },
    /// The cluster's transport failed (binding, connecting, a refused handshake: its line
    /// says why).
    #[cfg(feature = "cluster")]
    #[error("{what}: {source}")]
    Net {
        /// What was being done.
        what: &'static str,
        /// The transport's error.
        #[source]
        source: flodl_cluster::NetError,
    },
    /// The launcher's environment does not make a cluster identity.
    #[cfg(feature = "cluster")]
    #[error("cluster identity: {0}")]
    Identity(#[from] flodl_cluster::IdentityError),
    /// The job's certificate files cannot be used.
    #[cfg(feature = "cluster")]
    #[error(transparent)]
    Tls(#[from] flodl_cluster::TlsError),
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

/// Which of the runtime's own rules was broken ([`Error::Internal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Internal {
    /// The coordinator concluded a run that was not finishing.
    #[error("the run concluded before it finished")]
    ConcludedEarly,
    /// A checkpoint was to be built while neither the coordinator nor any rank held the
    /// consensus model.
    #[error("no rank captured the consensus model")]
    NothingCaptured,
    /// A communicator other than a host group was asked to shrink to its survivors.
    #[error("only a host group shrinks to its survivors")]
    ShrinkNotHost,
}

/// The other end of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Peer {
    /// The coordinator, seen from a rank.
    Coordinator,
    /// One rank, seen from the coordinator.
    Rank(usize),
    /// Every rank at once.
    EveryRank,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Coordinator => write!(f, "the coordinator"),
            Peer::Rank(rank) => write!(f, "rank {rank}"),
            Peer::EveryRank => write!(f, "every rank"),
        }
    }
}

impl Error {
    /// The error `run()` answers when `rank` failed this way while the replicas were built: a
    /// missing capability is the same on every rank (one factory) and keeps its own variant,
    /// anything else is [`Error::Rank`].
    pub(crate) fn at_start(rank: usize, failure: RankFailure) -> Error {
        match failure.kind {
            FailureKind::MissingCapability { option, capability } => {
                Error::MissingCapability { option, capability }
            }
            _ => Error::Rank { rank, failure },
        }
    }
}

/// A rank describes its error this way to send it over the link.
impl From<&Error> for RankFailure {
    fn from(error: &Error) -> RankFailure {
        let kind = match error {
            Error::Replica(_) | Error::WorkerGone { .. } => FailureKind::Replica,
            Error::ReplicaMismatch { .. } => FailureKind::ReplicaMismatch,
            Error::MissingCapability { option, capability } => {
                FailureKind::MissingCapability { option: *option, capability: *capability }
            }
            Error::Timeout { .. } => FailureKind::Timeout,
            Error::Tensor(_) => FailureKind::Tensor,
            Error::Collective(_) => FailureKind::Collective,
            Error::Data(_) | Error::Prefetch(_) => FailureKind::Data,
            Error::Checkpoint(_) => FailureKind::Checkpoint,
            Error::Protocol { .. } => FailureKind::Protocol,
            Error::PeerGone(_) => FailureKind::PeerGone,
            Error::Rank { failure, .. } => return failure.clone(),
            _ => FailureKind::Runtime,
        };
        RankFailure { kind, message: WireText::from(error.to_string()) }
    }
}

impl Error {
    /// A protocol violation described by `detail`.
    pub(crate) fn protocol(detail: impl Into<String>) -> Self {
        Error::Protocol { detail: detail.into() }
    }

    /// A replica mismatch: `what` was compared, `expected` was expected and `found` found.
    pub fn mismatch(what: &'static str, expected: impl Display, found: impl Display) -> Self {
        Error::ReplicaMismatch {
            what,
            expected: expected.to_string(),
            found: found.to_string(),
            rank: None,
        }
    }

    /// The same error, naming `rank` as the one whose replica mismatched (other errors pass
    /// unchanged).
    pub(crate) fn on_rank(self, rank: usize) -> Self {
        match self {
            Error::ReplicaMismatch { what, expected, found, .. } => {
                Error::ReplicaMismatch { what, expected, found, rank: Some(rank) }
            }
            other => other,
        }
    }

    /// Wraps any error a user replica raises.
    pub fn replica(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Replica(err.into())
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

/// ` on rank r` when the rank is known.
fn on_rank(rank: &Option<usize>) -> String {
    rank.map(|r| format!(" on rank {r}")).unwrap_or_default()
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

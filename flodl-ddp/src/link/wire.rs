//! The wire messages between the coordinator and the ranks: plain serde data, the same
//! in-process and across processes.
//!
//! Nothing here refers to process-local state: no `Arc`, no abort closures, no boxed errors
//! (a failure travels as a [`RankFailure`] description). Every message round-trips through
//! bincode 2 (see the tests below).
//!
//! **Architecture Invariant:** every text a message carries is a [`WireText`] (bounded by type
//! against hostile length prefixes); no message holds a `String`.
//!
//! The vocabulary that exists only to cross the wire lives in `link/` (this file,
//! [`RankFailure`] in `failure.rs`, [`WorkReport`] here). A few types are both the pure
//! logic's and carried on the wire — [`Chunk`] (dispatch), [`Window`] (policy),
//! [`EvalMetrics`], [`TimeBreakdown`] and [`CacheTally`] (metrics), [`Divergence`] (the
//! error) and the host state: the dependency runs from the link to them, never back, because
//! `control/` is the floor below the transport and must not know how its values travel. None
//! of them holds a text or a collection of unbounded elements other than sequences of numbers,
//! which serde reserves cautiously and grows as they arrive.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::failure::RankFailure;
use super::text::WireText;
use crate::control::breakdown::TimeBreakdown;
use crate::control::metrics::{CacheTally, EvalMetrics, Exchange, WorkTally};
pub(crate) use crate::control::{dispatch::Chunk, policy::Window};
use crate::error::Divergence;
use crate::state::{HostState, HostTensor};

/// The version of the messages between processes (the ones here, in the frames of
/// `frame.rs`): a rank process of another version is refused when it joins, with a line naming
/// both (`flodl_cluster::SessionConfig::app`), instead of misreading frames mid-run.
///
/// Raise it with any change to their encoding: the test `the_wire_version_names_this_encoding`
/// (`samples.rs`) holds a digest of every sample message's frame beside it and fails when the
/// frames change, so the change is not made without deciding the version.
pub const WIRE_VERSION: u32 = 1;

/// A rank's report of a finished chunk as it travels: control's [`WorkTally`] with its user
/// scalars named by [`WireText`]s. The tally is control's (the epoch's accounting adds it up);
/// this form is the link's, so the bound on the names comes with the type and control never
/// imports the link.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct WorkReport {
    /// Batches trained.
    pub(crate) batches: usize,
    /// Samples trained.
    pub(crate) samples: usize,
    /// Sum of the batches' mean losses.
    pub(crate) loss_sum: f64,
    /// Time in training steps, milliseconds.
    pub(crate) compute_ms: f64,
    /// Where the rank's time went since its previous report.
    pub(crate) time: TimeBreakdown,
    /// User scalars as `name → (sum, count)`.
    pub(crate) scalars: BTreeMap<WireText, (f64, usize)>,
    /// Where its batches' samples came from, when the rank stages its data.
    pub(crate) cache: Option<CacheTally>,
}

impl From<WorkTally> for WorkReport {
    fn from(w: WorkTally) -> WorkReport {
        let scalars = w.scalars.into_iter().map(|(name, v)| (WireText::from(name), v)).collect();
        WorkReport {
            batches: w.batches,
            samples: w.samples,
            loss_sum: w.loss_sum,
            compute_ms: w.compute_ms,
            time: w.time,
            scalars,
            cache: w.cache,
        }
    }
}

impl From<WorkReport> for WorkTally {
    fn from(w: WorkReport) -> WorkTally {
        let scalars = w.scalars.into_iter().map(|(name, v)| (name.into_string(), v)).collect();
        WorkTally {
            batches: w.batches,
            samples: w.samples,
            loss_sum: w.loss_sum,
            compute_ms: w.compute_ms,
            time: w.time,
            scalars,
            cache: w.cache,
        }
    }
}

/// What the coordinator asks a rank to capture at a reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CaptureRequest {
    /// Whether this rank sends the consensus model and its outer optimizer (collective backend).
    pub(crate) model: bool,
}

/// The outer optimizer's previous parameters and velocity.
pub(crate) type OuterState = (Vec<HostTensor>, Vec<HostTensor>);

/// A rank's part of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RankCapture {
    /// The inner optimizer state.
    pub(crate) optimizer: Vec<HostTensor>,
    /// The inner optimizer's step counter.
    pub(crate) optimizer_steps: u64,
    /// The consensus parameters and buffers, when asked for.
    pub(crate) model: Option<HostState>,
    /// The outer optimizer's state, when asked for and it has run.
    pub(crate) outer: Option<OuterState>,
    /// The chunk the rank was training and how many of its batches it had trained.
    pub(crate) position: Option<(Chunk, usize)>,
}

/// What a rank restores from a checkpoint before it trains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RankRestore {
    /// Its inner optimizer state (empty: keep the fresh one).
    pub(crate) optimizer: Vec<HostTensor>,
    /// Its inner optimizer's step counter.
    pub(crate) optimizer_steps: u64,
    /// The outer optimizer's state, when it had run.
    pub(crate) outer: Option<OuterState>,
    /// The cohort step to continue from.
    pub(crate) global_step: u64,
}

/// The name of a host all-reduce group formed through the controller (the in-memory
/// engine), unique in the process that made it: see [`crate::runtime::engine::host_groups`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct GroupKey(pub(crate) u64);

/// How the survivors of a membership change build their next communicator.
///
/// The NCCL variant exists only in builds with the `cuda` feature; it is the last variant, so
/// both builds number `Host` alike and a build without it refuses an NCCL regroup as a decode
/// error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Regroup {
    /// Shrink the host group to the survivors.
    Host,
    /// Claim a place in the host group of this key, in this process (the in-memory engine:
    /// see [`crate::runtime::engine::host_groups`]); the old group is dropped.
    InMemory(GroupKey),
    /// Join a new NCCL group named by this id (the old one is aborted).
    #[cfg(feature = "cuda")]
    Nccl(flodl_nccl::UniqueId),
}

/// Coordinator → rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum ToWorker {
    /// Load these initial weights (rank 0's, or a resumed checkpoint's consensus with the
    /// rank's own optimizer state), then start in `window` (a rank in another process cannot
    /// know it: on a resume it follows from the bundle's ElChe state), at cohort step
    /// `global_step` (a rank joining a running run starts at the run's).
    Init { state: HostState, restore: Option<Box<RankRestore>>, window: Window, global_step: u64 },
    /// Collective backend, a rank joining a running run: start in `window` (of the reduce in
    /// progress, with nothing to train) at cohort step `global_step`, with the replica as built
    /// (a fresh optimizer). The reduce that follows, in the group just formed with this rank,
    /// gives it the consensus: it trained no step, so it weighs nothing in it.
    Join { window: Window, global_step: u64 },
    /// Train this chunk after the ones already queued.
    Work(Chunk),
    /// The stage advisory: the chunks the rank is expected to train next, in order (those it
    /// holds, then a forecast; latest wins). A rank that stages its data reads ahead along
    /// them; one that does not ignores it.
    Stage { chunks: Vec<Chunk> },
    /// Collective backend: average now (all ranks do), then start `next` window at cohort step
    /// `global_step`; evaluate `eval` epoch afterwards when set. With `capture`, send a
    /// checkpoint part with the acknowledgement and train nothing until [`ToWorker::Resume`].
    Reduce { next: Window, eval: Option<usize>, global_step: u64, capture: Option<CaptureRequest> },
    /// The anchor is ready for the reduce of window `round`: a rank following it reports the
    /// steps it has trained now and trains no more before the reduce than its overshoot (a late
    /// order, for a window already reported or ended, changes nothing).
    Due { round: u64 },
    /// Every other live rank is ready for the reduce of window `round`: this rank is the last
    /// one it waits for, so it trains no batch past its target (a batch begun there would hold
    /// every rank until it ends; a late order, for a window already reported or ended, only
    /// stops it at its next step).
    Last { round: u64 },
    /// Host backend: send a snapshot of the parameters for this round and attempt. With
    /// `capture`, add a checkpoint part and train nothing until the update. With `fragment`
    /// (`--fragments`), only that fragment's parameters (and every buffer); `None`: the whole
    /// state.
    Snapshot { round: u64, attempt: u32, capture: Option<CaptureRequest>, fragment: Option<usize> },
    /// The checkpoint taken at the last reduce is assembled: train on.
    Resume,
    /// Host backend: load the averaged state, then start `next` window at cohort step
    /// `global_step`; evaluate afterwards when set. With `fragment`, `state` is that fragment's
    /// part (its parameters, every buffer) and the rest of the rank's parameters stay as they
    /// are.
    Update {
        state: HostState,
        next: Window,
        eval: Option<usize>,
        global_step: u64,
        fragment: Option<usize>,
    },
    /// Evaluate now (no reduce pending) and report it for `epoch`.
    Evaluate { epoch: usize },
    /// No more work: send the final message, with the final state when `state` (the run's
    /// model is one rank's: the others' travel only where they count) and a checkpoint part
    /// when `capture`, and exit.
    Finish { capture: bool, state: bool },
    /// The run is over (another rank failed or the handle aborted): exit now.
    Stop,
    /// Nothing to do; the coordinator is alive (sent when it has been quiet for a while).
    Ping,
    /// The membership changed: `members` (global ranks, increasing) form collective group
    /// number `generation`, built as `how` says; a rank not listed is dead and exits. A reduce
    /// interrupted by the old group's fault is redone in the new group.
    Regroup { generation: u64, members: Vec<usize>, how: Regroup },
    /// This rank is the lowest member of collective group number `generation`, whose ranks
    /// live in several processes: it makes the group's id (an NCCL unique id) and sends it
    /// back ([`ToCoordinator::GroupId`]); the coordinator relays it in a `Regroup`.
    MakeGroupId { generation: u64 },
    /// Abort the rank's collective group of number `generation` or older, now, even while the
    /// rank is blocked inside a collective. The link acts on this order as it arrives (it fires
    /// the abort handle the rank armed, see [`crate::link::RankLink::arm_abort`]) and never
    /// queues it for the rank's loop.
    AbortGroup { generation: u64 },
    /// To the standby rank's process: one frame of the controller's state's lane (a
    /// `MirrorFrame`, which carries the controller's term; the standby's mirror refuses a stale
    /// one). Nothing for the rank's training.
    Mirror { frame: Vec<u8> },
}

/// Why a rank says it is ready for the reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Readiness {
    /// It trained its window's target.
    Reached,
    /// It ran out of work before its target.
    Idle,
}

/// Most steps a window's tail ([`ToCoordinator::Progress`]'s `tail_ms`) is measured over.
pub(crate) const TAIL_STEPS: usize = 8;

/// Rank → coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum ToCoordinator {
    /// The replica is built; rank 0 sends its initial state, every rank its parameter shapes.
    /// `holds`: the digest of the state a rank in a process of its own built, which its end of
    /// the connection keeps until the `Init` ([`super::held`]).
    Ready {
        rank: usize,
        shapes: Vec<Vec<usize>>,
        initial: Option<HostState>,
        holds: Option<[u8; 32]>,
    },
    /// A chunk is done.
    ChunkDone { rank: usize, chunk: Chunk, work: WorkReport },
    /// The rank is ready for the reduce of `round` (steps and training ms since the last reduce:
    /// its steps with their batches' fetch and upload, the pace ElChe sizes windows by).
    /// `works` counts the chunks the rank has received so far (an `Idle` report is stale when
    /// more were sent). `tail_ms` is the median ms of the window's last steps (half of them,
    /// at least `TAIL_MIN` and at most [`TAIL_STEPS`]; none from fewer), the speed the window
    /// ended at. `exposed_ms` is what the reduce that opened the window cost the rank, the ms
    /// it spent on it instead of training ([`crate::control::exposure::Exposure`]; none when no
    /// reduce opened it).
    Progress {
        rank: usize,
        round: u64,
        steps: usize,
        wall_ms: f64,
        why: Readiness,
        works: u64,
        tail_ms: Option<f64>,
        exposed_ms: Option<f64>,
    },
    /// Collective backend: the rank finished the reduce of `round`; `divergence` is its
    /// `‖W_pre − W_post‖ / ‖W_post‖` when measured (guard on, not `Sync`, the rank stepped).
    /// `capture` is the rank's checkpoint part when one was asked for.
    Reduced {
        rank: usize,
        round: u64,
        steps: usize,
        sync_ms: f64,
        divergence: Option<f64>,
        capture: Option<Box<RankCapture>>,
    },
    /// Host backend: the rank's snapshot for `round` (and checkpoint part, when asked for).
    /// `exchange` is the bytes its connection carried, written by the controller's end of the
    /// network link as the frame arrives (what a rank puts there is overwritten; zeros
    /// in-process).
    Snapshot {
        rank: usize,
        round: u64,
        attempt: u32,
        state: HostState,
        steps: usize,
        capture: Option<Box<RankCapture>>,
        exchange: Exchange,
        /// The fragment `state` is the part of (`None`: the whole state), as asked.
        fragment: Option<usize>,
    },
    /// The rank's evaluation of `epoch`.
    Evaluated { rank: usize, epoch: usize, eval: Option<EvalMetrics> },
    /// The final state after [`ToWorker::Finish`] (and checkpoint part, when asked for).
    Final { rank: usize, state: Option<HostState>, capture: Option<Box<RankCapture>> },
    /// The rank is alive (sent when it has been quiet for a while).
    Alive { rank: usize },
    /// The rank failed and is exiting.
    Failed { rank: usize, failure: RankFailure },
    /// Training diverged on the rank at cohort step `step` (a non-finite loss or parameters);
    /// it is exiting and the run stops.
    Diverged { rank: usize, step: u64, cause: Divergence },
    /// Collective backend: the rank is entering the collective of the reduce of `round` (it
    /// is silent until the collective returns).
    Reducing { rank: usize, round: u64 },
    /// Collective backend: the rank's collective for `round` in group number `generation`
    /// failed because the group broke; its state is as before the reduce and it waits for
    /// [`ToWorker::Regroup`].
    ReduceFailed { rank: usize, round: u64, generation: u64, error: WireText },
    /// The rank is building its communicator of group number `generation` (silent until
    /// [`ToCoordinator::Joined`]: an NCCL group waits for every member).
    Joining { rank: usize, generation: u64 },
    /// The rank joined collective group number `generation` (and armed its link to abort it).
    Joined { rank: usize, generation: u64 },
    /// The id of collective group number `generation`, made by its lowest member as asked
    /// ([`ToWorker::MakeGroupId`]), for the coordinator to relay to every member.
    GroupId { rank: usize, generation: u64, how: Regroup },
}

impl ToCoordinator {
    /// The rank the message says it comes from.
    pub(crate) fn rank(&self) -> usize {
        match self {
            ToCoordinator::Ready { rank, .. }
            | ToCoordinator::ChunkDone { rank, .. }
            | ToCoordinator::Progress { rank, .. }
            | ToCoordinator::Reduced { rank, .. }
            | ToCoordinator::Snapshot { rank, .. }
            | ToCoordinator::Final { rank, .. }
            | ToCoordinator::Alive { rank }
            | ToCoordinator::Failed { rank, .. }
            | ToCoordinator::Diverged { rank, .. }
            | ToCoordinator::Reducing { rank, .. }
            | ToCoordinator::ReduceFailed { rank, .. }
            | ToCoordinator::Joining { rank, .. }
            | ToCoordinator::Evaluated { rank, .. }
            | ToCoordinator::Joined { rank, .. }
            | ToCoordinator::GroupId { rank, .. } => *rank,
        }
    }
}

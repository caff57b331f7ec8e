//! The closed sets of messages between the coordinator and the workers.

use std::sync::Arc;

use crate::Error;
pub(crate) use crate::control::{dispatch::Chunk, policy::Window};
use crate::metrics::{EvalMetrics, WorkTally};
use crate::runtime::capture::{CaptureRequest, RankCapture, RankRestore};

/// A replica's state on the host: parameters then buffers, each flattened, with shapes.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostState {
    /// Parameter values, in the replica's order.
    pub(crate) params: Vec<Vec<f32>>,
    /// Buffer values, in the replica's order.
    pub(crate) buffers: Vec<Vec<f32>>,
}

/// Coordinator → worker.
#[derive(Debug)]
pub(crate) enum ToWorker {
    /// Load these initial weights (rank 0's, or a resumed checkpoint's consensus with the
    /// rank's own optimizer state), then start.
    Init { state: Arc<HostState>, restore: Option<Box<RankRestore>> },
    /// Train this chunk after the ones already queued.
    Work(Chunk),
    /// Collective backend: average now (all ranks do), then start `next` window at cohort step
    /// `global_step`; evaluate `eval` epoch afterwards when set. With `capture`, send a
    /// checkpoint part with the acknowledgement and train nothing until [`ToWorker::Resume`].
    Reduce { next: Window, eval: Option<usize>, global_step: u64, capture: Option<CaptureRequest> },
    /// Host backend: send a snapshot of the parameters for this round and attempt. With
    /// `capture`, add a checkpoint part and train nothing until the update.
    Snapshot { round: u64, attempt: u32, capture: Option<CaptureRequest> },
    /// The checkpoint taken at the last reduce is assembled: train on.
    Resume,
    /// Host backend: load the averaged state, then start `next` window at cohort step
    /// `global_step`; evaluate afterwards when set.
    Update { state: Arc<HostState>, next: Window, eval: Option<usize>, global_step: u64 },
    /// Evaluate now (no reduce pending) and report it for `epoch`.
    Evaluate { epoch: usize },
    /// No more work: send the final state (with a checkpoint part when `capture`) and exit.
    Finish { capture: bool },
    /// The run is over (another rank failed or the handle aborted): exit now.
    Stop,
    /// Nothing to do; the coordinator is alive (sent when it has been quiet for a while).
    Ping,
    /// The membership changed: `members` (global ranks, increasing) form collective group
    /// number `generation`, built as `how` says; a rank not listed is dead and exits. A reduce
    /// interrupted by the old group's fault is redone in the new group.
    Regroup { generation: u64, members: Vec<usize>, how: crate::runtime::comm::Regroup },
}

/// Why a rank says it is ready for the reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// It trained its window's target.
    Reached,
    /// It ran out of work before its target.
    Idle,
}

/// How long a side of a channel stays quiet before it says it is alive: a quarter of the stall
/// timeout, at most a second.
pub(crate) fn heartbeat(stall_timeout: std::time::Duration) -> std::time::Duration {
    (stall_timeout / 4).min(std::time::Duration::from_secs(1))
}

/// Worker → coordinator.
#[derive(Debug)]
pub(crate) enum ToCoordinator {
    /// The replica is built; rank 0 sends its initial state, every rank its parameter shapes.
    Ready { rank: usize, shapes: Vec<Vec<usize>>, initial: Option<HostState> },
    /// A chunk is done.
    ChunkDone { rank: usize, chunk: Chunk, work: WorkTally },
    /// The rank is ready for the reduce of `round` (steps and compute ms since the last reduce).
    /// `works` counts the chunks the rank has received so far (an `Idle` report is stale when
    /// more were sent).
    Progress { rank: usize, round: u64, steps: usize, wall_ms: f64, why: Readiness, works: u64 },
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
    Snapshot {
        rank: usize,
        round: u64,
        attempt: u32,
        state: HostState,
        steps: usize,
        capture: Option<Box<RankCapture>>,
    },
    /// The evaluation of `epoch`.
    Evaluated { epoch: usize, eval: Option<EvalMetrics> },
    /// The final state after [`ToWorker::Finish`] (and checkpoint part, when asked for).
    Final { rank: usize, state: HostState, capture: Option<Box<RankCapture>> },
    /// Host backend: the helper thread's average for `round`, and the largest divergence of
    /// a snapshot from it when measured.
    Averaged { round: u64, state: crate::Result<HostState>, divergence: Option<f64> },
    /// The rank is alive (sent when it has been quiet for a while).
    Alive { rank: usize },
    /// The rank failed and is exiting.
    Failed { rank: usize, error: Error },
    /// Collective backend: the rank is entering the collective of the reduce of `round` (it
    /// is silent until the collective returns).
    Reducing { rank: usize, round: u64 },
    /// Collective backend: the rank's collective for `round` in group number `generation`
    /// failed because the group broke; its state is as before the reduce and it waits for
    /// [`ToWorker::Regroup`].
    ReduceFailed { rank: usize, round: u64, generation: u64, error: String },
    /// The rank is building its communicator of group number `generation` (silent until
    /// [`ToCoordinator::Joined`]: an NCCL group waits for every member).
    Joining { rank: usize, generation: u64 },
    /// The rank joined collective group number `generation`; `abort` aborts that group.
    Joined { rank: usize, generation: u64, abort: flodl_nccl::AbortHandle },
}

impl ToCoordinator {
    /// The rank that sent the message, if a rank did.
    pub(crate) fn rank(&self) -> Option<usize> {
        match self {
            ToCoordinator::Ready { rank, .. }
            | ToCoordinator::ChunkDone { rank, .. }
            | ToCoordinator::Progress { rank, .. }
            | ToCoordinator::Reduced { rank, .. }
            | ToCoordinator::Snapshot { rank, .. }
            | ToCoordinator::Final { rank, .. }
            | ToCoordinator::Alive { rank }
            | ToCoordinator::Failed { rank, .. }
            | ToCoordinator::Reducing { rank, .. }
            | ToCoordinator::ReduceFailed { rank, .. }
            | ToCoordinator::Joining { rank, .. }
            | ToCoordinator::Joined { rank, .. } => Some(*rank),
            ToCoordinator::Evaluated { .. } | ToCoordinator::Averaged { .. } => None,
        }
    }
}

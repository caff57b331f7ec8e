//! The coordinator: one thread that hands out work, decides when to average, runs the host
//! averaging rounds, decides membership and aggregates metrics — one loop over the run's
//! [`Phase`], talking to the ranks only through their link.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flodl_tensor::{Stream, Tensor};

use crate::checkpoint::{Checkpoint, SaveReason};
use crate::control::breakdown::Activity;
use crate::control::dispatch::{Cutting, Dispatcher};
use crate::control::elche::ElChe;
use crate::control::guard::{Guard, ReduceReport};
use crate::control::metrics::{EpochMetrics, GuardEvent, ReduceEvent, WorkTally};
use crate::control::outer::{OuterKind, OuterOptimizer};
use crate::control::overshoot::Overshoot;
use crate::control::policy::{Backend, Policy, Trigger, should_reduce};
use crate::control::verdict::Verdict;
use crate::error::Peer;
use crate::link::failure::RankFailure;
use crate::link::net::NetCoordinator;
use crate::link::route::{Route, Routed};
use crate::link::wire::{
    CaptureRequest, RankCapture, Readiness, Regroup, ToCoordinator, ToWorker, Window,
};
use crate::link::{CoordinatorLink, Inbound, LinkError, local};
use crate::runtime::capture::{
    Progress, Resumed, assemble, outer_state, partial_ranges, restore_outer, save, signature,
};
use crate::runtime::cluster::Admitted;
use crate::runtime::comm::{CommPlan, RankComm};
use crate::runtime::fault::{FaultCause, FaultEvent, RankThread, RejoinEvent};
use crate::runtime::formation::Formation;
use crate::runtime::handle::{Outlets, TrainedState, panic_message, trained_state};
use crate::runtime::host_round::{AverageJob, HostRound, average, divergence};
use crate::runtime::rank::run_rank;
use crate::runtime::slot::{Engine, GroupBook, InCollective, Ready, Slots, Standing};
use crate::runtime::trainer::RunConfig;
use crate::state::HostState;
use crate::{Error, Result};

/// Capacity of the coordinator's inbox (every rank's messages and its own events).
const INBOX: usize = 4096;
/// Capacity of each rank's queue.
const TO_RANK: usize = 256;
/// Chunks a rank may hold at once (one training, one queued, so it never waits for work).
const CHUNKS_AHEAD: usize = 2;
/// Longest the coordinator sleeps between looks at the cancel flag and deadlines.
const TICK: Duration = Duration::from_millis(50);
/// Watchdog deadlines a collective reduce's attempt may stay pending, all ranks alive, before
/// the run gives up.
const STALLED_REDUCE: u32 = 4;
/// Reduce attempts that may fail in a row with every rank alive before the run gives up.
const FUTILE_ATTEMPTS: usize = 3;

/// What [`spawn`] starts: the coordinator's thread and the ranks' threads.
pub(crate) type Spawned = (JoinHandle<Result<TrainedState>>, Vec<RankThread>);

/// Events from within the coordinator's own process.
#[derive(Debug)]
pub(crate) enum Local {
    /// Host backend: the helper thread's average for `round`, and the largest divergence of a
    /// snapshot from it when measured.
    Averaged { round: u64, state: Result<HostState>, divergence: Option<f64> },
}

/// What the coordinator's inbox holds.
type Event = Inbound<Local>;

/// Starts one thread per rank of this process, linked to the coordinator in-process, and the
/// coordinator's thread; the ranks in `remote` are in other processes, reached through their
/// connection (the network link).
pub(crate) fn spawn(cfg: Arc<RunConfig>, outlets: Outlets, admitted: Admitted) -> Result<Spawned> {
    let world = cfg.world();
    let (remote, arrivals) = admitted;
    let comms = comm_plans(&cfg)?;
    let (inbox_tx, inbox) = flume::bounded(INBOX);
    // A cluster controller runs its own rank only; a seat no process has joined is vacant.
    let here: Vec<usize> = match cfg.own {
        Some((own, _)) => vec![own],
        None => (0..world).filter(|r| remote.iter().all(|(x, _)| x != r)).collect(),
    };
    let vacant: Vec<usize> =
        (0..world).filter(|r| !here.contains(r) && remote.iter().all(|(x, _)| x != r)).collect();
    let (local_link, ends) = local::link_ranks(&here, TO_RANK, &inbox_tx);
    let link: Box<dyn CoordinatorLink> = if remote.is_empty() && arrivals.is_none() {
        Box::new(local_link)
    } else {
        let routes = (0..world)
            .map(|r| here.iter().position(|x| *x == r).map_or(Route::Remote, Route::Local))
            .collect();
        let net = NetCoordinator::new(world, remote, cfg.spec.wire, &inbox_tx, arrivals)?;
        Box::new(Routed::new(routes, local_link, net))
    };
    let mut coord = Coordinator::new(cfg.clone(), outlets, inbox, inbox_tx, link)?;
    coord.vacate(&vacant)?;
    coord.group.engine = engine(&cfg, &comms);
    // NCCL ranks in several processes: each group's id is made by its lowest member and
    // relayed by the coordinator (see `Formation`).
    coord.group.relay = cfg.spec.collective_engine().is_some_and(|e| e.relays(cfg.spec.placement));
    let mut workers = Vec::with_capacity(world);
    let comms = comms.into_iter().enumerate().filter(|(rank, _)| here.contains(rank));
    for ((rank, comm), end) in comms.zip(ends) {
        let first = coord
            .slots
            .get(rank)
            .map_or(Window { round: 1, target: 1, limit: 1, wall: None }, |s| s.window);
        let cfg = cfg.clone();
        let (alive, ended) = flume::bounded::<()>(1);
        let handle = std::thread::Builder::new()
            .name(format!("flodl-rank-{rank}"))
            .spawn(move || {
                // Dropped when the thread ends, which disconnects `ended`.
                let _alive = alive;
                // The rank's failure has been reported to the coordinator through the link.
                let _ = run_rank(rank, cfg, comm, &end, first);
            })
            .map_err(|source| Error::Spawn { what: "a rank's thread", source })?;
        workers.push(RankThread { rank, handle, ended });
    }
    let main = std::thread::Builder::new()
        .name("flodl-coordinator".into())
        .spawn(move || match catch_unwind(AssertUnwindSafe(|| coord.run())) {
            Ok(r) => r,
            Err(p) => Err(Error::CoordinatorPanicked { message: panic_message(p.as_ref()) }),
        })
        .map_err(|source| Error::Spawn { what: "the coordinator's thread", source })?;
    Ok((main, workers))
}

/// The engine of the run's collective groups: MPI across processes, NCCL when the plans say so,
/// the host collective otherwise.
fn engine(cfg: &RunConfig, comms: &[Option<CommPlan>]) -> Engine {
    if cfg.spec.controller_apart() {
        return Engine::Mpi;
    }
    #[cfg(feature = "cuda")]
    if comms.iter().any(|c| matches!(c, Some(CommPlan::Nccl { .. }))) {
        return Engine::Nccl;
    }
    let _ = comms;
    Engine::Host
}

/// How each rank of this process joins the collective backend: NCCL when every rank is a
/// distinct GPU (and the `cuda` feature is on), the host collective otherwise (device tensors
/// then go through host copies). Ranks in their own processes (MPI) join in their process.
fn comm_plans(cfg: &RunConfig) -> Result<Vec<Option<CommPlan>>> {
    let world = cfg.world();
    // Host backend: no communicator; ranks in several processes: NCCL ranks join the first
    // group when the coordinator relays its id, MPI ranks join their world in their process.
    if cfg.spec.backend == Backend::Host || cfg.spec.placement.is_cluster() {
        return Ok((0..world).map(|_| None).collect());
    }
    #[cfg(feature = "cuda")]
    if cfg.spec.collective_engine() == Some(crate::CollectiveEngine::Nccl) {
        let id = flodl_nccl::UniqueId::new()?;
        return Ok((0..world).map(|_| Some(CommPlan::Nccl { id: id.clone(), world })).collect());
    }
    Ok(RankComm::host_group(world, cfg.comm_timeout())
        .into_iter()
        .map(|c| Some(CommPlan::Host(c)))
        .collect())
}

/// Where the run is.
#[derive(Debug)]
enum Phase {
    /// The ranks build their replicas; rank 0 sends the initial state.
    Starting { deadline: Instant, initial: Option<HostState> },
    /// Training, reducing, checkpointing.
    Training,
    /// Every rank was told to finish; their final states (and checkpoint parts) come in.
    Finishing { deadline: Instant, finals: Vec<Option<HostState>>, parts: Vec<Option<RankCapture>> },
}

/// The reduce in progress.
#[derive(Debug)]
enum Reduce {
    /// None.
    Idle,
    /// Collective backend: waiting for every rank's acknowledgement.
    /// Each ack: (steps, sync ms, divergence).
    Collective { round: u64, acks: Vec<Option<(usize, f64, Option<f64>)>>, counts: Vec<usize> },
    /// Host backend: the averaging state machine.
    Host(HostRound),
}

/// The evaluation the coordinator has asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Evaluation {
    /// None pending.
    Idle,
    /// Asked of this rank (`None`: nobody was alive to elect).
    Asked(Option<usize>),
}

impl Evaluation {
    /// The rank evaluating now, if any.
    fn rank(self) -> Option<usize> {
        match self {
            Evaluation::Asked(rank) => rank,
            Evaluation::Idle => None,
        }
    }
}

/// What sizes the windows: ElChe, the `Async` overshoot, and the guard that steers both.
#[derive(Debug)]
struct Cadence {
    elche: Option<ElChe>,
    overshoot: Overshoot,
    guard: Guard,
    /// The guard's verdict on the last reduce (obeyed at the next trigger).
    verdict: Verdict,
}

/// Counters of the run's reduces.
#[derive(Debug)]
struct Rounds {
    /// The current window's number.
    round: u64,
    /// Reduces completed.
    reduces: u64,
    /// Batches of all ranks up to the last reduce.
    global_step: u64,
    /// Host rounds soft-aborted in a row.
    stalled: usize,
    last_sync_ms: f64,
}

/// An aggregated epoch waiting for its evaluation before it is emitted.
#[derive(Debug)]
struct Held {
    metrics: EpochMetrics,
    awaiting_eval: bool,
}

/// The epochs done: held until evaluated, then emitted.
#[derive(Debug, Default)]
struct Epochs {
    held: VecDeque<Held>,
    emitted: Vec<EpochMetrics>,
    /// When each rank's last chunk report arrived: its wait from then to the end of training
    /// counts for the last epoch (its own reports cover its time up to it).
    reported: Vec<Option<Instant>>,
}

/// When the run started, its first chunk went out and its last epoch completed.
#[derive(Debug)]
struct Clock {
    start: Instant,
    train_start: Option<Instant>,
    train_end: Option<Instant>,
}

impl Clock {
    fn at_ms(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0
    }
}

/// A checkpoint being captured at the reduce that ends window `round`.
#[derive(Debug)]
struct Capturing {
    round: u64,
    reason: SaveReason,
    /// Whether the run stops once the bundle is saved.
    stop: bool,
    global_step: u64,
    parts: Vec<Option<RankCapture>>,
}

/// The run's checkpoints: the one in capture, the last saved, the one resumed from.
#[derive(Debug, Default)]
struct Saves {
    capturing: Option<Capturing>,
    /// Completed epochs at the last epoch-triggered save.
    epochs_saved: usize,
    /// The last bundle saved (re-saved with the reason when the run cannot go on).
    last_bundle: Option<Checkpoint>,
    resumed: Option<Arc<Resumed>>,
    /// The on-demand save being set up stops the run (read by the capture it starts).
    stop_after_save: bool,
}

/// Host backend: the outer optimizer, stepped once per round on the average, on a CPU stream.
#[derive(Debug)]
struct OuterStep {
    optimizer: OuterOptimizer,
    cpu: Stream,
}

/// The coordinator's state.
struct Coordinator {
    cfg: Arc<RunConfig>,
    outlets: Outlets,
    inbox: flume::Receiver<Event>,
    /// Where the coordinator's own helpers deliver their events.
    local: flume::Sender<Event>,
    link: Box<dyn CoordinatorLink>,
    phase: Phase,
    devices: Vec<String>,
    shapes: Vec<Vec<usize>>,
    slots: Slots,
    group: GroupBook,
    dispatch: Dispatcher,
    cadence: Cadence,
    outer: OuterStep,
    rounds: Rounds,
    reduce: Reduce,
    eval: Evaluation,
    epochs: Epochs,
    saves: Saves,
    clock: Clock,
    /// The deaths so far, for the final state.
    faults: Vec<FaultEvent>,
    /// The ranks that joined again so far, for the final state.
    rejoins: Vec<RejoinEvent>,
    /// Host backend: the consensus of the last completed reduce (or the starting state), what
    /// a rank joining again starts from.
    consensus: Option<HostState>,
    /// The collective group being formed through the coordinator (ranks in several processes).
    formation: Formation,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator").field("phase", &self.phase).finish_non_exhaustive()
    }
}

/// The cutting rule of a policy's dispatch.
fn cutting(cfg: &RunConfig) -> Cutting {
    Cutting::for_policy(cfg.spec.policy, cfg.spec.elche.min_chunk)
}

impl Coordinator {
    fn new(
        cfg: Arc<RunConfig>,
        outlets: Outlets,
        inbox: flume::Receiver<Event>,
        local: flume::Sender<Event>,
        link: Box<dyn CoordinatorLink>,
    ) -> Result<Self> {
        let world = cfg.world();
        let batches = cfg.batches_per_epoch();
        let knobs = &cfg.spec.elche;
        let elche = match cfg.spec.policy {
            Policy::Sync => None,
            Policy::Cadence | Policy::Async => {
                let mut e = ElChe::new(world, knobs.anchor)?
                    .with_overhead_target(knobs.overhead_target)
                    .with_max_anchor(knobs.max_anchor)
                    .with_max_total(batches);
                if let Some(d) = knobs.max_batch_diff {
                    e = e.with_max_batch_diff(d);
                }
                if let Some((slow, ratio)) = knobs.speed_hint {
                    e = e.with_speed_ratio(slow, ratio)?;
                }
                Some(e)
            }
        };
        let overshoot =
            knobs.max_overshoot.map_or_else(|| Overshoot::auto(batches), Overshoot::fixed);
        let cadence =
            Cadence { elche, overshoot, guard: cfg.spec.guard.clone(), verdict: Verdict::Stable };
        let outer = OuterStep {
            optimizer: OuterOptimizer::new(cfg.spec.outer)?,
            cpu: Stream::cpu_with_threads(1),
        };
        let placeholder = vec![Window { round: 1, target: 1, limit: 1, wall: None }; world];
        let slots = Slots::new(placeholder, outlets.dead.clone());
        let mut coord = Coordinator {
            devices: cfg.spec.devices.iter().map(ToString::to_string).collect(),
            dispatch: Dispatcher::new(
                world,
                cfg.spec.batch_size,
                batches,
                cfg.spec.epochs,
                cutting(&cfg),
            ),
            phase: Phase::Starting {
                deadline: Instant::now() + cfg.spec.stall_timeout,
                initial: None,
            },
            cfg,
            outlets,
            inbox,
            local,
            link,
            shapes: Vec::new(),
            slots,
            group: GroupBook::default(),
            cadence,
            outer,
            rounds: Rounds { round: 1, reduces: 0, global_step: 0, stalled: 0, last_sync_ms: 0.0 },
            reduce: Reduce::Idle,
            eval: Evaluation::Idle,
            epochs: Epochs { reported: vec![None; world], ..Epochs::default() },
            saves: Saves::default(),
            clock: Clock { start: Instant::now(), train_start: None, train_end: None },
            faults: Vec::new(),
            rejoins: Vec::new(),
            consensus: None,
            formation: Formation::Idle,
        };
        if let Some(resumed) = coord.cfg.resume.clone() {
            coord.resume(&resumed)?;
            coord.saves.resumed = Some(resumed);
        }
        let windows = coord.make_windows(coord.rounds.round);
        for (slot, w) in coord.slots.iter_mut().zip(windows) {
            slot.window = w;
        }
        Ok(coord)
    }

    /// Leaves `ranks` out of the start: no process joined their seats (a cluster run started
    /// on a quorum); a process that joins one later is admitted like a rank joining again.
    fn vacate(&mut self, ranks: &[usize]) -> Result<()> {
        for &rank in ranks {
            tracing::info!(rank, "rank {rank}'s seat is vacant at the start");
            self.slots.set_joining(rank, Standing::Vacant);
            self.dispatch.retire(rank, 0, Instant::now());
            if let Some(e) = self.cadence.elche.as_mut() {
                e.retire(rank)?;
            }
        }
        Ok(())
    }

    /// Seeds the book, ElChe, the guard, the outer optimizer and the counters from a checkpoint.
    fn resume(&mut self, resumed: &Resumed) -> Result<()> {
        let bundle = &resumed.bundle;
        let epoch = usize::try_from(bundle.epoch).unwrap_or(usize::MAX);
        let world = self.cfg.world();
        let batches = self.cfg.batches_per_epoch();
        let cfg = &self.cfg;
        self.dispatch =
            Dispatcher::new(world, cfg.spec.batch_size, batches, cfg.spec.epochs, cutting(cfg))
                .resume(epoch, &resumed.coverage)
                .map(|d| if resumed.map.same_world() { d } else { d.reshard() })?;
        // On another world ElChe's estimates (per-rank speeds) describe ranks that are gone:
        // it starts afresh and calibrates on the new one.
        if let (Some(e), Some(state), true) =
            (self.cadence.elche.as_mut(), &resumed.elche, resumed.map.same_world())
        {
            e.restore(state)?;
        }
        if let Some(guard) = &resumed.guard {
            self.cadence.guard = guard.clone();
        }
        if self.cfg.spec.backend == Backend::Host
            && let Some(outer) = resumed.ranks.first().and_then(|r| r.outer.as_ref())
        {
            restore_outer(&mut self.outer.optimizer, outer, &self.outer.cpu)?;
        }
        self.rounds.global_step = bundle.global_step;
        self.rounds.reduces = bundle.reduce_version;
        self.rounds.round = bundle.reduce_version + 1;
        self.epochs.emitted = resumed.epochs.clone();
        self.saves.epochs_saved = epoch;
        tracing::info!(epoch, step = bundle.global_step, "resuming from a checkpoint");
        if !resumed.map.same_world() {
            tracing::info!(map = %resumed.map, "elastic resume: ElChe re-calibrates, the open epochs are re-sharded");
        }
        Ok(())
    }

    /// Each rank's window numbered `round`, from the policy and ElChe's counts; once ElChe is
    /// calibrated, the ranks other than the anchor follow it ([`Window::following`]).
    fn make_windows(&self, round: u64) -> Vec<Window> {
        let elche = self.cadence.elche.as_ref();
        let anchor_wall_ms = elche.map_or(0.0, ElChe::anchor_wall_ms);
        let overshoot = self.cadence.overshoot.current();
        (0..self.cfg.world())
            .map(|r| {
                let count = elche.and_then(|e| e.counts().get(r).copied()).unwrap_or(1);
                let window = self.cfg.spec.policy.window(round, count, overshoot, anchor_wall_ms);
                if self.follows(r) { window.following() } else { window }
            })
            .collect()
    }

    /// The rank the others follow under `Cadence` and `Async`: ElChe's anchor once it is
    /// calibrated.
    fn paced_by(&self) -> Option<usize> {
        let elche = self.cadence.elche.as_ref().filter(|e| e.is_calibrated())?;
        self.cfg.spec.policy.is_progressive().then(|| elche.anchor_rank()).flatten()
    }

    /// Whether `rank`'s windows follow the anchor's ([`Window::following`]).
    fn follows(&self, rank: usize) -> bool {
        self.paced_by().is_some_and(|anchor| anchor != rank)
    }

    /// The batches each rank's current window planned: its target, or ElChe's count for a
    /// rank following the anchor (whose target is only its bound).
    fn planned_counts(&self) -> Vec<usize> {
        let elche = self.cadence.elche.as_ref();
        let planned = |r: usize, target: usize| match elche {
            Some(e) if self.follows(r) => e.counts().get(r).copied().unwrap_or(target),
            _ => target,
        };
        self.slots.iter().enumerate().map(|(r, s)| planned(r, s.window.target)).collect()
    }

    /// The anchor `rank` is ready for the reduce of the current window, so every live rank not
    /// yet ready is told to report now ([`ToWorker::Due`]).
    fn anchor_ready(&mut self, rank: usize) -> Result<()> {
        if self.paced_by() != Some(rank) {
            return Ok(());
        }
        let round = self.rounds.round;
        let due: Vec<usize> = self
            .slots
            .live_ranks()
            .into_iter()
            .filter(|&r| r != rank && self.slots.get(r).is_some_and(|s| s.ready.is_none()))
            .collect();
        for r in due {
            self.send(r, ToWorker::Due { round })?;
        }
        Ok(())
    }

    fn run(mut self) -> Result<TrainedState> {
        let result = self.drive();
        if result.is_err() {
            for rank in 0..self.slots.world() {
                let _ = self.link.try_send(rank, ToWorker::Stop);
                let _ = self.link.try_send(rank, ToWorker::AbortGroup { generation: u64::MAX });
            }
        }
        result
    }

    /// Sends `msg` to `rank`. A rank whose link is gone is no error here: its `Gone` follows.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the rank's queue stayed full past the stall timeout.
    fn send(&mut self, rank: usize, msg: ToWorker) -> Result<()> {
        if let Some(slot) = self.slots.get_mut(rank) {
            slot.sent = Instant::now();
        }
        match self.link.send(rank, msg, self.cfg.spec.stall_timeout) {
            Ok(()) | Err(LinkError::Gone | LinkError::Full) => Ok(()),
            Err(LinkError::Timeout(after)) => {
                Err(Error::Timeout { what: "room in a rank's queue", after })
            }
        }
    }

    /// The loop: what the phase asks for, then the inbox, then the deadlines.
    fn drive(&mut self) -> Result<TrainedState> {
        loop {
            let now = Instant::now();
            match &self.phase {
                Phase::Starting { deadline, .. } => {
                    if self.slots.iter().all(|s| s.standing != Standing::Starting) {
                        self.start_training()?;
                        continue;
                    }
                    if now >= *deadline {
                        let after = self.cfg.spec.stall_timeout;
                        return Err(Error::Timeout { what: "the ranks' replicas", after });
                    }
                }
                Phase::Training => {
                    self.dispatch_all()?;
                    if self.step_reduce()? {
                        self.start_finishing()?;
                        continue;
                    }
                }
                Phase::Finishing { deadline, finals, .. } => {
                    if self.slots.live_ranks().iter().all(|&r| finals[r].is_some()) {
                        return self.conclude();
                    }
                    if now >= *deadline {
                        let after = self.cfg.spec.stall_timeout;
                        return Err(Error::Timeout { what: "the ranks' final states", after });
                    }
                }
            }
            let timeout = match &self.reduce {
                Reduce::Host(round) => round.time_left().min(TICK),
                _ => TICK,
            };
            if let Ok(event) = self.inbox.recv_timeout(timeout) {
                self.handle(event)?;
                while let Ok(event) = self.inbox.try_recv() {
                    self.handle(event)?;
                }
            }
            if self.outlets.cancel.load(Ordering::Acquire) {
                return Err(Error::Aborted);
            }
            if matches!(self.phase, Phase::Training) {
                self.check_host_deadline()?;
                self.aggregate();
                self.check_liveness()?;
            }
        }
    }

    fn handle(&mut self, event: Event) -> Result<()> {
        match event {
            Inbound::Local(Local::Averaged { round, state, divergence }) => {
                self.averaged(round, state, divergence)
            }
            Inbound::Gone { rank } => self.gone(rank),
            Inbound::Joined { rank, frames } => self.joined(rank, frames.0),
            Inbound::Wire { rank, msg } => {
                if matches!(
                    self.slots.standing(rank),
                    Some(Standing::Rejoining | Standing::Waiting)
                ) {
                    return self.joining_wire(rank, msg);
                }
                if !self.slots.is_live(rank) {
                    // The coordinator decides membership: a dead rank's late words change nothing.
                    return Ok(());
                }
                if msg.rank() != rank {
                    let detail = format!("rank {rank} sent a message as rank {}", msg.rank());
                    return self.violation(rank, detail);
                }
                if let Some(slot) = self.slots.get_mut(rank) {
                    slot.heard = Instant::now();
                }
                self.handle_wire(msg)
            }
        }
    }

    /// `rank` broke the protocol: in training it is declared dead; before, the run fails.
    fn violation(&mut self, rank: usize, detail: String) -> Result<()> {
        let failure = RankFailure::from(&Error::protocol(detail));
        match self.phase {
            Phase::Starting { .. } => Err(Error::Rank { rank, failure }),
            _ => self.rank_died(
                rank,
                FaultCause::Failed { error: failure.message.to_string() },
                failure,
            ),
        }
    }

    /// `rank`'s link is gone: after its final state that is the end of it; before, it died.
    /// A process joining again that goes away leaves the seat dead.
    fn gone(&mut self, rank: usize) -> Result<()> {
        if matches!(self.slots.standing(rank), Some(Standing::Rejoining | Standing::Waiting)) {
            tracing::warn!(rank, "the process joining again as rank {rank} went away");
            self.slots.set_joining(rank, Standing::Dead);
            return Ok(());
        }
        if !self.slots.is_live(rank) {
            return Ok(());
        }
        match &self.phase {
            Phase::Starting { .. } => Err(Error::PeerGone(Peer::Rank(rank))),
            Phase::Finishing { finals, .. } if finals.get(rank).is_some_and(Option::is_some) => {
                Ok(())
            }
            _ => {
                let failure = RankFailure::from(&Error::PeerGone(Peer::Rank(rank)));
                self.rank_died(rank, FaultCause::Gone, failure)
            }
        }
    }

    /// A new process for `rank` connected (the controller admitted it: same job CA, same run,
    /// the rank's seat free). A dead rank's seat starts rejoining; it is turned away once the
    /// run finishes, and on the collective backend unless its groups are formed through the
    /// controller (an MPI world cannot grow).
    fn joined(&mut self, rank: usize, frames: Arc<dyn crate::link::net::Frames>) -> Result<()> {
        let refusal = if !matches!(self.phase, Phase::Training) {
            Some("the run is not training")
        } else if self.cfg.spec.backend == Backend::Host || self.group.relay {
            None
        } else if self.group.engine == Engine::Mpi {
            Some("an MPI world cannot grow (the launcher restarts the job from its last bundle)")
        } else {
            Some("this run's collective groups are not formed through the controller")
        };
        if let Some(why) = refusal {
            tracing::warn!(rank, "a process joining again as rank {rank} was turned away: {why}");
            frames.close();
            return Ok(());
        }
        if self.slots.is_live(rank) {
            // Its old connection has ended (the controller frees a seat only then), even if
            // its `Gone` was not read yet.
            let failure = RankFailure::from(&Error::PeerGone(Peer::Rank(rank)));
            self.rank_died(rank, FaultCause::Gone, failure)?;
        }
        if !self.link.attach(rank, frames.clone()) {
            frames.close();
            return Ok(());
        }
        self.slots.set_joining(rank, Standing::Rejoining);
        tracing::info!(
            rank,
            reduce = self.rounds.reduces,
            "rank {rank} connected again; rejoining"
        );
        Ok(())
    }

    /// A message from a process joining again: its replica is built (`Ready`), or it failed.
    fn joining_wire(&mut self, rank: usize, msg: ToCoordinator) -> Result<()> {
        if msg.rank() != rank {
            tracing::warn!(
                rank,
                "the process joining again as rank {rank} sent a message as rank {}",
                msg.rank()
            );
            let _ = self.link.try_send(rank, ToWorker::Stop);
            self.slots.set_joining(rank, Standing::Dead);
            return Ok(());
        }
        match msg {
            ToCoordinator::Ready { shapes, .. } => {
                if shapes != self.shapes {
                    tracing::warn!(
                        rank,
                        "the process joining again as rank {rank} has other parameter shapes: turned away"
                    );
                    let _ = self.link.try_send(rank, ToWorker::Stop);
                    self.slots.set_joining(rank, Standing::Dead);
                } else {
                    self.slots.set_joining(rank, Standing::Waiting);
                    tracing::info!(
                        rank,
                        "rank {rank} is ready; it joins at the end of the next reduce"
                    );
                }
            }
            ToCoordinator::Failed { failure, .. } => {
                tracing::warn!(rank, error = %failure.message, "the process joining again as rank {rank} failed");
                self.slots.set_joining(rank, Standing::Dead);
            }
            _ => {
                if let Some(slot) = self.slots.get_mut(rank) {
                    slot.heard = Instant::now();
                }
            }
        }
        Ok(())
    }

    /// The ranks whose process is built and waits to join.
    fn waiting(&self) -> Vec<usize> {
        self.slots
            .joining()
            .into_iter()
            .filter(|&r| self.slots.standing(r) == Some(Standing::Waiting))
            .collect()
    }

    /// Takes `rank`, waiting to join, back into the run in its window of `round`: ElChe and
    /// the dispatcher admit it (a fresh estimate, work from the free spans), its seat is alive
    /// again, and its rejoin is reported as starting from the consensus of `reduce` reduces.
    /// Returns its window.
    fn admit(&mut self, rank: usize, round: u64, reduce: u64) -> Result<Window> {
        self.dispatch.admit(rank);
        if let Some(e) = self.cadence.elche.as_mut() {
            e.admit(rank)?;
        }
        let window = self.make_windows(round).get(rank).copied().unwrap_or(Window {
            round,
            target: 1,
            limit: 1,
            wall: None,
        });
        self.slots.admit(rank, window);
        if let Some(at) = self.epochs.reported.get_mut(rank) {
            *at = None;
        }
        let members = self.slots.live_ranks();
        tracing::info!(rank, reduce, ?members, "rank {rank} rejoined at reduce {reduce}");
        let event = RejoinEvent { rank, at_ms: self.clock.at_ms(), reduce, members };
        self.rejoins.push(event.clone());
        let _ = self.outlets.rejoins.try_send(event);
        Ok(window)
    }

    /// Host backend, at the end of a reduce whose consensus is `state`: admits every rank
    /// waiting to join again, which starts from `state` with a fresh optimizer in the window
    /// the others start now.
    fn admit_waiting(&mut self, state: &HostState) -> Result<()> {
        for rank in self.waiting() {
            let window = self.admit(rank, self.rounds.round, self.rounds.reduces)?;
            let global_step = self.rounds.global_step;
            let init = ToWorker::Init { state: state.clone(), restore: None, window, global_step };
            self.send(rank, init)?;
        }
        Ok(())
    }

    /// Collective backend whose groups form through the controller, as the reduce ending
    /// window `ending` starts: admits every rank waiting to join again. Returns the orders
    /// that start them, to follow the forming of a group with them as members: each is told
    /// to join in that reduce, whose average it takes without weighing in it.
    fn admit_joiners(&mut self, ending: u64) -> Result<Vec<(usize, ToWorker)>> {
        let mut orders = Vec::new();
        if !self.group.relay {
            return Ok(orders);
        }
        let global_step = self.rounds.global_step;
        for rank in self.waiting() {
            self.admit(rank, ending, self.rounds.reduces + 1)?;
            let window = Window { round: ending, target: 0, limit: 0, wall: None };
            orders.push((rank, ToWorker::Join { window, global_step }));
        }
        Ok(orders)
    }

    fn handle_wire(&mut self, msg: ToCoordinator) -> Result<()> {
        match msg {
            ToCoordinator::Alive { .. } => {}
            ToCoordinator::Ready { rank, shapes, initial } => self.ready(rank, shapes, initial)?,
            ToCoordinator::Final { rank, state, capture } => {
                if let Phase::Finishing { finals, parts, .. } = &mut self.phase {
                    if let Some(slot) = finals.get_mut(rank) {
                        *slot = Some(state);
                    }
                    if let Some(slot) = parts.get_mut(rank) {
                        *slot = capture.map(|c| *c);
                    }
                }
            }
            ToCoordinator::ChunkDone { rank, chunk, work } => {
                if let Some(at) = self.epochs.reported.get_mut(rank) {
                    *at = Some(Instant::now());
                }
                if self.dispatch.complete(rank, &chunk, &WorkTally::from(work), Instant::now())
                    && let Some(slot) = self.slots.get_mut(rank)
                {
                    slot.in_flight = slot.in_flight.saturating_sub(1);
                }
                self.aggregate();
            }
            ToCoordinator::Progress { rank, round, steps, wall_ms, why, works } => {
                let current_round = self.rounds.round;
                if let Some(slot) = self.slots.get_mut(rank) {
                    let current = why == Readiness::Reached || works == slot.works_sent;
                    if steps > 0 {
                        slot.pace.add(wall_ms, steps);
                    }
                    if round == current_round && current {
                        slot.ready = Some(Ready { steps, wall_ms, why });
                    }
                }
                if round == current_round && why == Readiness::Reached {
                    self.anchor_ready(rank)?;
                }
            }
            ToCoordinator::Reduced { rank, round, steps, sync_ms, divergence, capture } => {
                self.take_capture(rank, round, capture);
                if let Reduce::Collective { round: r, acks, .. } = &mut self.reduce
                    && *r == round
                    && let Some(slot) = acks.get_mut(rank)
                {
                    *slot = Some((steps, sync_ms, divergence));
                }
                let generation = self.group.generation;
                self.group.left(&mut self.slots, rank, generation, false);
                self.check_collective_done()?;
            }
            ToCoordinator::Snapshot { rank, round, attempt, state, steps, capture } => {
                self.take_capture(rank, round, capture);
                if let Reduce::Host(hr) = &mut self.reduce
                    && let Some(job) = hr.collect(rank, round, attempt, state, steps)
                {
                    self.start_average(job)?;
                }
            }
            ToCoordinator::Evaluated { epoch, eval, .. } => {
                self.eval = Evaluation::Idle;
                for h in self.epochs.held.iter_mut() {
                    if h.awaiting_eval && h.metrics.epoch <= epoch {
                        h.metrics.eval = eval;
                        h.awaiting_eval = false;
                    }
                }
                self.emit_ready();
            }
            ToCoordinator::Diverged { rank, step, cause } => {
                // No fault of the rank: every rank would die of it in turn. The run stops,
                // keeping its last good bundle.
                let bundle = self.save_failure_bundle(SaveReason::Diverged);
                return Err(Error::Diverged { rank, step, cause, bundle });
            }
            ToCoordinator::Failed { rank, failure } => {
                if matches!(self.phase, Phase::Starting { .. }) {
                    return Err(Error::at_start(rank, failure));
                }
                let cause = match failure.kind {
                    crate::FailureKind::Panicked => {
                        FaultCause::Panicked { message: failure.message.to_string() }
                    }
                    _ => FaultCause::Failed { error: failure.message.to_string() },
                };
                self.rank_died(rank, cause, failure)?;
            }
            ToCoordinator::Reducing { rank, round } => {
                if matches!(self.reduce, Reduce::Collective { round: r, .. } if r == round)
                    && let Some(slot) = self.slots.get_mut(rank)
                {
                    slot.collective = InCollective::Inside(Instant::now());
                }
            }
            ToCoordinator::ReduceFailed { rank, round, generation, error } => {
                tracing::warn!(rank, round, generation, %error, "a rank's collective failed");
                self.group.left(&mut self.slots, rank, generation, true);
                self.check_futile_reduce()?;
            }
            ToCoordinator::Joining { rank, generation } => {
                if generation == self.group.generation
                    && let Some(slot) = self.slots.get_mut(rank)
                {
                    // Silent while the group forms: judged like a rank inside a collective.
                    slot.collective = InCollective::Inside(Instant::now());
                }
            }
            ToCoordinator::Joined { rank, generation } => {
                if generation == self.group.generation {
                    self.group.left(&mut self.slots, rank, generation, false);
                }
            }
            ToCoordinator::GroupId { rank, generation, how } => {
                for (to, order) in self.formation.on_id(rank, generation, how) {
                    self.send(to, order)?;
                }
            }
        }
        Ok(())
    }

    /// A rank's replica is built: its shapes must agree with the others'.
    fn ready(
        &mut self,
        rank: usize,
        shapes: Vec<Vec<usize>>,
        init: Option<HostState>,
    ) -> Result<()> {
        let Phase::Starting { initial, .. } = &mut self.phase else { return Ok(()) };
        if self.shapes.is_empty() {
            self.shapes = shapes;
        } else if self.shapes != shapes {
            return Err(Error::mismatch(
                "parameter shapes",
                format!("{:?} (rank 0's)", self.shapes),
                format!("{shapes:?}"),
            )
            .on_rank(rank));
        }
        if init.is_some() {
            *initial = init;
        }
        if let Some(slot) = self.slots.get_mut(rank) {
            slot.standing = Standing::Alive;
        }
        Ok(())
    }

    /// The window `rank` starts training in.
    fn first_window(&self, rank: usize) -> Window {
        self.slots
            .get(rank)
            .map_or(Window { round: 1, target: 1, limit: 1, wall: None }, |s| s.window)
    }

    /// Every replica is built: checks a resumed bundle against them and sends the initial
    /// weights (rank 0's, or the bundle's consensus) to every rank that needs them.
    fn start_training(&mut self) -> Result<()> {
        let Phase::Starting { initial, .. } = std::mem::replace(&mut self.phase, Phase::Training)
        else {
            return Ok(());
        };
        let initial = initial.ok_or(Error::PeerGone(Peer::Rank(0)))?;
        let mut inits = Vec::with_capacity(self.cfg.world());
        if let Some(resumed) = self.saves.resumed.clone() {
            let n = initial.params.len();
            let found = resumed.bundle.signature();
            signature(&self.shapes[..n.min(self.shapes.len())]).check(&found)?;
            if resumed.consensus.buffers.len() != initial.buffers.len() {
                return Err(Error::mismatch(
                    "buffers",
                    format!("{} (the checkpoint's)", resumed.consensus.buffers.len()),
                    initial.buffers.len(),
                ));
            }
            if self.cfg.spec.backend == Backend::Host {
                self.consensus = Some(resumed.consensus.clone());
            }
            for rank in self.slots.live_ranks() {
                let restore = resumed.ranks.get(rank).cloned().map(Box::new);
                let state = resumed.consensus.clone();
                let window = self.first_window(rank);
                let global_step = self.rounds.global_step;
                inits.push((rank, ToWorker::Init { state, restore, window, global_step }));
            }
        } else {
            if self.cfg.checkpoints.is_some() {
                self.saves.last_bundle = Some(self.starting_bundle(&initial)?);
            }
            if self.cfg.spec.backend == Backend::Host {
                self.consensus = Some(initial.clone());
            }
            // Rank 0 trains from its own replica, which is the initial state; in its own
            // process (the controller kept apart) it still needs its first window.
            let apart = self.cfg.spec.controller_apart();
            for rank in self.slots.live_ranks().into_iter().filter(|&r| apart || r != 0) {
                let state = initial.clone();
                let window = self.first_window(rank);
                inits.push((rank, ToWorker::Init { state, restore: None, window, global_step: 0 }));
            }
        }
        if self.group.relay {
            // The first group forms through the coordinator before the ranks train.
            let members = self.slots.live_ranks();
            if let Some((maker, ask)) = self.formation.ask(0, &members, inits) {
                tracing::info!(maker, "asking the lowest rank for the first group's id");
                self.send(maker, ask)?;
            }
        } else {
            for (rank, msg) in inits {
                self.send(rank, msg)?;
            }
        }
        let _ = self.outlets.started.try_send(());
        let now = Instant::now();
        self.slots.iter_mut().for_each(|s| s.heard = now);
        self.clock.train_start = Some(now);
        Ok(())
    }

    /// The watchdog: declares dead a rank silent past the deadline while not inside a
    /// collective; one that has not entered a reduce pending past the deadline; one still
    /// inside a reduce a quarter of the deadline after its peers' collectives failed (they
    /// waited the deadline for it); and, as a backstop, one inside its collective for twice the
    /// deadline and a half. Pings quiet ranks.
    ///
    /// # Errors
    /// As [`rank_died`](Self::rank_died); [`Error::Unrecoverable`] when a reduce stays pending
    /// for [`STALLED_REDUCE`] deadlines with every rank alive.
    fn check_liveness(&mut self) -> Result<()> {
        let after = self.cfg.spec.watchdog;
        let pending = match &self.reduce {
            Reduce::Collective { round, acks, .. } => {
                self.group.pending_for().map(|d| (d, acks, *round))
            }
            _ => None,
        };
        let peers_gave_up = self.group.failing_for().is_some_and(|d| d > after / 4);
        let mut deaths = Vec::new();
        for rank in self.slots.live_ranks() {
            let Some(slot) = self.slots.get(rank) else { continue };
            let silent = slot.heard.elapsed();
            let cause = match slot.collective {
                InCollective::Inside(since)
                    if peers_gave_up || since.elapsed() > after.saturating_mul(2) + after / 2 =>
                {
                    let round = pending.map_or(0, |p| p.2);
                    Some(FaultCause::StuckInReduce { round, after: since.elapsed() })
                }
                InCollective::Inside(_) => None,
                collective => match pending {
                    Some((waited, acks, round))
                        if waited > after
                            && acks.get(rank).is_some_and(Option::is_none)
                            && collective != InCollective::Failed =>
                    {
                        Some(FaultCause::MissedReduce { round, after: waited })
                    }
                    _ => (silent > after).then_some(FaultCause::Silent { after: silent }),
                },
            };
            if let Some(cause) = cause {
                deaths.push((rank, cause, silent));
            }
        }
        for (rank, cause, silent) in deaths {
            let failure =
                RankFailure::from(&Error::Timeout { what: "the rank's reports", after: silent });
            self.rank_died(rank, cause, failure)?;
        }
        if let Some(waited) = self.group.pending_for()
            && waited > after.saturating_mul(STALLED_REDUCE)
        {
            // Every rank alive and answering, yet the reduce does not complete: no one to
            // blame, nothing to wait for.
            let reason = SaveReason::ReduceStall;
            let bundle = self.save_failure_bundle(reason.clone());
            let detail = format!("a reduce has been pending for {waited:?} with no rank to blame");
            return Err(Error::Unrecoverable { reason, detail, bundle, last: None });
        }
        let beat = self.cfg.heartbeat();
        let mut heard = self.slots.live_ranks();
        heard.extend(self.slots.joining());
        for rank in heard {
            let Some(slot) = self.slots.get_mut(rank) else { continue };
            if slot.sent.elapsed() >= beat {
                slot.sent = Instant::now();
                // A full queue holds messages already: the rank hears from us anyway.
                let _ = self.link.try_send(rank, ToWorker::Ping);
                tracing::trace!(rank, "ping");
            }
        }
        Ok(())
    }

    /// ElChe's batches per window of each rank (1 each without ElChe), and whether they are
    /// calibrated (measured or hinted): what chunks are sized by.
    fn dispatch_counts(&self) -> (Vec<usize>, bool) {
        let counts: Vec<usize> = match &self.cadence.elche {
            Some(e) => e.counts().to_vec(),
            None => vec![1; self.cfg.world()],
        };
        let calibrated =
            self.cadence.elche.as_ref().is_some_and(|e| e.is_calibrated() || e.has_speed_hint());
        (counts, calibrated)
    }

    /// Sends each of `ranks` its stage advisory, when the run stages: the chunks it holds, then
    /// a forecast of what it will be handed, an epoch's batches in all. An advisory that does
    /// not fit a full queue is dropped (the next one replaces it anyway).
    fn advise(&mut self, ranks: &[usize]) {
        if !self.cfg.spec.staging.advises() {
            return;
        }
        let (counts, calibrated) = self.dispatch_counts();
        let horizon = self.cfg.batches_per_epoch();
        for &rank in ranks {
            if !self.slots.is_live(rank) {
                continue;
            }
            let chunks = self.dispatch.forecast(rank, &counts, calibrated, horizon);
            tracing::trace!(rank, chunks = chunks.len(), "stage advisory");
            let _ = self.link.try_send(rank, ToWorker::Stage { chunks });
        }
    }

    /// Tops up every rank's chunks, and sends the ranks handed one their new stage advisory.
    fn dispatch_all(&mut self) -> Result<()> {
        let (counts, calibrated) = self.dispatch_counts();
        let mut handed = Vec::new();
        // In the last epoch a queued chunk could leave a peer idle at the end of the run: each
        // rank then holds one chunk at a time (chunks are sized to its share of what is left).
        let ahead = if self.dispatch.in_last_epoch() { 1 } else { CHUNKS_AHEAD };
        for rank in self.slots.live_ranks() {
            while self.slots.get(rank).is_some_and(|s| s.in_flight < ahead) {
                let Some(chunk) =
                    self.dispatch.next_chunk(rank, &counts, calibrated, Instant::now())
                else {
                    break;
                };
                self.send(rank, ToWorker::Work(chunk))?;
                if handed.last() != Some(&rank) {
                    handed.push(rank);
                }
                if let Some(slot) = self.slots.get_mut(rank) {
                    slot.in_flight += 1;
                    slot.works_sent += 1;
                    if slot.ready.is_some_and(|r| r.why == Readiness::Idle) {
                        slot.ready = None;
                    }
                }
            }
        }
        self.advise(&handed);
        Ok(())
    }

    /// Moves complete epochs to the held queue and emits those that need nothing more.
    fn aggregate(&mut self) {
        while let Some((epoch, mut tally, ms)) = self.dispatch.pop_complete() {
            let last = self.dispatch.all_done();
            if last {
                let end = Instant::now();
                self.clock.train_end = Some(end);
                for rank in self.slots.live_ranks() {
                    if let Some(Some(at)) = self.epochs.reported.get(rank) {
                        let ms = end.saturating_duration_since(*at).as_secs_f64() * 1000.0;
                        tally.add_time(rank, Activity::Waiting, ms);
                    }
                }
            }
            let mut metrics = tally.finish(epoch, ms, &self.devices);
            metrics.at_ms = self.clock.at_ms();
            let awaiting_eval = self.cfg.evaluates(epoch);
            self.epochs.held.push_back(Held { metrics, awaiting_eval });
        }
        self.emit_ready();
    }

    fn emit_ready(&mut self) {
        while self.epochs.held.front().is_some_and(|h| !h.awaiting_eval) {
            if let Some(h) = self.epochs.held.pop_front() {
                tracing::info!(epoch = h.metrics.epoch, loss = h.metrics.avg_loss, "epoch done");
                if let Some(callback) = &self.cfg.on_epoch {
                    callback(&h.metrics);
                }
                // Capacity is the number of epochs: this never drops.
                let _ = self.outlets.epochs.try_send(h.metrics.clone());
                self.epochs.emitted.push(h.metrics);
            }
        }
    }

    /// The newest held epoch that waits for an evaluation not yet requested.
    fn take_eval_request(&mut self) -> Option<usize> {
        if self.eval != Evaluation::Idle {
            return None;
        }
        let epoch =
            self.epochs.held.iter().filter(|h| h.awaiting_eval).map(|h| h.metrics.epoch).max()?;
        let elected = self.elect_evaluator();
        tracing::debug!(epoch, rank = ?elected, "evaluation requested");
        self.eval = Evaluation::Asked(elected);
        Some(epoch)
    }

    /// The live rank that evaluates now, by the run's [`crate::EvalRank`] rule, from each
    /// rank's pace over its recent batches. (Not ElChe's estimate, a mean of per-window
    /// readings: a `Cadence` follower's window may be a few batches, which one preempted batch
    /// slows as much as the anchor's, and the fastest rank then read as slow as the others.)
    fn elect_evaluator(&self) -> Option<usize> {
        let ms: Vec<f64> = self.slots.iter().map(|s| s.pace.ms_per_batch()).collect();
        self.cfg.spec.eval_rank.elect(&self.slots.live_ranks(), &ms)
    }

    /// Starts a reduce when every rank is ready for it; true when nothing is left to train
    /// (the run finishes).
    fn step_reduce(&mut self) -> Result<bool> {
        let ready: Vec<Option<usize>> =
            self.slots.iter().map(|s| s.ready.map(|r| r.steps)).collect();
        let live: Vec<bool> = (0..ready.len()).map(|r| self.slots.is_live(r)).collect();
        let busy = !matches!(self.reduce, Reduce::Idle);
        match should_reduce(&ready, &live, busy)? {
            Trigger::Fire => {
                let steps: Vec<usize> = ready.iter().map(|s| s.unwrap_or(0)).collect();
                self.trigger(&steps)?;
                return Ok(false);
            }
            Trigger::Idle => {}
            Trigger::RoundInFlight | Trigger::NoLiveRank | Trigger::Waiting { .. } => {
                return Ok(false);
            }
        }
        if !self.dispatch.all_done() || self.dispatch.any_outstanding() {
            return Ok(false);
        }
        if !self.epochs.held.is_empty() {
            if let Some(epoch) = self.take_eval_request()
                && let Some(rank) = self.eval.rank()
            {
                self.send(rank, ToWorker::Evaluate { epoch })?;
            }
            return Ok(false);
        }
        Ok(true)
    }

    fn trigger(&mut self, steps: &[usize]) -> Result<()> {
        let walls: Vec<f64> =
            self.slots.iter().map(|s| s.ready.map_or(0.0, |r| r.wall_ms)).collect();
        let steps64: Vec<u64> = steps.iter().map(|&s| s as u64).collect();
        let counts = self.planned_counts();
        if let Some(e) = self.cadence.elche.as_mut() {
            e.report_timing(&walls, &steps64, self.rounds.last_sync_ms)?;
            // The guard's verdict on the last completed reduce.
            e.apply_verdict(std::mem::replace(&mut self.cadence.verdict, Verdict::Stable));
        }
        self.rounds.global_step += steps.iter().sum::<usize>() as u64;
        let global_step = self.rounds.global_step;
        let ending = self.rounds.round;
        let joiners = match self.cfg.spec.backend {
            Backend::Collective => self.admit_joiners(ending)?,
            Backend::Host => Vec::new(),
        };
        self.rounds.round += 1;
        let next = self.make_windows(self.rounds.round);
        let eval = self.take_eval_request();
        for slot in self.slots.iter_mut() {
            slot.ready = None;
        }
        let started = Instant::now();
        tracing::debug!(round = ending, "reduce started");
        let capture = self.save_due();
        if let Some(reason) = capture.clone() {
            tracing::debug!(round = ending, ?reason, "checkpoint at this reduce");
            self.saves.capturing = Some(Capturing {
                round: ending,
                reason,
                stop: std::mem::take(&mut self.saves.stop_after_save),
                global_step,
                parts: vec![None; self.cfg.world()],
            });
        }
        let lowest = self.slots.lowest();
        let evaluator = self.eval.rank();
        match self.cfg.spec.backend {
            Backend::Collective => {
                let mut orders = joiners;
                let joining = orders.len();
                for rank in self.slots.live_ranks() {
                    let eval = if Some(rank) == evaluator { eval } else { None };
                    let window = next[rank];
                    let model = Some(rank) == lowest;
                    let capture = capture.as_ref().map(|_| CaptureRequest { model });
                    let msg = ToWorker::Reduce { next: window, eval, global_step, capture };
                    orders.push((rank, msg));
                }
                if joining == 0 {
                    for (rank, msg) in orders {
                        self.send(rank, msg)?;
                    }
                } else {
                    // The joiners take part in this reduce: a group with them as members forms
                    // first, through the coordinator, and the orders follow it.
                    let members = self.slots.live_ranks();
                    let generation = self.group.next_generation(&mut self.slots);
                    tracing::info!(generation, ?members, "a group with the joining ranks forms");
                    if let Some((maker, ask)) = self.formation.ask(generation, &members, orders) {
                        self.send(maker, ask)?;
                    }
                }
                let acks = vec![None; self.cfg.world()];
                self.reduce = Reduce::Collective { round: ending, acks, counts };
                self.group.reduce_called();
            }
            Backend::Host => {
                let capture = capture.as_ref().map(|_| CaptureRequest { model: false });
                for rank in self.slots.live_ranks() {
                    self.send(rank, ToWorker::Snapshot { round: ending, attempt: 0, capture })?;
                }
                let deadline = started + self.cfg.spec.snapshot_timeout;
                let mut round =
                    HostRound::new(ending, self.cfg.world(), deadline, next.clone(), eval, counts);
                for rank in (0..self.cfg.world()).filter(|&r| !self.slots.is_live(r)) {
                    // Nothing collected yet, so this completes nothing.
                    let _ = round.retire(rank);
                }
                self.reduce = Reduce::Host(round);
            }
        }
        for (slot, w) in self.slots.iter_mut().zip(next) {
            slot.window = w;
        }
        Ok(())
    }

    /// Host backend: the helper thread's average for `round` is in. When it completes the
    /// pending round: the outer step, the checkpoint in capture, and the update to every rank.
    fn averaged(
        &mut self,
        round: u64,
        state: Result<HostState>,
        divergence: Option<f64>,
    ) -> Result<()> {
        let Reduce::Host(hr) = &mut self.reduce else { return Ok(()) };
        let Some(done) = hr.averaged(round) else { return Ok(()) };
        let mut state = state?;
        self.outer_step(&mut state)?;
        // The ranks are paused since their snapshots: the book is at the cut.
        if self.saves.capturing.as_ref().is_some_and(|c| c.round == done.round) {
            // The reduce is completed below: it counts in the bundle.
            self.finish_capture(Some(&state), self.rounds.reduces + 1)?;
        }
        let evaluator = self.eval.rank();
        let global_step = self.rounds.global_step;
        for rank in self.slots.live_ranks() {
            let eval = if Some(rank) == evaluator { done.eval } else { None };
            let next = done.next[rank];
            let state = state.clone();
            self.send(rank, ToWorker::Update { state, next, eval, global_step })?;
        }
        let sync_ms = done.started.elapsed().as_secs_f64() * 1000.0;
        self.complete_reduce(done.round, done.counts, done.steps, sync_ms, divergence);
        self.admit_waiting(&state)?;
        self.consensus = Some(state);
        Ok(())
    }

    /// Host backend: replaces the average's parameters by the outer optimizer's step on them
    /// (a no-op for plain averaging).
    fn outer_step(&mut self, state: &mut HostState) -> Result<()> {
        if matches!(self.outer.optimizer.kind(), OuterKind::Average) {
            return Ok(());
        }
        let cpu = &self.outer.cpu;
        let mut tensors = state
            .params
            .iter()
            .map(|v| Tensor::from_slice(v, &[v.len()], cpu))
            .collect::<flodl_tensor::Result<Vec<_>>>()?;
        self.outer.optimizer.step(&mut tensors, cpu)?;
        for (v, t) in state.params.iter_mut().zip(&tensors) {
            t.copy_to_host(v, cpu)?;
        }
        Ok(())
    }

    /// Soft-aborts a host round whose snapshots are late and asks again.
    fn check_host_deadline(&mut self) -> Result<()> {
        let Reduce::Host(hr) = &mut self.reduce else { return Ok(()) };
        let missing = hr.missing();
        let age = hr.age();
        let Some((round, attempt)) = hr.retry_if_late(self.cfg.spec.snapshot_timeout) else {
            return Ok(());
        };
        self.rounds.stalled += 1;
        tracing::warn!(
            round,
            attempt,
            "host averaging round missed its snapshot deadline; retrying"
        );
        if self.rounds.stalled >= self.cfg.spec.max_stalled_rounds {
            if !missing.is_empty() && missing.len() < self.slots.live_ranks().len() {
                // The ranks that never answered are stuck: the others go on without them.
                let after = age.map_or(Duration::ZERO, |(_, d)| d);
                self.rounds.stalled = 0;
                for rank in missing {
                    let failure =
                        RankFailure::from(&Error::Timeout { what: "the rank's snapshot", after });
                    self.rank_died(rank, FaultCause::MissedReduce { round, after }, failure)?;
                }
            } else {
                return Err(Error::ReduceStalled { attempts: self.rounds.stalled });
            }
        }
        let capture = self
            .saves
            .capturing
            .as_ref()
            .filter(|c| c.round == round)
            .map(|_| CaptureRequest { model: false });
        for rank in self.slots.live_ranks() {
            self.send(rank, ToWorker::Snapshot { round, attempt, capture })?;
        }
        Ok(())
    }

    fn complete_reduce(
        &mut self,
        round: u64,
        counts: Vec<usize>,
        steps: Vec<usize>,
        sync_ms: f64,
        divergence: Option<f64>,
    ) {
        self.reduce = Reduce::Idle;
        self.group.reduce_done(&mut self.slots);
        let cadence = &mut self.cadence;
        if let Some(divergence) = divergence {
            let k_max = steps.iter().copied().max().unwrap_or(0) as u64;
            let verdict = cadence.guard.report(&ReduceReport { divergence, k_max });
            cadence.verdict = verdict;
            tracing::debug!(round, divergence, ?verdict, "divergence guard");
            let _ = self.outlets.guards.try_send(GuardEvent { round, divergence, k_max, verdict });
        }
        if self.cfg.spec.policy == Policy::Async {
            // Stable grows an auto bound, NudgeDown resets it; a guard that is off reads Stable,
            // a reduce it did not measure holds the bound.
            match (divergence, &cadence.guard) {
                (Some(_), _) => cadence.overshoot.apply_verdict(cadence.verdict),
                (None, Guard::Off) => cadence.overshoot.apply_verdict(Verdict::Stable),
                (None, _) => {}
            }
        }
        self.rounds.stalled = 0;
        self.rounds.reduces += 1;
        self.rounds.last_sync_ms = sync_ms;
        self.dispatch.add_reduce(sync_ms, &steps);
        let event = ReduceEvent {
            round,
            epoch: self.dispatch.oldest().min(self.cfg.spec.epochs.saturating_sub(1)),
            at_ms: self.clock.at_ms(),
            anchor: self.cadence.elche.as_ref().map_or(1, ElChe::anchor),
            counts,
            steps,
            sync_ms,
        };
        tracing::debug!(round, sync_ms, "reduce done");
        // Dropped when the handle does not drain its queue: events are for reports only.
        let _ = self.outlets.reduces.try_send(event);
    }

    /// Tells every live rank to finish.
    fn start_finishing(&mut self) -> Result<()> {
        let capture = self.cfg.checkpoints.is_some();
        for rank in self.slots.joining() {
            // Nothing is left to join: the process ends.
            tracing::info!(rank, "the run finishes before rank {rank} could join again");
            let _ = self.link.try_send(rank, ToWorker::Stop);
            self.slots.set_joining(rank, Standing::Dead);
        }
        for rank in self.slots.live_ranks() {
            self.send(rank, ToWorker::Finish { capture })?;
        }
        let world = self.cfg.world();
        self.phase = Phase::Finishing {
            deadline: Instant::now() + self.cfg.spec.stall_timeout,
            finals: vec![None; world],
            parts: vec![None; world],
        };
        Ok(())
    }

    /// Every live rank sent its final state: saves the end of the run and returns the lowest
    /// live rank's state.
    fn conclude(&mut self) -> Result<TrainedState> {
        let Phase::Finishing { mut finals, parts, .. } =
            std::mem::replace(&mut self.phase, Phase::Training)
        else {
            return Err(Error::protocol("the run concluded before it finished"));
        };
        let lowest = self.slots.lowest().ok_or(Error::PeerGone(Peer::EveryRank))?;
        let state = finals.swap_remove(lowest).ok_or(Error::PeerGone(Peer::Rank(lowest)))?;
        if let Some(plan) = &self.cfg.checkpoints {
            let outer = match self.cfg.spec.backend {
                Backend::Host => outer_state(&self.outer.optimizer, &self.outer.cpu)?,
                Backend::Collective => None,
            };
            let progress = Progress {
                reason: SaveReason::GracefulShutdown,
                global_step: self.rounds.global_step,
                epoch: self.cfg.spec.epochs,
                reduces: self.rounds.reduces,
                elche: self.cadence.elche.as_ref().map(ElChe::state),
                guard: &self.cadence.guard,
                epochs: &self.epochs.emitted,
                coverage: Vec::new(),
            };
            let ckpt = assemble(&self.cfg, &self.shapes, &parts, Some(&state), outer, progress)?;
            save(plan, &ckpt, None)?;
        }
        let wall_ms = self.clock.at_ms();
        let train_ms = match (self.clock.train_start, self.clock.train_end) {
            (Some(s), Some(e)) => e.saturating_duration_since(s).as_secs_f64() * 1000.0,
            _ => wall_ms,
        };
        let epochs = std::mem::take(&mut self.epochs.emitted);
        let faults = std::mem::take(&mut self.faults);
        let rejoins = std::mem::take(&mut self.rejoins);
        let mut trained = trained_state(
            &self.shapes,
            state,
            epochs,
            self.rounds.reduces,
            wall_ms,
            train_ms,
            faults,
        )?;
        trained.rejoins = rejoins;
        Ok(trained)
    }

    /// Why a checkpoint is due at the reduce being started, if one is.
    fn save_due(&mut self) -> Option<SaveReason> {
        let plan = self.cfg.checkpoints.as_ref()?;
        if let Some(stop) = self.outlets.save_now.take() {
            self.saves.stop_after_save = stop;
            return Some(SaveReason::OnDemand);
        }
        let epochs_done = self.dispatch.oldest();
        let epoch_due = epochs_done > self.saves.epochs_saved
            && plan.interval.due_after_epoch(epochs_done as u64);
        (epoch_due || plan.interval.due_after_reduce(self.rounds.reduces + 1))
            .then_some(SaveReason::Periodic)
    }

    /// The run's starting state as a bundle (what a failure before the first save keeps).
    fn starting_bundle(&self, initial: &HostState) -> Result<Checkpoint> {
        let progress = Progress {
            reason: SaveReason::Periodic,
            global_step: 0,
            epoch: 0,
            reduces: 0,
            elche: self.cadence.elche.as_ref().map(ElChe::state),
            guard: &self.cadence.guard,
            epochs: &[],
            coverage: Vec::new(),
        };
        let parts = vec![None; self.cfg.world()];
        assemble(&self.cfg, &self.shapes, &parts, Some(initial), None, progress)
    }

    /// Keeps a rank's checkpoint part for the capture of `round`.
    fn take_capture(&mut self, rank: usize, round: u64, part: Option<Box<RankCapture>>) {
        if let (Some(c), Some(part)) = (self.saves.capturing.as_mut(), part)
            && c.round == round
            && let Some(slot) = c.parts.get_mut(rank)
        {
            *slot = Some(*part);
        }
    }

    /// Assembles and saves the checkpoint in capture (the host backend passes the consensus it
    /// averaged, after the outer step) as of `reduces` completed reduces; the book must be at
    /// the cut (every rank paused).
    fn finish_capture(&mut self, consensus: Option<&HostState>, reduces: u64) -> Result<()> {
        let (Some(c), Some(plan)) = (self.saves.capturing.take(), self.cfg.checkpoints.as_ref())
        else {
            return Ok(());
        };
        let partial = partial_ranges(&c.parts, self.cfg.spec.batch_size);
        let coverage = self.dispatch.coverage(&partial, self.cfg.spec.seed)?;
        let outer = match self.cfg.spec.backend {
            Backend::Host => outer_state(&self.outer.optimizer, &self.outer.cpu)?,
            Backend::Collective => None,
        };
        let mut epochs = self.epochs.emitted.clone();
        epochs.extend(self.epochs.held.iter().map(|h| h.metrics.clone()));
        let epoch = self.dispatch.oldest();
        let progress = Progress {
            reason: c.reason,
            global_step: c.global_step,
            epoch,
            reduces,
            elche: self.cadence.elche.as_ref().map(ElChe::state),
            guard: &self.cadence.guard,
            epochs: &epochs,
            coverage,
        };
        let ckpt = assemble(&self.cfg, &self.shapes, &c.parts, consensus, outer, progress)?;
        let bundle = save(plan, &ckpt, None)?;
        self.saves.epochs_saved = self.saves.epochs_saved.max(epoch);
        self.saves.last_bundle = Some(ckpt);
        if c.stop {
            tracing::info!(path = %bundle.display(), "stopping at a checkpoint, as asked");
            return Err(Error::Stopped { bundle });
        }
        Ok(())
    }

    /// Host backend: averages `job` on a helper thread, which reports
    /// [`Local::Averaged`]. When none of the ranks left in the round stepped (the one that did
    /// died), their snapshots are averaged equally.
    fn start_average(&mut self, mut job: AverageJob) -> Result<()> {
        if job.steps.iter().all(|&s| s == 0) {
            job.steps.iter_mut().for_each(|s| *s = 1);
        }
        let tx = self.local.clone();
        let gamma = self.cfg.spec.gamma;
        let measure = self.cfg.measures_divergence();
        std::thread::Builder::new()
            .name("flodl-host-average".into())
            .spawn(move || {
                let state = average(&job.states, &job.steps, gamma);
                let divergence = match &state {
                    Ok(avg) if measure => Some(divergence(&job.states, &job.steps, avg)),
                    _ => None,
                };
                let round = job.round;
                let _ = tx.send(Inbound::Local(Local::Averaged { round, state, divergence }));
            })
            .map_err(|source| Error::Spawn { what: "the averaging thread", source })?;
        Ok(())
    }

    /// The membership authority: declares `rank` dead for `cause` (`failure` is what the run
    /// returns, as [`Error::Rank`], if this death ends it) and lets the survivors go on: its
    /// unfinished chunks go back to the living, ElChe retires it, a host round stops waiting
    /// for it, and a collective group is aborted and rebuilt from the survivors, who redo an
    /// interrupted reduce.
    ///
    /// # Errors
    /// The rank's failure past the failure limit; [`Error::Unrecoverable`] when no rank is left,
    /// or a lone survivor of an NCCL group.
    fn rank_died(&mut self, rank: usize, cause: FaultCause, failure: RankFailure) -> Result<()> {
        if !self.slots.is_live(rank) {
            return Ok(());
        }
        if self.eval.rank() == Some(rank) {
            // Asked again from another live rank.
            self.eval = Evaluation::Idle;
        }
        self.slots.bury(rank);
        let survivors = self.slots.live_ranks();
        tracing::warn!(rank, %cause, ?survivors, "rank declared dead");
        // Its part of a reduce in progress that the consensus holds already counts for it.
        let pending = match &self.reduce {
            Reduce::Collective { acks, .. } => acks.get(rank).copied().flatten().map_or(0, |a| a.0),
            Reduce::Host(hr) => hr.averaging_steps(rank),
            Reduce::Idle => 0,
        };
        let requeued = self.dispatch.retire(rank, pending, Instant::now());
        let requeued_samples = requeued.iter().map(|c| c.len).sum();
        tracing::debug!(
            rank,
            chunks = requeued.len(),
            requeued_samples,
            "the dead rank's unfinished chunks re-queued"
        );
        let event = FaultEvent {
            rank,
            at_ms: self.clock.at_ms(),
            cause: cause.clone(),
            survivors: survivors.clone(),
            requeued_samples,
        };
        self.faults.push(event.clone());
        // Dropped when the handle does not drain its queue.
        let _ = self.outlets.faults.try_send(event);
        // A rank stuck in its replica reads this when (if) it returns.
        let _ = self.link.try_send(rank, ToWorker::Stop);
        let lone_nccl = self.group.engine == Engine::Nccl && survivors.len() == 1;
        let error = Error::Rank { rank, failure };
        if self.slots.deaths() > self.cfg.spec.max_failures {
            self.save_failure_bundle(SaveReason::MaxFailureExceeded);
            return Err(error);
        }
        if self.group.engine == Engine::Mpi {
            let detail = format!("rank {rank} {cause}; {}", self.work_lost());
            tracing::warn!(%detail, "an MPI world cannot shrink: the job ends");
            let reason = SaveReason::Fault { detail: "an MPI world cannot shrink".into() };
            let bundle = self.save_failure_bundle(reason.clone());
            let last = Some(Box::new(error));
            return Err(Error::Unrecoverable { reason, detail, bundle, last });
        }
        if survivors.is_empty() || lone_nccl {
            let reason = if survivors.is_empty() {
                SaveReason::AllRanksLost
            } else {
                SaveReason::SingleSurvivor
            };
            let bundle = self.save_failure_bundle(reason.clone());
            let detail = match survivors.first() {
                None => format!("rank {rank}, the last one alive, {cause}"),
                Some(lone) => format!(
                    "rank {rank} {cause}; rank {lone} is the lone survivor of an NCCL group"
                ),
            };
            let last = Some(Box::new(error));
            return Err(Error::Unrecoverable { reason, detail, bundle, last });
        }
        if let Some(e) = self.cadence.elche.as_mut() {
            e.retire(rank)?;
        }
        // What the survivors will be handed changed: the dead rank's work is theirs now.
        self.advise(&survivors);
        match self.cfg.spec.backend {
            Backend::Collective => self.regroup(&survivors)?,
            Backend::Host => {
                if let Reduce::Host(hr) = &mut self.reduce
                    && let Some(job) = hr.retire(rank)
                {
                    self.start_average(job)?;
                }
            }
        }
        self.check_collective_done()?;
        Ok(())
    }

    /// Collective backend: orders the current group aborted (waking anyone blocked in it, the
    /// dead included) and tells `members` to form the next one.
    fn regroup(&mut self, members: &[usize]) -> Result<()> {
        let old = self.group.generation;
        for rank in 0..self.slots.world() {
            let _ = self.link.try_send(rank, ToWorker::AbortGroup { generation: old });
        }
        let generation = self.group.next_generation(&mut self.slots);
        if self.group.relay {
            tracing::info!(
                generation,
                ?members,
                "regrouping the collective through its lowest rank"
            );
            if let Some((maker, ask)) = self.formation.ask(generation, members, Vec::new()) {
                self.send(maker, ask)?;
            }
            return Ok(());
        }
        let how = self.regroup_how()?;
        tracing::info!(generation, ?members, "regrouping the collective");
        for &rank in members {
            let msg = ToWorker::Regroup { generation, members: members.to_vec(), how: how.clone() };
            self.send(rank, msg)?;
        }
        Ok(())
    }

    /// How the next collective group is built: a shrunk host group, or a new NCCL group named
    /// by a fresh id.
    fn regroup_how(&self) -> Result<Regroup> {
        #[cfg(feature = "cuda")]
        if self.group.engine == Engine::Nccl {
            return Ok(Regroup::Nccl(flodl_nccl::UniqueId::new()?));
        }
        Ok(Regroup::Host)
    }

    /// Completes the pending collective reduce once every live rank acknowledged it.
    fn check_collective_done(&mut self) -> Result<()> {
        let mut done = None;
        if let Reduce::Collective { round, acks, counts } = &mut self.reduce {
            let live = self.slots.live_ranks();
            if live.iter().all(|&r| acks.get(r).is_some_and(Option::is_some)) {
                let steps = acks.iter().map(|a| a.map_or(0, |a| a.0)).collect::<Vec<_>>();
                let sync = acks.iter().flatten().map(|a| a.1).fold(0.0, f64::max);
                let div = acks.iter().flatten().filter_map(|a| a.2).reduce(f64::max);
                done = Some((*round, std::mem::take(counts), steps, sync, div));
            }
        }
        if let Some((round, counts, steps, sync, div)) = done {
            self.complete_reduce(round, counts, steps, sync, div);
            if self.saves.capturing.as_ref().is_some_and(|c| c.round == round) {
                // Every live rank is paused since its acknowledgement: the book is at the cut.
                self.finish_capture(None, self.rounds.reduces)?;
                for rank in self.slots.live_ranks() {
                    self.send(rank, ToWorker::Resume)?;
                }
            }
        }
        Ok(())
    }

    /// When every live rank's collective failed with nobody dead (a transient fault), the same
    /// members form a new group and redo the reduce, a few times at most.
    ///
    /// # Errors
    /// [`Error::Unrecoverable`] (a reduce stall) after [`FUTILE_ATTEMPTS`] such attempts.
    fn check_futile_reduce(&mut self) -> Result<()> {
        if !matches!(self.reduce, Reduce::Collective { .. }) || !self.slots.all_failed() {
            return Ok(());
        }
        let attempts = self.group.futile_attempt();
        if attempts > FUTILE_ATTEMPTS {
            let reason = SaveReason::ReduceStall;
            let bundle = self.save_failure_bundle(reason.clone());
            let detail =
                format!("the reduce failed {attempts} times in a row with every rank alive");
            return Err(Error::Unrecoverable { reason, detail, bundle, last: None });
        }
        let members = self.slots.live_ranks();
        self.regroup(&members)
    }

    /// Writes the failure bundle for `reason` (the last bundle this run saved, or its starting
    /// state when it saved none, re-labelled) as `failure.fdlck` next to the step bundles, and
    /// returns its path; `None` when the run has no checkpoint directory or the write fails
    /// (the run's own error is what matters then).
    /// What a job restarted from the last bundle trains again, in words: the reduces and
    /// cohort steps since that bundle, plus the windows in progress (at most one checkpoint
    /// interval when every reduce is saved).
    fn work_lost(&self) -> String {
        let (reduce, step) = match (&self.saves.last_bundle, self.cfg.checkpoints.as_ref()) {
            (Some(b), Some(_)) => (b.reduce_version, b.global_step),
            _ => {
                return format!(
                    "no checkpoint is kept, so a restart trains again from the start \
                     ({} reduce(s), {} step(s) lost)",
                    self.rounds.reduces, self.rounds.global_step
                );
            }
        };
        format!(
            "work lost: {} reduce(s) and {} step(s) since the last bundle (reduce {reduce}, \
             step {step}), plus the windows in progress",
            self.rounds.reduces.saturating_sub(reduce),
            self.rounds.global_step.saturating_sub(step)
        )
    }

    fn save_failure_bundle(&mut self, reason: SaveReason) -> Option<std::path::PathBuf> {
        let plan = self.cfg.checkpoints.as_ref()?;
        let Some(mut ckpt) = self.saves.last_bundle.clone() else {
            tracing::warn!(?reason, "no state to save in a failure bundle");
            return None;
        };
        ckpt.reason = reason;
        match save(plan, &ckpt, Some("failure")) {
            Ok(path) => Some(path),
            Err(e) => {
                tracing::error!(error = %e, "the failure bundle could not be saved");
                None
            }
        }
    }
}

//! The coordinator: one thread that hands out work, decides when to average, runs the host
//! averaging rounds, decides membership and aggregates metrics — one loop over the run's
//! [`Phase`], talking to the ranks only through their link.

mod conduct;
mod drill;
mod inbox;
mod membership;
mod mirroring;
mod reduce;
mod saving;

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flodl_tensor::{Stream, Tensor};

use crate::checkpoint::{Checkpoint, SaveReason};
use crate::control::breakdown::Activity;
use crate::control::change::Change;
use crate::control::deadline::DeadlineRule;
use crate::control::dispatch::{Cutting, Dispatcher};
use crate::control::elche::ElChe;
use crate::control::fragment::Staggered;
use crate::control::guard::{Guard, ReduceReport};
use crate::control::metrics::{EpochMetrics, GuardEvent, ReduceEvent, WorkTally};
use crate::control::outer::{OuterKind, OuterOptimizer};
use crate::control::overshoot::Overshoot;
use crate::control::policy::{Backend, Policy, Trigger, probe_most, should_reduce};
use crate::control::verdict::Verdict;
use crate::error::{Internal, Peer};
use crate::link::failure::RankFailure;
use crate::link::frames::Admitted;
use crate::link::inbound::{Inbox, inbox};
use crate::link::wire::{
    CaptureRequest, RankCapture, Readiness, Regroup, ToCoordinator, ToWorker, Window,
};
use crate::link::{CoordinatorLink, Inbound, LinkError};
use crate::runtime::engine::books::{Applied, Books};
use crate::runtime::engine::capture::{
    Progress, assemble, outer_state, partial_ranges, restore_outer, save, signature,
};
use crate::runtime::engine::comm::{CommPlan, RankComm};
use crate::runtime::engine::fault::{FaultCause, FaultEvent, Misconduct, RankThread, RejoinEvent};
use crate::runtime::engine::formation::Formation;
use crate::runtime::engine::host_round::{
    AverageJob, Headstart, HostRound, Taken, average, average_fragments, divergence,
};
use crate::runtime::engine::outlets::{Outlets, TrainedState, panic_message, trained_state};
use crate::runtime::engine::rank::rank_loop::run_rank;
use crate::runtime::engine::roster::Roster;
use crate::runtime::engine::run_config::{Resumed, RunConfig};
use crate::runtime::engine::scrutiny::check_state;
use crate::runtime::engine::slot::{
    Engine, GroupBook, InCollective, RankSlot, Ready, Slots, Watch,
};
use crate::runtime::engine::trail::{self, Trail};
use crate::state::HostState;
use crate::{Error, Result};

use conduct::Conduct;

/// Capacity of each of the coordinator's two inbox queues (the ranks' messages, its own events).
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
    let remote = &admitted.0;
    let comms = comm_plans(&cfg)?;
    let (inbox, inbox_tx, local) = inbox(INBOX);
    // A cluster controller runs its own rank only; a seat no process has joined is vacant.
    let here: Vec<usize> = match cfg.own {
        Some((own, _)) => vec![own],
        None => (0..world).filter(|r| remote.iter().all(|(x, _)| x != r)).collect(),
    };
    let vacant: Vec<usize> =
        (0..world).filter(|r| !here.contains(r) && remote.iter().all(|(x, _)| x != r)).collect();
    let (link, ends) =
        CoordinatorLink::start(world, &here, admitted, TO_RANK, cfg.spec.wire_cut(), &inbox_tx)?;
    let mut coord = Coordinator::new(cfg.clone(), outlets, inbox, local, link)?;
    coord.conduct = Conduct::new(world, cfg.spec.batch_size, |r| !here.contains(&r));
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
    /// Every rank was told to finish; their final messages come in: `finals[rank]` is `None`
    /// until it came, then the state it carried (when asked for), and its checkpoint part.
    Finishing {
        deadline: Instant,
        finals: Vec<Option<Option<HostState>>>,
        parts: Vec<Option<RankCapture>>,
    },
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
    /// When the last reduce completed (or training started): every rank's window starts there.
    completed_at: Instant,
    /// The bytes of each rank's exchange in the round being collected (for its event).
    wire: Vec<crate::control::metrics::Exchange>,
    /// Each rank's training ms in the window of the round being collected (for its event).
    walls: Vec<f64>,
    /// What the reduce before the window cost each rank, ms (for its event).
    exposed: Vec<Option<f64>>,
    /// The host round's snapshots ordered before its trigger ([`Headstart`]).
    headstart: Option<Headstart>,
    /// The ranks whose snapshot of the round being collected was ordered ahead (for its event).
    ordered_ahead: Vec<usize>,
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
    inbox: Inbox<Local>,
    /// Where the coordinator's own helpers deliver their events.
    local: flume::Sender<Local>,
    link: CoordinatorLink,
    phase: Phase,
    devices: Vec<String>,
    shapes: Vec<Vec<usize>>,
    /// Who is in the run: the only thing that changes it (see `membership.rs`).
    roster: Roster,
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
    /// Host backend under `--fragments`: the cut and each fragment's unsynced steps.
    staggered: Option<Staggered>,
    /// The collective group being formed through the coordinator (ranks in several processes).
    formation: Formation,
    /// What each rank was handed and asked, against which its reports are checked.
    conduct: Conduct,
    /// The exactly-once ledger being written, when the run writes one.
    trail: Option<Trail>,
    /// The lane to the standby controller, when the run has one (`mirroring.rs`).
    standby: Option<crate::runtime::engine::standby::StandbyLane>,
    /// Cluster runs: the lane's frames on their way to the standby rank's process.
    pump: Option<crate::runtime::engine::standby::Pump>,
    /// The failover drill asked of this controller, if any (`drill.rs`).
    drill: Option<drill::Drill>,
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
        inbox: Inbox<Local>,
        local: flume::Sender<Local>,
        link: CoordinatorLink,
    ) -> Result<Self> {
        let world = cfg.world();
        let batches = cfg.batches_per_epoch();
        let batch_size = cfg.spec.batch_size;
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
        let slots = Slots::new(placeholder);
        let roster = Roster::new(world, outlets.dead.clone());
        let drill = drill::Drill::from_env(cfg.spec.term);
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
            roster,
            slots,
            group: GroupBook::default(),
            cadence,
            outer,
            rounds: Rounds {
                round: 1,
                reduces: 0,
                global_step: 0,
                stalled: 0,
                completed_at: Instant::now(),
                wire: vec![Default::default(); world],
                walls: vec![0.0; world],
                exposed: vec![None; world],
                headstart: None,
                ordered_ahead: Vec::new(),
            },
            reduce: Reduce::Idle,
            eval: Evaluation::Idle,
            epochs: Epochs { reported: vec![None; world], ..Epochs::default() },
            saves: Saves::default(),
            clock: Clock { start: Instant::now(), train_start: None, train_end: None },
            faults: Vec::new(),
            rejoins: Vec::new(),
            consensus: None,
            staggered: None,
            formation: Formation::Idle,
            conduct: Conduct::new(world, batch_size, |_| false),
            trail: None,
            standby: None,
            pump: None,
            drill,
        };
        coord.open_standby();
        if let Some(resumed) = coord.cfg.resume.clone() {
            coord.resume(&resumed)?;
            coord.saves.resumed = Some(resumed);
        }
        coord.trail = coord.open_trail();
        let windows = coord.make_windows(coord.rounds.round);
        for (slot, w) in coord.slots.iter_mut().zip(windows) {
            slot.window = w;
        }
        Ok(coord)
    }

    /// Opens the exactly-once ledger when the run writes one (a resumed run's header holds the
    /// checkpoint's cut).
    fn open_trail(&self) -> Option<Trail> {
        let path = self.cfg.ledger.as_ref()?;
        let resumed = self.saves.resumed.as_ref().map(|r| {
            let epoch = usize::try_from(r.bundle.epoch).unwrap_or(usize::MAX);
            trail::resume_of(epoch, r.bundle.reduce_version, &r.coverage)
        });
        let (world, spec) = (self.cfg.world(), &self.cfg.spec);
        let header = trail::header(
            world,
            spec.epochs,
            spec.batch_size,
            self.cfg.batches_per_epoch(),
            resumed,
        );
        Trail::open(path, header)
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

    /// Each rank's window numbered `round`, from the policy and ElChe's counts; before ElChe
    /// has any timing, a probe ([`Window::probing`]); once it is calibrated, the ranks other
    /// than the anchor follow it ([`Window::following`]) and the anchor trains no overshoot
    /// ([`Window::anchored`]).
    fn make_windows(&self, round: u64) -> Vec<Window> {
        let elche = self.cadence.elche.as_ref();
        let anchor_wall_ms = elche.map_or(0.0, ElChe::anchor_wall_ms);
        let overshoot = self.cadence.overshoot.current();
        let probing = self.probing();
        let most = probe_most(self.cfg.batches_per_epoch());
        (0..self.cfg.world())
            .map(|r| {
                let count = elche.and_then(|e| e.counts().get(r).copied()).unwrap_or(1);
                let window = self.cfg.spec.policy.window(round, count, overshoot, anchor_wall_ms);
                if probing {
                    window.probing(most)
                } else if self.follows(r) {
                    window.following()
                } else if self.paced_by() == Some(r) {
                    window.anchored()
                } else {
                    window
                }
            })
            .collect()
    }

    /// Whether the next windows are probes: `Cadence` or `Async` before ElChe's first
    /// calibration, with no speed hint to plan from.
    fn probing(&self) -> bool {
        self.cfg.spec.policy.is_progressive()
            && self
                .cadence
                .elche
                .as_ref()
                .is_some_and(|e| !e.is_calibrated() && !e.has_speed_hint())
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
    /// yet ready is told to report now ([`ToWorker::Due`]); on the host backend the anchor's
    /// snapshot is ordered at once when it trains no more (`order_ahead`).
    fn anchor_ready(&mut self, rank: usize) -> Result<()> {
        if self.paced_by() != Some(rank) {
            return Ok(());
        }
        let round = self.rounds.round;
        let due: Vec<usize> = self
            .roster
            .live()
            .into_iter()
            .filter(|&r| r != rank && self.slots.get(r).is_some_and(|s| s.ready.is_none()))
            .collect();
        self.order_ahead(rank, &due)?;
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
        self.conduct.sent(rank, &msg);
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
                    if self.roster.all_started() {
                        self.start_training()?;
                        for (rank, misconduct) in self.conduct.take_condemned() {
                            self.evict(rank, misconduct)?;
                        }
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
                    if self.roster.live().iter().all(|&r| finals[r].is_some()) {
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
            if let Some(lane) = &mut self.standby {
                lane.flush();
            }
            self.pump_standby();
            if matches!(self.phase, Phase::Training) {
                self.check_host_deadline()?;
                self.aggregate();
                self.check_liveness()?;
            }
        }
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

    /// About how many batches each rank has trained at `now` that the dispatcher's book does
    /// not hold yet: the time since its last reduce or its last chunk report, whichever is
    /// later, at its pace, at most its window's limit (0 before its pace is known).
    fn unbooked(&self, now: Instant) -> Vec<usize> {
        let reduced = self.rounds.completed_at;
        let since = |r: usize| match self.epochs.reported.get(r).copied().flatten() {
            Some(at) => at.max(reduced),
            None => reduced,
        };
        let trained = |(r, slot): (usize, &RankSlot)| -> usize {
            let ms = slot.pace.ms_per_batch();
            if ms <= 0.0 {
                return 0;
            }
            let batches = now.saturating_duration_since(since(r)).as_secs_f64() * 1000.0 / ms;
            (batches.floor() as usize).min(slot.window.limit)
        };
        self.slots.iter().enumerate().map(trained).collect()
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
            if !self.roster.is_live(rank) {
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
        let now = Instant::now();
        let trained = self.unbooked(now);
        for rank in self.roster.live() {
            while self.slots.get(rank).is_some_and(|s| s.in_flight < ahead) {
                let Some(chunk) =
                    self.dispatch.next_chunk_after(rank, &counts, calibrated, &trained, now)
                else {
                    break;
                };
                if let Some(trail) = &mut self.trail {
                    trail.handed(rank, &chunk);
                }
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
                for rank in self.roster.live() {
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
    /// The run reports the evaluation, so it is one the coordinator can trust: elected among
    /// the ranks of this process while one lives (their test set loaded here), among ranks in
    /// other processes only when none does (their pace and their answer are their word).
    fn elect_evaluator(&self) -> Option<usize> {
        let ms: Vec<f64> = self.slots.iter().map(|s| s.pace.ms_per_batch()).collect();
        let live = self.roster.live();
        let here: Vec<usize> =
            live.iter().copied().filter(|&r| !self.conduct.is_remote(r)).collect();
        if here.is_empty() {
            tracing::debug!(
                "no rank of the controller's process lives: the evaluation is asked of a rank \
                 in another process, whose answer is its word"
            );
            return self.cfg.spec.eval_rank.elect(&live, &ms);
        }
        self.cfg.spec.eval_rank.elect(&here, &ms)
    }

    /// Tells every live rank to finish.
    fn start_finishing(&mut self) -> Result<()> {
        let capture = self.cfg.checkpoints.is_some();
        for rank in self.roster.joining() {
            // Nothing is left to join: the process ends.
            tracing::info!(rank, "the run finishes before rank {rank} could join again");
            let _ = self.link.try_send(rank, ToWorker::Stop);
            self.roster.abandon(rank);
        }
        // The run's model is the lowest live rank's state (it holds the consensus of the whole
        // last sync): the others' travel only for the collective backend (whose lowest rank
        // may die before it sends) and under `--fragments` when a fragment was not synced since
        // a rank trained (each fragment is then averaged over every rank's state).
        let lowest = self.roster.lowest();
        let every = self.cfg.spec.backend == Backend::Collective
            || self
                .staggered
                .as_ref()
                .is_some_and(|s| !self.roster.live().iter().all(|&r| s.unsynced.is_synced(r)));
        for rank in self.roster.live() {
            let state = every || Some(rank) == lowest;
            self.send(rank, ToWorker::Finish { capture, state })?;
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
    /// live rank's state (under `--fragments`, each fragment averaged over the live ranks').
    fn conclude(&mut self) -> Result<TrainedState> {
        let Phase::Finishing { finals, parts, .. } =
            std::mem::replace(&mut self.phase, Phase::Training)
        else {
            return Err(Internal::ConcludedEarly.into());
        };
        let lowest = self.roster.lowest().ok_or(Error::PeerGone(Peer::EveryRank))?;
        let mut finals: Vec<Option<HostState>> = finals.into_iter().map(Option::flatten).collect();
        // A lowest rank that was not asked for its state (the one asked died since): on the
        // host backend the controller's consensus is the model of the whole last sync.
        if finals.get(lowest).is_some_and(Option::is_none) && self.cfg.spec.backend == Backend::Host
        {
            tracing::info!(lowest, "the run's model is the controller's consensus");
            finals[lowest] = self.consensus.clone();
        }
        let state = match &self.staggered {
            Some(staggered) => self.final_average(staggered, &finals, lowest)?,
            None => finals.swap_remove(lowest).ok_or(Error::PeerGone(Peer::Rank(lowest)))?,
        };
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
        if let Some(trail) = &mut self.trail {
            trail.ended(self.rounds.reduces);
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
}

//! A rank's loop: it trains the chunks it is handed in windows, reports at window ends, and
//! obeys its coordinator's orders (reduce, regroup, evaluate, capture, stop) over its link.

use super::attack::Attacker;
use super::window_state::{Sent, WindowState};
use super::*;
use crate::runtime::engine::scrutiny::check_order;

/// Sends `msg` to the coordinator over `link` (waiting at most `wait` for room), noting when in
/// `last_sent`.
fn send_on(
    link: &RankLink,
    last_sent: &Cell<Instant>,
    msg: ToCoordinator,
    wait: Duration,
) -> Result<()> {
    last_sent.set(Instant::now());
    link.send(msg, wait).map_err(|e| match e {
        LinkError::Timeout(after) => Error::Timeout { what: "room on the link", after },
        LinkError::Gone | LinkError::Full => Error::PeerGone(Peer::Coordinator),
    })
}

/// Tells the coordinator over `link` that `rank` is alive when it has sent nothing for `beat`.
fn heartbeat_on(
    link: &RankLink,
    rank: usize,
    last_sent: &Cell<Instant>,
    beat: Duration,
    wait: Duration,
) -> Result<()> {
    if last_sent.get().elapsed() >= beat {
        send_on(link, last_sent, ToCoordinator::Alive { rank }, wait)?;
    }
    Ok(())
}

/// The coordinator's next message to `rank` over `link`, waited for up to `stall` of silence
/// (bytes of a message still on its way are no silence), saying the
/// rank is alive whenever it has been quiet for `beat`: before every wait, not only after one
/// that timed out. The coordinator pings a rank it has not written to for a beat, which is
/// about when the rank's beat falls due: a ping that lands first, turn after turn (a loaded
/// machine wakes the rank late, to find it queued), would otherwise keep the rank quiet until
/// the watchdog declares it dead.
fn wait_on(
    link: &RankLink,
    rank: usize,
    last_sent: &Cell<Instant>,
    beat: Duration,
    stall: Duration,
) -> Result<ToWorker> {
    let mut deadline = Instant::now() + stall;
    loop {
        heartbeat_on(link, rank, last_sent, beat, stall)?;
        // A message whose bytes are still coming (a large update on a slow link) is no silence.
        if let Some(at) = link.arriving() {
            deadline = deadline.max(at + stall);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout { what: "a message from the coordinator", after: stall });
        }
        match link.recv(beat.min(left)) {
            Ok(msg) => return Ok(msg),
            Err(LinkError::Timeout(_) | LinkError::Full) => {}
            Err(LinkError::Gone) => return Err(Error::PeerGone(Peer::Coordinator)),
        }
    }
}

/// How long a rank whose coordinator's connection ended reads what is left of it for a `Stop`.
const STOP_DRAIN: Duration = Duration::from_secs(2);

/// What a rank's loop does after handling a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Exit,
}

/// The chunk a rank is working through.
#[derive(Debug)]
struct Current {
    chunk: Chunk,
    done: usize,
    work: WorkTally,
}

/// Where a rank's loop stands.
#[derive(Debug)]
enum Stage {
    /// Waiting for the initial weights.
    Starting,
    /// Training its window.
    Training,
    /// Captured for a checkpoint: trains nothing until the coordinator lets it go.
    Paused,
    /// Its group broke inside a reduce: waits for the regroup that redoes it.
    Interrupted(Interrupted),
}

/// A rank's side of the run: trains the chunks it is given and takes part in reduces, talking
/// to the coordinator only through its link.
pub(crate) struct RankLoop<'a> {
    worker: Worker,
    cfg: Arc<RunConfig>,
    link: &'a RankLink,
    stage: Stage,
    queue: VecDeque<Chunk>,
    current: Option<Current>,
    win: WindowState,
    /// Chunks received so far (an `Idle` report names it, so a stale one is recognised).
    works: u64,
    last_sent: Cell<Instant>,
    /// Batches of all ranks up to the last reduce (what the schedule is indexed by).
    global_step: u64,
    /// Collective backend: the rank's current group.
    group: Group,
    /// Where the rank's time went since its last chunk report (sent with the next one).
    ledger: Ledger,
    /// The latest window whose anchor is ready ([`ToWorker::Due`]).
    due: Option<u64>,
    /// The hostile-member test's attacker mode, when armed for this rank.
    attacker: Option<Attacker>,
}

impl std::fmt::Debug for RankLoop<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankLoop")
            .field("rank", &self.worker.rank)
            .field("stage", &self.stage)
            .finish_non_exhaustive()
    }
}

/// A rank's thread: builds the worker, runs its loop over `link`, and reports a failure before
/// letting go of the communicator and the link (so the coordinator reads the cause before it
/// sees the rank gone). Returns the rank's failure, if any (a rank in its own process exits
/// with it).
pub(crate) fn run_rank(
    rank: usize,
    cfg: Arc<RunConfig>,
    comm: Option<CommPlan>,
    link: &RankLink,
    first: Window,
) -> std::result::Result<(), RankFailure> {
    let wait = cfg.spec.stall_timeout;
    let outcome = catch_unwind(AssertUnwindSafe(|| match Worker::build(rank, cfg, comm) {
        Ok(worker) => {
            let mut lp = RankLoop::new(worker, link, first);
            let r = lp.run();
            (r, Some(lp))
        }
        Err(e) => (Err(e), None),
    }));
    let failure = match &outcome {
        Ok((Ok(()), _)) => return Ok(()),
        Ok((Err(e @ Error::Diverged { rank, step, cause, .. }), _)) => {
            // No fault of the rank: the coordinator stops the run (see `Error::Diverged`).
            let msg = ToCoordinator::Diverged { rank: *rank, step: *step, cause: *cause };
            let _ = link.send(msg, wait);
            return Err(RankFailure::from(e));
        }
        Ok((Err(e), _)) => RankFailure::from(e),
        Err(p) => RankFailure::panicked(panic_message(p.as_ref())),
    };
    let _ = link.send(ToCoordinator::Failed { rank, failure: failure.clone() }, wait);
    drop(outcome);
    Err(failure)
}

impl<'a> RankLoop<'a> {
    /// A loop for `worker` over `link`, starting in the window `first`.
    pub(crate) fn new(worker: Worker, link: &'a RankLink, first: Window) -> Self {
        let cfg = worker.cfg.clone();
        let worker_rank = worker.rank;
        // Rank 0's replica is the initial state, unless a checkpoint is resumed.
        let stage = if worker.rank == 0 && cfg.resume.is_none() {
            Stage::Training
        } else {
            Stage::Starting
        };
        let group = Group::new(cfg.world());
        RankLoop {
            worker,
            cfg,
            link,
            stage,
            queue: VecDeque::new(),
            current: None,
            win: WindowState::new(first, (0, 0.0)),
            works: 0,
            last_sent: Cell::new(Instant::now()),
            global_step: 0,
            group,
            ledger: Ledger::default(),
            due: None,
            attacker: Attacker::from_env(worker_rank),
        }
    }

    /// In the standby's process: keeps `state`, the whole state the controller just sent this
    /// rank, for the mirror's next cut, which names it by digest rather than carrying it.
    fn hold_for_mirror(&self, state: HostState) {
        if let Some(mirror) = &self.cfg.mirror {
            mirror.hold(state);
        }
    }

    fn send(&self, msg: ToCoordinator) -> Result<()> {
        let stall = self.cfg.spec.stall_timeout;
        let Some(attacker) = &self.attacker else {
            return send_on(self.link, &self.last_sent, msg, stall);
        };
        for msg in attacker.forge(msg) {
            send_on(self.link, &self.last_sent, msg, stall)?;
        }
        Ok(())
    }

    /// Runs until the coordinator says finish or stop. A coordinator that told this rank to
    /// stop and closed its connection is obeyed, even when a send found the connection closed
    /// before the loop read the `Stop` (a process turned away while it built its replica).
    pub(crate) fn run(&mut self) -> Result<()> {
        match self.run_until_told() {
            Err(Error::PeerGone(Peer::Coordinator)) if self.stop_pending() => Ok(()),
            outcome => outcome,
        }
    }

    /// Whether a `Stop` is among what the coordinator sent before its connection ended: read
    /// until the link reports the end (its reader may still be decoding the last frames),
    /// for [`STOP_DRAIN`] at most.
    fn stop_pending(&self) -> bool {
        let deadline = Instant::now() + STOP_DRAIN;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match self.link.recv(left) {
                Ok(ToWorker::Stop) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }

    /// [`run`](Self::run)'s loop.
    fn run_until_told(&mut self) -> Result<()> {
        let rank = self.worker.rank;
        let initial = if rank == 0 { Some(self.worker.snapshot()?) } else { None };
        let holds = self.link.offer(|| self.worker.snapshot())?;
        let shapes = self.worker.shapes();
        self.send(ToCoordinator::Ready { rank, shapes, initial, holds })?;
        self.announce_group()?;
        loop {
            while let Some(msg) =
                self.link.try_recv().map_err(|_| Error::PeerGone(Peer::Coordinator))?
            {
                if self.handle(msg)? == Flow::Exit {
                    return Ok(());
                }
            }
            let training = matches!(self.stage, Stage::Training);
            if training && self.win.steps < self.win.window.limit && self.has_work() {
                self.train_one()?;
                continue;
            }
            if training && !self.has_work() && self.win.reported.is_none() {
                self.report(Readiness::Idle)?;
            }
            let waiting = self.waiting_for();
            let t = Instant::now();
            let msg = self.wait()?;
            self.ledger.charge(waiting, t);
            if self.handle(msg)? == Flow::Exit {
                return Ok(());
            }
        }
    }

    /// What a wait for the coordinator's next message counts as: the checkpoint while paused
    /// for one, the reduce while a host snapshot is out or a broken reduce waits for its
    /// regroup, waiting otherwise.
    fn waiting_for(&self) -> Activity {
        match self.stage {
            Stage::Paused => Activity::Checkpoint,
            Stage::Interrupted(_) => Activity::Reduce,
            _ if self.win.sent.is_some() => Activity::Reduce,
            _ => Activity::Waiting,
        }
    }

    fn has_work(&self) -> bool {
        self.current.is_some() || !self.queue.is_empty()
    }

    /// Waits for the next message, up to the stall timeout, saying it is alive meanwhile.
    fn wait(&self) -> Result<ToWorker> {
        let (beat, stall) = (self.cfg.heartbeat(), self.cfg.spec.stall_timeout);
        wait_on(self.link, self.worker.rank, &self.last_sent, beat, stall)
    }

    /// Tells the coordinator this rank is alive when it has been quiet for a while.
    fn heartbeat(&self) -> Result<()> {
        let (beat, stall) = (self.cfg.heartbeat(), self.cfg.spec.stall_timeout);
        heartbeat_on(self.link, self.worker.rank, &self.last_sent, beat, stall)
    }

    fn report(&mut self, why: Readiness) -> Result<()> {
        self.win.reported = Some(why);
        self.send(ToCoordinator::Progress {
            rank: self.worker.rank,
            round: self.win.window.round,
            steps: self.win.steps,
            wall_ms: self.win.wall_ms,
            why,
            works: self.works,
            tail_ms: self.win.tail_ms(),
            exposed_ms: self.win.exposed_ms,
        })
    }

    fn train_one(&mut self) -> Result<()> {
        if self.current.is_none() {
            let Some(chunk) = self.queue.pop_front() else { return Ok(()) };
            self.current = Some(Current { chunk, done: 0, work: WorkTally::default() });
        }
        let Some(cur) = self.current.as_mut() else { return Ok(()) };
        let bs = self.cfg.spec.batch_size;
        let step = self.global_step + self.win.steps as u64;
        let next = self.queue.front().copied();
        let t = Instant::now();
        let trained = self.worker.train_chunk_batch(cur.chunk, cur.done, next, step)?;
        // The call's time beyond the training step went to the batch's fetch and upload.
        let call_ms = t.elapsed().as_secs_f64() * 1000.0;
        let compute_ms = trained.map_or(0.0, |t| t.ms);
        self.ledger.charge_ms(Activity::Compute, compute_ms);
        self.ledger.charge_ms(Activity::Data, call_ms - compute_ms);
        // The window's pace is the whole call, the batch's fetch and upload with its step: a
        // pace of compute alone gives a rank that fetches on its critical path more batches
        // than it trains in the anchor's time, and the anchor waits for it at every reduce.
        self.win.call(call_ms, trained.is_some());
        let Some(Trained { loss, ms, cache }) = trained else {
            // A prefetched batch not ready yet: the run loop services the link and comes back.
            return self.heartbeat();
        };
        staging::tally(&mut cur.work.cache, cache);
        cur.done += 1;
        cur.work.batches += 1;
        cur.work.samples += bs;
        cur.work.loss_sum += f64::from(loss);
        cur.work.compute_ms += ms;
        if cur.done * bs >= cur.chunk.len
            && let Some(mut cur) = self.current.take()
        {
            cur.work.scalars = drain_scalars();
            cur.work.time = self.ledger.close();
            let rank = self.worker.rank;
            self.send(ToCoordinator::ChunkDone { rank, chunk: cur.chunk, work: cur.work.into() })?;
        }
        self.win.steps += 1;
        if self.win.reported.is_none() && self.win.is_reached() {
            self.report(Readiness::Reached)?;
        }
        self.heartbeat()
    }

    /// Starts the window `next` after a reduce; `carried` steps and ms stay in it.
    fn start_window(&mut self, next: Window, carried: (usize, f64)) -> Result<()> {
        self.win = WindowState::new(next, carried);
        // What the reduce just done cost this rank: what ElChe weighs against the window.
        self.win.exposed_ms = self.ledger.take_exposed();
        if self.win.is_reached() {
            self.report(Readiness::Reached)?;
        }
        self.follow_due()
    }

    /// The anchor is ready for the reduce of `round` (which may be a window this rank has not
    /// started: the order can overtake the update that starts it in cluster mode, on another
    /// lane).
    fn due(&mut self, round: u64) -> Result<()> {
        self.due = self.due.max(Some(round));
        self.follow_due()
    }

    /// A rank training the window whose anchor is ready, not reported yet, reports where it
    /// stands and trains no more before the reduce than its overshoot.
    fn follow_due(&mut self) -> Result<()> {
        let training = matches!(self.stage, Stage::Training);
        if !training || self.due != Some(self.win.window.round) || self.win.reported.is_some() {
            return Ok(());
        }
        self.win.window = self.win.window.ended_at(self.win.steps);
        self.report(Readiness::Reached)
    }

    fn evaluate_for(&mut self, epoch: Option<usize>) -> Result<()> {
        if let Some(epoch) = epoch {
            let t = Instant::now();
            let eval = self.worker.evaluate();
            self.ledger.charge(Activity::Evaluation, t);
            let eval = eval?;
            self.send(ToCoordinator::Evaluated { rank: self.worker.rank, epoch, eval })?;
        }
        Ok(())
    }

    /// The chunk in training and how many of its batches are done.
    fn position(&self) -> Option<(Chunk, usize)> {
        self.current.as_ref().map(|c| (c.chunk, c.done))
    }

    /// This rank's checkpoint part, when one is asked for; the rank then pauses.
    fn capture(&mut self, request: Option<CaptureRequest>) -> Result<Option<Box<RankCapture>>> {
        let Some(request) = request else { return Ok(None) };
        self.stage = Stage::Paused;
        let t = Instant::now();
        let position = self.position();
        let part = self.worker.capture(request, position);
        self.ledger.charge(Activity::Checkpoint, t);
        Ok(Some(Box::new(part?)))
    }

    /// Checks what the controller sends as it checks what a rank sends
    /// ([`check_order`]: the replica's shapes, finite parameters, a cohort step that only goes
    /// forward).
    ///
    /// # Errors
    /// [`Error::Protocol`] naming what was refused.
    fn vet(&self, what: &str, state: Option<&HostState>, global_step: u64) -> Result<()> {
        check_order(what, state, &self.worker.shapes(), global_step, self.global_step)
    }

    fn handle(&mut self, msg: ToWorker) -> Result<Flow> {
        let rank = self.worker.rank;
        match msg {
            ToWorker::Init { state, restore, window, global_step } => {
                self.vet("starting state", Some(&state), global_step)?;
                self.win = WindowState::new(window, (0, 0.0));
                self.ledger.start();
                self.worker.load(&state)?;
                self.global_step = global_step;
                if let Some(restore) = restore {
                    self.worker.restore(&restore)?;
                    self.global_step = restore.global_step;
                }
                self.stage = Stage::Training;
                self.hold_for_mirror(state);
            }
            ToWorker::Join { window, global_step } => {
                // Nothing to train until the reduce that brings the consensus: its window
                // allows no step, so this rank weighs nothing in that reduce.
                self.win = WindowState::new(window, (0, 0.0));
                self.ledger.start();
                // A reduce this process took part in before it left is no part of this run.
                self.ledger.take_exposed();
                self.global_step = global_step;
                self.stage = Stage::Training;
            }
            ToWorker::Resume => {
                if matches!(self.stage, Stage::Paused) {
                    self.stage = Stage::Training;
                    self.follow_due()?;
                }
            }
            ToWorker::Stage { chunks } => {
                let skip = match (&self.current, chunks.first()) {
                    (Some(cur), Some(first)) if cur.chunk == *first => {
                        cur.done * self.cfg.spec.batch_size
                    }
                    _ => 0,
                };
                self.worker.stage(&chunks, skip);
            }
            ToWorker::Work(chunk) => {
                self.ledger.start();
                self.queue.push_back(chunk);
                self.works += 1;
                if self.win.reported == Some(Readiness::Idle) {
                    self.win.reported = None;
                }
            }
            ToWorker::Reduce { next, eval, global_step, capture } => {
                self.vet("reduce order", None, global_step)?;
                self.reduce(Interrupted { next, eval, global_step, capture })?;
            }
            ToWorker::Due { round } => self.due(round)?,
            ToWorker::Last { round } => {
                if self.win.window.round == round {
                    self.win.window = self.win.window.anchored();
                }
            }
            ToWorker::Snapshot { round, attempt, capture, fragment } => {
                let t = Instant::now();
                // Under `--fragments` only the fragment asked for is read and travels (and
                // every buffer).
                let state = match fragment {
                    Some(k) => {
                        let cut = self.worker.fragments(self.cfg.spec.fragments)?;
                        self.worker.snapshot_part(cut.pieces_of(k)?)?
                    }
                    None => self.worker.snapshot()?,
                };
                let step = self.global_step + self.win.steps as u64;
                check_snapshot(&state, rank, step)?;
                self.ledger.charge(Activity::Reduce, t);
                let capture = self.capture(capture)?;
                // The parameters are kept to carry over what the rank trains while the round
                // runs (`Async`, and every policy under overlap: without it, under `Sync` and
                // `Cadence` it waits at its window's end). Under overlap the rank may train
                // a window's count more before the update: the steps it trains meanwhile
                // open its next window.
                let overlap = self.cfg.spec.overlap.is_some();
                let params = (overlap || self.win.steps < self.win.window.limit)
                    .then(|| state.params.clone());
                if overlap {
                    let more = self.win.steps.saturating_add(self.win.window.target.max(1));
                    self.win.window.limit = self.win.window.limit.max(more);
                }
                self.win.sent =
                    Some(Sent { steps: self.win.steps, wall_ms: self.win.wall_ms, params });
                let t = Instant::now();
                self.send(ToCoordinator::Snapshot {
                    rank,
                    round,
                    attempt,
                    state,
                    steps: self.win.steps,
                    capture,
                    exchange: Default::default(),
                    fragment,
                })?;
                self.ledger.charge(Activity::Exchange, t);
            }
            ToWorker::Update { state, next, eval, global_step, fragment } => {
                // Under `--fragments` the update is one fragment's part: checked against its
                // shapes, and only its parameters are taken.
                let cut = match fragment {
                    Some(k) => Some((k, self.worker.fragments(self.cfg.spec.fragments)?)),
                    None => None,
                };
                let shapes = match &cut {
                    Some((k, cut)) => cut.shapes(*k, &self.worker.shapes()),
                    None => self.worker.shapes(),
                };
                check_order("update", Some(&state), &shapes, global_step, self.global_step)?;
                self.global_step = global_step;
                if matches!(self.stage, Stage::Paused) {
                    self.stage = Stage::Training;
                }
                let sent = self.win.sent.take();
                let (s, w) = sent
                    .as_ref()
                    .map_or((self.win.steps, self.win.wall_ms), |s| (s.steps, s.wall_ms));
                let carried = (self.win.steps.saturating_sub(s), (self.win.wall_ms - w).max(0.0));
                // Steps trained since the snapshot stay: now + μ·(average − snapshot), μ the
                // overlap's mixing factor (times EASGD's α), 1 without overlap.
                let spec = &self.cfg.spec;
                let params =
                    sent.and_then(|s| s.params).filter(|_| carried.0 > 0 || spec.overlap.is_some());
                let blend = match (spec.overlap, spec.easgd) {
                    (Some(mix), alpha) => Some(mix * alpha.unwrap_or(1.0)),
                    (None, alpha) => alpha,
                };
                let t = Instant::now();
                let pieces = cut.as_ref().map(|(k, cut)| cut.pieces(*k));
                self.worker.take_average(&state, params.as_deref(), blend, pieces)?;
                self.ledger.charge(Activity::Reduce, t);
                if fragment.is_none() {
                    self.hold_for_mirror(state);
                }
                self.start_window(next, carried)?;
                self.evaluate_for(eval)?;
            }
            ToWorker::Evaluate { epoch } => self.evaluate_for(Some(epoch))?,
            ToWorker::Finish { capture, state } => {
                let state = if state { Some(self.worker.snapshot()?) } else { None };
                let capture = self.capture(capture.then_some(CaptureRequest { model: false }))?;
                self.send(ToCoordinator::Final { rank, state, capture })?;
                return Ok(Flow::Exit);
            }
            ToWorker::Stop => {
                if let Some(attacker) = &self.attacker {
                    let stall = self.cfg.spec.stall_timeout;
                    // Its connection ended after the Stop: stopped, not a controller's death.
                    attacker
                        .on_stop(rank, |m| send_on(self.link, &self.last_sent, m, stall))
                        .map_err(|_| Error::Evicted)?;
                }
                return Ok(Flow::Exit);
            }
            // The link acts on abort orders itself; one that reaches the loop is stale.
            ToWorker::Ping | ToWorker::AbortGroup { .. } => {}
            // The standby's process folds the controller's state into its mirror; a frame it
            // refuses (garbage, a replay, an older term) changes nothing, and a rank that is
            // not the standby has no mirror to fold it into.
            ToWorker::Mirror { frame } => match &self.cfg.mirror {
                Some(mirror) => {
                    if let Err(error) = mirror.accept(&frame) {
                        tracing::warn!(rank, %error, "a mirror frame refused");
                    }
                }
                None => tracing::warn!(rank, "a mirror frame for a rank that is no standby"),
            },
            ToWorker::Regroup { generation, members, how } => {
                return self.regroup(generation, &members, &how);
            }
            ToWorker::MakeGroupId { generation } => {
                let how = self.worker.make_group_id()?;
                self.send(ToCoordinator::GroupId { rank, generation, how })?;
            }
        }
        Ok(Flow::Continue)
    }

    /// Collective backend: averages with the group, then starts the next window. When the
    /// group breaks (a peer died, the group was aborted or timed out), the parameters and
    /// buffers are as before the reduce; the rank reports it and waits for the coordinator's
    /// new membership, after which the reduce is redone.
    fn reduce(&mut self, what: Interrupted) -> Result<()> {
        let rank = self.worker.rank;
        self.global_step = what.global_step;
        let steps = self.win.steps;
        let round = self.win.window.round;
        self.send(ToCoordinator::Reducing { rank, round })?;
        let t = Instant::now();
        let reduced = self.worker.all_reduce(steps);
        self.ledger.charge(Activity::Reduce, t);
        match reduced {
            Ok(Reduced { sync_ms, divergence, norm }) => {
                let t = Instant::now();
                match norm {
                    Some(norm) => check_norm(norm, rank, what.global_step)?,
                    None => {
                        let (params, stream) =
                            (self.worker.replica.parameters(), &self.worker.stream);
                        check_parameters(params, rank, what.global_step, stream)?;
                    }
                }
                self.ledger.charge(Activity::Reduce, t);
                let capture = self.capture(what.capture)?;
                self.send(ToCoordinator::Reduced {
                    rank,
                    round,
                    steps,
                    sync_ms,
                    divergence,
                    capture,
                })?;
                self.start_window(what.next, (0, 0.0))?;
                self.evaluate_for(what.eval)
            }
            // A rank whose group is formed through the coordinator has no communicator when
            // the last group failed to form: it waits for the next, as after a break.
            Err(e)
                if is_group_fault(&e) || self.relayed() && matches!(e, Error::NoCommunicator) =>
            {
                tracing::warn!(rank, round, error = %e, "collective group broke; waiting to regroup");
                self.stage = Stage::Interrupted(what);
                let generation = self.group.generation;
                let error = e.to_string().into();
                self.send(ToCoordinator::ReduceFailed { rank, round, generation, error })
            }
            Err(e) => Err(e),
        }
    }

    /// Builds the communicator of the group `members` (global ranks) and redoes an
    /// interrupted reduce; exits when this rank is not a member (it was declared dead).
    fn regroup(&mut self, generation: u64, members: &[usize], how: &Regroup) -> Result<Flow> {
        let rank = self.worker.rank;
        if !members.contains(&rank) {
            return Ok(Flow::Exit);
        }
        // A shrunk host group is made of the current one's members; a group named by an id
        // may take members the current one lacks (a rank joining a running run).
        let positions = match how {
            Regroup::Host => Some(self.group.positions(members).ok_or_else(|| {
                Error::protocol(format!(
                    "regroup {members:?} names a rank outside the current group"
                ))
            })?),
            _ => None,
        };
        let me = members.iter().position(|&m| m == rank).unwrap_or(0);
        self.send(ToCoordinator::Joining { rank, generation })?;
        self.group = Group { members: members.to_vec(), generation };
        match self.worker.regroup_comm(positions.as_deref(), members.len(), me, how) {
            Ok(()) => {}
            // A member that never came (it died while the group formed): the coordinator
            // forms the next group once it declares it dead; the reduce stays owed till then.
            Err(e) if self.relayed() && is_group_fault(&e) => {
                tracing::warn!(rank, generation, error = %e, "the group did not form; waiting for the next");
                return Ok(Flow::Continue);
            }
            Err(e) => return Err(e),
        }
        tracing::info!(rank, generation, ?members, "regrouped");
        self.announce_group()?;
        // A rank still starting (the first group forms before its initial state) stays so.
        if matches!(self.stage, Stage::Interrupted(_))
            && let Stage::Interrupted(what) = std::mem::replace(&mut self.stage, Stage::Training)
        {
            self.reduce(what)?;
        }
        Ok(Flow::Continue)
    }

    /// Whether the rank's collective groups are formed through the coordinator (each named by
    /// a relayed id: NCCL across processes, the in-memory engine).
    fn relayed(&self) -> bool {
        let spec = &self.cfg.spec;
        spec.collective_engine().is_some_and(|e| e.relays(spec.placement))
    }

    /// Arms the link to abort the rank's current collective group and tells the coordinator
    /// the rank joined it.
    fn announce_group(&self) -> Result<()> {
        let Some(comm) = self.worker.comm.as_ref() else { return Ok(()) };
        let generation = self.group.generation;
        self.link.arm_abort(generation, comm.abort_handle());
        self.send(ToCoordinator::Joined { rank: self.worker.rank, generation })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::frame::WireFormat;
    use crate::link::{CoordinatorLink, Inbound};

    const BEAT: Duration = Duration::from_millis(500);
    const STALL: Duration = Duration::from_secs(20);

    /// A rank quiet for a beat that finds the coordinator's ping waiting (as a loaded machine
    /// makes it, waking late) says it is alive before taking the ping; one that spoke within
    /// the beat says nothing.
    #[test]
    fn a_quiet_rank_woken_by_a_ping_says_it_is_alive() -> std::result::Result<(), String> {
        for (quiet, alive) in [(2 * BEAT, true), (BEAT + BEAT / 2, true), (Duration::ZERO, false)] {
            let (inbox_tx, inbox) = flume::bounded::<Inbound>(16);
            let (coord, mut ends) = CoordinatorLink::start(
                1,
                &[0],
                (Vec::new(), None),
                4,
                (WireFormat::F32, 1),
                &inbox_tx,
            )
            .map_err(|e| e.to_string())?;
            let rank = ends.pop().ok_or("no rank 0")?;
            coord.send(0, ToWorker::Ping, STALL).map_err(|e| e.to_string())?;
            let since = Instant::now().checked_sub(quiet).ok_or("no instant that early")?;
            let last_sent = Cell::new(since);
            let got = wait_on(&rank, 0, &last_sent, BEAT, STALL).map_err(|e| e.to_string())?;
            if got != ToWorker::Ping {
                return Err(format!("quiet {quiet:?}: got {got:?}"));
            }
            let said = match inbox.try_recv() {
                Ok(Inbound::Wire { rank: 0, msg: ToCoordinator::Alive { rank: 0 } }) => true,
                Err(flume::TryRecvError::Empty) => false,
                other => return Err(format!("quiet {quiet:?}: the coordinator got {other:?}")),
            };
            if said != alive {
                return Err(format!("quiet {quiet:?}: said it is alive {said}, expected {alive}"));
            }
            if alive && last_sent.get() <= since {
                return Err(format!("quiet {quiet:?}: the heartbeat was not noted"));
            }
        }
        Ok(())
    }

    /// A two-rank run's configuration on a small MLP over 64 random samples.
    fn small_run() -> std::result::Result<Arc<RunConfig>, String> {
        use flodl_data::{Field, InMemory, SampleLayout, Values};
        use flodl_tensor::DType;
        let layout = SampleLayout::new(vec![
            Field::new("x", &[4], DType::F32),
            Field::new("label", &[], DType::I32),
        ])
        .map_err(|e| e.to_string())?;
        let x = Values::F32((0..256).map(|i| ((i * 37) % 11) as f32 / 11.0).collect());
        let labels = Values::I32((0..64).map(|i| i % 2).collect());
        let data: Arc<dyn flodl_data::Dataset> =
            Arc::new(InMemory::new(layout, vec![x, labels]).map_err(|e| e.to_string())?);
        let mlp = crate::mlp::MlpConfig::new(&[4, 3, 2], crate::mlp::Optimizer::sgd(0.9));
        let factory: crate::runtime::engine::run_config::Factory = Arc::new(move |ctx| {
            Ok(Box::new(crate::mlp::Mlp::factory(mlp.clone())(ctx)?) as Box<dyn Replica>)
        });
        let mut config = RunConfig {
            spec: Default::default(),
            factory,
            dataset: data,
            test: None,
            on_epoch: None,
            audit: None,
            ledger: None,
            checkpoints: None,
            resume: None,
            own: None,
            standby: None,
            mirror: None,
        };
        config.spec.devices = vec![Device::Cpu; 2];
        config.spec.backend = crate::control::policy::Backend::Host;
        config.spec.batch_size = 8;
        Ok(Arc::new(config))
    }

    /// A fragment's snapshot, read piece by piece from the replica, is the fragment's part of
    /// the whole snapshot, for every count of fragments of the model (runs splitting tensors
    /// among them); a piece that does not fit the replica is refused.
    #[test]
    fn a_fragments_snapshot_is_its_part_of_the_whole() -> std::result::Result<(), String> {
        let mut worker = Worker::build(1, small_run()?, None).map_err(|e| e.to_string())?;
        let whole = worker.snapshot().map_err(|e| e.to_string())?;
        let values: usize = whole.params.iter().map(Vec::len).sum();
        for count in 1..=values {
            let cut = worker.fragments(count).map_err(|e| e.to_string())?;
            for k in 0..count {
                let pieces = cut.pieces_of(k).map_err(|e| e.to_string())?;
                let part = worker.snapshot_part(pieces).map_err(|e| e.to_string())?;
                if part != cut.part(k, &whole).map_err(|e| e.to_string())? {
                    return Err(format!("fragment {k} of {count}: not its part of the whole"));
                }
            }
        }
        let size = whole.params[0].len();
        for bad in [Piece { tensor: 0, start: size, len: 1 }, Piece::whole(whole.params.len(), 1)] {
            if worker.snapshot_part(&[bad]).is_ok() {
                return Err(format!("{bad:?} was read"));
            }
        }
        Ok(())
    }

    /// A rank takes the controller's orders only after checking them: each case is an order,
    /// in sequence on one rank, and the refusal it must get (`None`: taken). A starting state or
    /// update with a NaN, an infinity or a tensor short is refused, as are an update and a
    /// reduce order behind the cohort step the rank is at (a replay); good ones are taken.
    #[test]
    fn a_rank_refuses_the_controllers_bad_orders() -> std::result::Result<(), String> {
        let cfg = small_run()?;
        let mut worker = Worker::build(1, cfg, None).map_err(|e| e.to_string())?;
        let good = worker.snapshot().map_err(|e| e.to_string())?;
        let spoilt = |f: fn(&mut Vec<f32>)| {
            let mut s = good.clone();
            if let Some(first) = s.params.first_mut() {
                f(first);
            }
            s
        };
        let nan = spoilt(|p| p[0] = f32::NAN);
        let inf = spoilt(|p| p[1] = f32::INFINITY);
        let short = spoilt(|p| {
            p.pop();
        });
        let (inbox_tx, _inbox) = flume::bounded::<Inbound>(64);
        let (_coord, mut ends) = CoordinatorLink::start(
            2,
            &[1],
            (Vec::new(), None),
            16,
            (WireFormat::F32, 1),
            &inbox_tx,
        )
        .map_err(|e| e.to_string())?;
        let end = ends.pop().ok_or("no rank end")?;
        let window = Window { round: 1, target: 4, limit: 4, wall: None };
        let mut lp = RankLoop::new(worker, &end, window);
        let init = |state: &HostState, global_step| ToWorker::Init {
            state: state.clone(),
            restore: None,
            window,
            global_step,
        };
        let update = |state: &HostState, global_step| ToWorker::Update {
            state: state.clone(),
            next: window,
            eval: None,
            global_step,
            fragment: None,
        };
        let reduce =
            |global_step| ToWorker::Reduce { next: window, eval: None, global_step, capture: None };
        let cases: Vec<(&str, ToWorker, Option<&str>)> = vec![
            ("a NaN start", init(&nan, 0), Some("NaN in its starting state")),
            ("an infinite start", init(&inf, 0), Some("inf in its starting state")),
            ("a short start", init(&short, 0), Some("starting state")),
            ("a good start", init(&good, 10), None),
            ("an update back", update(&good, 9), Some("at cohort step 9, behind step 10")),
            ("a NaN update", update(&nan, 12), Some("NaN in its update")),
            ("a short update", update(&short, 12), Some("values where its shape")),
            ("a good update", update(&good, 12), None),
            ("a reduce order back", reduce(11), Some("behind step 12 (a replay)")),
        ];
        for (name, order, refusal) in cases {
            let got = lp.handle(order).err().map(|e| e.to_string());
            match (refusal, &got) {
                (None, None) => {}
                (Some(r), Some(g)) if g.contains(r) => {}
                _ => return Err(format!("{name}: expected {refusal:?}, got {got:?}")),
            }
        }
        Ok(())
    }
}

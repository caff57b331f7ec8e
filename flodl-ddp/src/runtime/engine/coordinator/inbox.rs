//! What reaches the coordinator: one event at a time from its inbox, a rank's wire messages, and the ready ranks that start training.

use super::*;

impl Coordinator {
    pub(super) fn handle(&mut self, event: Event) -> Result<()> {
        match event {
            Inbound::Local(Local::Averaged { round, state, divergence }) => {
                self.averaged(round, state, divergence)
            }
            Inbound::Gone { rank } => self.gone(rank),
            Inbound::Joined { rank, frames } => {
                if self.conduct.is_barred(rank) {
                    tracing::warn!(
                        rank,
                        "a process joining again as rank {rank} was turned away: the rank was \
                         evicted for misconduct, and its seat stays closed for the run"
                    );
                    self.link.turn_away(&frames.0);
                    return Ok(());
                }
                self.conduct.reset(rank);
                self.joined(rank, frames.0)
            }
            Inbound::Wire { rank, msg } => {
                if let Err(misconduct) = self.conduct.frame(rank, Instant::now()) {
                    // Past its budget: dropped, and a live rank evicted.
                    if self.roster.is_live(rank) {
                        return self.evict(rank, misconduct);
                    }
                    return Ok(());
                }
                if self.roster.is_joining(rank) {
                    return self.joining_wire(rank, msg);
                }
                if !self.roster.is_live(rank) {
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
    pub(super) fn violation(&mut self, rank: usize, detail: String) -> Result<()> {
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

    /// `rank` sent what no honest rank sends: it is evicted through the death path (before
    /// training starts, once it has), and the run goes on with the others. Its connection is
    /// ended after its `Stop` (a process that ignores the order is heard no more), and its seat
    /// stays closed for the run: it cannot come back by connecting again.
    pub(super) fn evict(&mut self, rank: usize, misconduct: Misconduct) -> Result<()> {
        tracing::warn!(rank, %misconduct, "rank {rank} misbehaved: evicting it");
        if matches!(self.phase, Phase::Starting { .. }) {
            self.conduct.condemn(rank, misconduct);
            return Ok(());
        }
        self.conduct.bar(rank);
        let failure = RankFailure::from(&Error::protocol(format!("rank {rank} {misconduct}")));
        let died = self.rank_died(rank, FaultCause::Misconduct { misconduct }, failure);
        self.link.sever(rank);
        died
    }

    /// Checks what `msg` reports against what the coordinator knows: `Err` names the
    /// misconduct of its sender (steps beyond what it was handed, a forged chunk report, a
    /// non-finite measure, a replayed or bad snapshot, an answer to a question not asked).
    fn scrutinize(&mut self, msg: &ToCoordinator) -> std::result::Result<(), Misconduct> {
        let batch_size = self.cfg.spec.batch_size;
        match msg {
            ToCoordinator::Ready { rank, initial: Some(_), .. } if *rank != 0 => {
                Err(Misconduct::StartState)
            }
            ToCoordinator::ChunkDone { chunk, work, .. } => {
                if work.batches > chunk.batches(batch_size) || work.samples > chunk.len {
                    let detail = format!(
                        "{} batches and {} samples for a chunk of {} batches and {} samples",
                        work.batches,
                        work.samples,
                        chunk.batches(batch_size),
                        chunk.len
                    );
                    return Err(Misconduct::ForgedWork { detail });
                }
                Ok(())
            }
            ToCoordinator::Progress {
                rank, round, steps, wall_ms, tail_ms, exposed_ms, ..
            } => {
                finite("window's wall time", *wall_ms)?;
                if let Some(tail) = tail_ms {
                    finite("window's tail", *tail)?;
                }
                if let Some(exposed) = exposed_ms {
                    finite("reduce's exposed time", *exposed)?;
                }
                self.conduct.steps(*rank, *round, *steps)
            }
            ToCoordinator::Reduced { rank, round, steps, sync_ms, divergence, .. } => {
                finite("reduce's time", *sync_ms)?;
                if let Some(d) = divergence {
                    finite("divergence", *d)?;
                }
                self.conduct.steps(*rank, *round, *steps)
            }
            ToCoordinator::Snapshot {
                rank,
                round,
                attempt,
                state,
                steps,
                capture,
                fragment: snapshot_fragment,
                ..
            } => {
                // A round's snapshot, or one ordered ahead of its round.
                let headstart = self.rounds.headstart.as_ref();
                let (admits, fragment) = match &self.reduce {
                    Reduce::Host(hr) => (hr.admits(*rank, *round, *attempt), hr.fragment()),
                    _ => match headstart {
                        Some(h) => (h.admits(*rank, *round, *attempt), h.fragment()),
                        None => (None, None),
                    },
                };
                if admits.is_none() {
                    return Err(Misconduct::Replayed { round: *round, attempt: *attempt });
                }
                // A snapshot the round takes answers its checkpoint's order with the part.
                let asked = self.saves.capturing.as_ref().is_some_and(|c| c.round == *round);
                if admits == Some(true) && asked && capture.is_none() {
                    return Err(Misconduct::PartMissing { round: *round });
                }
                self.conduct.steps(*rank, *round, *steps)?;
                // Under `--fragments` the snapshot is the part of the round's fragment.
                match (fragment, &self.staggered) {
                    (Some(k), Some(s)) if snapshot_fragment == &Some(k) => {
                        check_state("snapshot", state, &s.cut.shapes(k, &self.shapes))
                    }
                    (None, _) if snapshot_fragment.is_none() => {
                        check_state("snapshot", state, &self.shapes)
                    }
                    _ => Err(Misconduct::Misshaped {
                        what: "snapshot".into(),
                        detail: format!(
                            "fragment {snapshot_fragment:?} where {fragment:?} was asked"
                        ),
                    }),
                }
            }
            ToCoordinator::Final { state: Some(state), .. } => {
                check_state("final state", state, &self.shapes)
            }
            ToCoordinator::Evaluated { rank, epoch, .. } => self.conduct.evaluated(*rank, *epoch),
            ToCoordinator::GroupId { rank, generation, .. } => {
                self.conduct.group_id(*rank, *generation)
            }
            _ => Ok(()),
        }
    }

    pub(super) fn handle_wire(&mut self, mut msg: ToCoordinator) -> Result<()> {
        if let Err(misconduct) = self.scrutinize(&msg) {
            let rank = msg.rank();
            self.evict(rank, misconduct)?;
            match &mut msg {
                // Its replica's shapes still count for the start; its state does not.
                ToCoordinator::Ready { initial, .. } => *initial = None,
                _ => return Ok(()),
            }
        }
        match msg {
            ToCoordinator::Alive { .. } => {}
            ToCoordinator::Ready { rank, shapes, initial, .. } => {
                self.ready(rank, shapes, initial)?
            }
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
            ToCoordinator::Progress {
                rank,
                round,
                steps,
                wall_ms,
                why,
                works,
                tail_ms,
                exposed_ms,
            } => {
                let current_round = self.rounds.round;
                if let Some(slot) = self.slots.get_mut(rank) {
                    let current = why == Readiness::Reached || works == slot.works_sent;
                    if steps > 0 {
                        slot.pace.add(wall_ms, steps);
                        // Its window's time: what its silence deadline is derived from.
                        slot.windows.record(&DeadlineRule::default(), wall_ms);
                    }
                    if round == current_round && current {
                        slot.ready = Some(Ready { steps, wall_ms, why, tail_ms, exposed_ms });
                    }
                }
                if round == current_round && why == Readiness::Reached {
                    self.anchor_ready(rank)?;
                }
                if round == current_round {
                    self.hold_the_last()?;
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
            ToCoordinator::Snapshot {
                rank,
                round,
                attempt,
                state,
                steps,
                capture,
                exchange,
                ..
            } => {
                if let Some(slot) = self.rounds.wire.get_mut(rank) {
                    *slot = exchange;
                }
                self.take_capture(rank, round, capture);
                if let Some(headstart) = &mut self.rounds.headstart {
                    headstart.keep(rank, round, attempt, state, steps);
                } else if let Reduce::Host(hr) = &mut self.reduce
                    && let Some(job) = hr.collect(rank, round, attempt, state, steps)
                {
                    if let Some(drill) = &mut self.drill {
                        drill.reach(super::drill::HoldAt::Reduce, self.dispatch.oldest());
                    }
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
    pub(super) fn ready(
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
        self.roster.started(rank);
        Ok(())
    }

    /// The window `rank` starts training in.
    pub(super) fn first_window(&self, rank: usize) -> Window {
        self.slots
            .get(rank)
            .map_or(Window { round: 1, target: 1, limit: 1, wall: None }, |s| s.window)
    }

    /// Every replica is built: checks a resumed bundle against them and sends the initial
    /// weights (rank 0's, or the bundle's consensus) to every rank that needs them.
    pub(super) fn start_training(&mut self) -> Result<()> {
        let Phase::Starting { initial, .. } = std::mem::replace(&mut self.phase, Phase::Training)
        else {
            return Ok(());
        };
        let mut inits = Vec::with_capacity(self.cfg.world());
        if let Some(resumed) = self.saves.resumed.clone() {
            // Checked against rank 0's state, or (a standby's run after a takeover, which has
            // no rank 0) the replicas' shapes, parameters then buffers.
            let n = initial.as_ref().map_or(resumed.consensus.params.len(), |i| i.params.len());
            let n = n.min(self.shapes.len());
            let found = resumed.bundle.signature();
            signature(&self.shapes[..n]).check(&found)?;
            let buffers = initial.as_ref().map_or(self.shapes.len() - n, |i| i.buffers.len());
            if resumed.consensus.buffers.len() != buffers {
                return Err(Error::mismatch(
                    "buffers",
                    format!("{} (the checkpoint's)", resumed.consensus.buffers.len()),
                    buffers,
                ));
            }
            if self.cfg.spec.backend == Backend::Host {
                self.consensus = Some(resumed.consensus.clone());
                self.stagger(&resumed.consensus)?;
            }
            for rank in self.roster.live() {
                let restore = resumed.ranks.get(rank).cloned().map(Box::new);
                let state = resumed.consensus.clone();
                let window = self.first_window(rank);
                let global_step = self.rounds.global_step;
                inits.push((rank, ToWorker::Init { state, restore, window, global_step }));
            }
        } else {
            let initial = initial.ok_or(Error::PeerGone(Peer::Rank(0)))?;
            if self.cfg.checkpoints.is_some() {
                self.saves.last_bundle = Some(self.starting_bundle(&initial)?);
            }
            if self.cfg.spec.backend == Backend::Host {
                self.consensus = Some(initial.clone());
                self.stagger(&initial)?;
            }
            // Rank 0 trains from its own replica, which is the initial state; in its own
            // process (the controller kept apart) it still needs its first window.
            let apart = self.cfg.spec.controller_apart();
            for rank in self.roster.live().into_iter().filter(|&r| apart || r != 0) {
                let state = initial.clone();
                let window = self.first_window(rank);
                inits.push((rank, ToWorker::Init { state, restore: None, window, global_step: 0 }));
            }
        }
        if self.group.relay {
            // The first group forms through the coordinator before the ranks train.
            let members = self.roster.live();
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
}

/// A measure a rank reports, refused when it is not a finite non-negative number.
fn finite(what: &str, x: f64) -> std::result::Result<(), Misconduct> {
    if x.is_finite() && x >= 0.0 {
        return Ok(());
    }
    Err(Misconduct::NonFinite { what: what.into(), value: x.to_string() })
}

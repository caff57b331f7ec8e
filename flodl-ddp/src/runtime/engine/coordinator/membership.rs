//! The coordinator as the membership authority: seats left vacant, ranks gone, joining again and admitted, watched for silence, and declared dead (their work handed back, the survivors regrouped). The roster decides each change; `apply` hands it to every book.

use super::*;

impl Coordinator {
    /// Hands `change`, as the roster emitted it, to every book that keeps membership: the one
    /// place they are kept in step ([`Books::apply`]).
    pub(super) fn apply(&mut self, change: &Change) -> Result<Applied> {
        let books = Books {
            slots: &mut self.slots,
            dispatch: &mut self.dispatch,
            elche: self.cadence.elche.as_mut(),
            host_round: match &mut self.reduce {
                Reduce::Host(round) => Some(round),
                Reduce::Collective { .. } | Reduce::Idle => None,
            },
            reported: &mut self.epochs.reported,
        };
        let applied = books.apply(change)?;
        self.mirror_seats();
        Ok(applied)
    }

    /// Leaves `ranks` out of the start: no process joined their seats (a cluster run started
    /// on a quorum); a process that joins one later is admitted like a rank joining again.
    pub(super) fn vacate(&mut self, ranks: &[usize]) -> Result<()> {
        for &rank in ranks {
            tracing::info!(rank, "rank {rank}'s seat is vacant at the start");
            if let Some(change) = self.roster.vacate(rank, Instant::now()) {
                self.apply(&change)?;
            }
        }
        Ok(())
    }

    /// `rank`'s link is gone: after its final state that is the end of it; before training
    /// starts, its seat is left vacant (a process in this one: the run fails); else it died.
    /// A process joining again that goes away leaves the seat dead.
    pub(super) fn gone(&mut self, rank: usize) -> Result<()> {
        if self.roster.abandon(rank) {
            tracing::warn!(rank, "the process joining again as rank {rank} went away");
            return Ok(());
        }
        if !self.roster.is_live(rank) {
            return Ok(());
        }
        match &self.phase {
            // A rank process that goes away before training starts (killed while the run of a
            // takeover waits for its survivors, say) leaves its seat to a later process: the
            // others start without it. Host backend only: a collective group forms with it.
            Phase::Starting { .. }
                if self.conduct.is_remote(rank) && self.cfg.spec.backend == Backend::Host =>
            {
                tracing::warn!(
                    rank,
                    "rank {rank}'s process went away while the run was starting: its seat is \
                     left vacant (a process that joins it later is admitted)"
                );
                if let Some(change) = self.roster.vacate(rank, Instant::now()) {
                    self.apply(&change)?;
                }
                if self.roster.live().is_empty() {
                    return Err(Error::PeerGone(Peer::Rank(rank)));
                }
                Ok(())
            }
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
    /// the rank's seat free). Before training starts, a vacant seat's process starts with the
    /// others (host backend); any other is closed. A dead rank's seat starts rejoining; it is
    /// turned away once the run finishes, and on the collective backend unless its groups are
    /// formed through the controller (an MPI world cannot grow).
    pub(super) fn joined(
        &mut self,
        rank: usize,
        frames: Arc<crate::link::frames::Frames>,
    ) -> Result<()> {
        if matches!(self.phase, Phase::Starting { .. }) {
            // A vacant seat (no process at the rendezvous, or its process went away since) is
            // taken before training starts: the process starts with the others, its `Ready`
            // awaited like theirs. Host backend: a collective group forms with its members.
            let vacant = self.roster.standing(rank)
                == Some(crate::runtime::engine::roster::Standing::Vacant);
            if vacant
                && self.cfg.spec.backend == Backend::Host
                && self.link.attach(rank, frames.clone())
                && let Some(change) = self.roster.retake(rank)
            {
                tracing::info!(
                    rank,
                    "a process took rank {rank}'s vacant seat while the run is starting: it \
                     starts with the others"
                );
                self.apply(&change)?;
                return Ok(());
            }
            // Not a refusal for good: closed without a Stop, the process ends with an error
            // and a launcher with restarts left starts it again, once the run may be training
            // (a controller that took over starts while restarted ranks connect).
            tracing::warn!(
                rank,
                "a process joining again as rank {rank} came while the run is starting: closed"
            );
            frames.close();
            return Ok(());
        }
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
            self.link.turn_away(&frames);
            return Ok(());
        }
        if self.roster.is_live(rank) {
            // Its old connection has ended (the controller frees a seat only then), even if
            // its `Gone` was not read yet.
            let failure = RankFailure::from(&Error::PeerGone(Peer::Rank(rank)));
            self.rank_died(rank, FaultCause::Gone, failure)?;
        }
        if !self.link.attach(rank, frames.clone()) {
            self.link.turn_away(&frames);
            return Ok(());
        }
        self.roster.claim(rank);
        tracing::info!(
            rank,
            reduce = self.rounds.reduces,
            "rank {rank} connected again; rejoining"
        );
        Ok(())
    }

    /// A message from a process joining again: its replica is built (`Ready`), or it failed.
    pub(super) fn joining_wire(&mut self, rank: usize, msg: ToCoordinator) -> Result<()> {
        if msg.rank() != rank {
            tracing::warn!(
                rank,
                "the process joining again as rank {rank} sent a message as rank {}",
                msg.rank()
            );
            let _ = self.link.try_send(rank, ToWorker::Stop);
            self.roster.abandon(rank);
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
                    self.roster.abandon(rank);
                } else {
                    self.roster.built(rank);
                    tracing::info!(
                        rank,
                        "rank {rank} is ready; it joins at the end of the next reduce"
                    );
                }
            }
            ToCoordinator::Failed { failure, .. } => {
                tracing::warn!(rank, error = %failure.message, "the process joining again as rank {rank} failed");
                self.roster.abandon(rank);
            }
            _ => {
                if let Some(slot) = self.slots.get_mut(rank) {
                    slot.heard = Instant::now();
                }
            }
        }
        Ok(())
    }

    /// Takes `rank`, waiting to join, back into the run in its window of `round`: the roster
    /// admits it and every book follows (ElChe with a fresh estimate, the dispatcher with work
    /// from the free spans, a fresh slot), and its rejoin is reported as starting from the
    /// consensus of `reduce` reduces. Returns its window; `None` when it was not waiting.
    pub(super) fn admit(&mut self, rank: usize, round: u64, reduce: u64) -> Result<Option<Window>> {
        let Some(change) = self.roster.admit(rank) else { return Ok(None) };
        self.apply(&change)?;
        let window = self.make_windows(round).get(rank).copied().unwrap_or(Window {
            round,
            target: 1,
            limit: 1,
            wall: None,
        });
        if let Some(slot) = self.slots.get_mut(rank) {
            slot.window = window;
        }
        let members = self.roster.live();
        tracing::info!(rank, reduce, ?members, "rank {rank} rejoined at reduce {reduce}");
        let event = RejoinEvent { rank, at_ms: self.clock.at_ms(), reduce, members };
        self.rejoins.push(event.clone());
        let _ = self.outlets.rejoins.try_send(event);
        Ok(Some(window))
    }

    /// Host backend, at the end of a reduce whose consensus is `state`: admits every rank
    /// waiting to join again, which starts from `state` with a fresh optimizer in the window
    /// the others start now.
    pub(super) fn admit_waiting(&mut self, state: &HostState) -> Result<()> {
        for rank in self.roster.waiting() {
            let Some(window) = self.admit(rank, self.rounds.round, self.rounds.reduces)? else {
                continue;
            };
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
    pub(super) fn admit_joiners(&mut self, ending: u64) -> Result<Vec<(usize, ToWorker)>> {
        let mut orders = Vec::new();
        if !self.group.relay {
            return Ok(orders);
        }
        let global_step = self.rounds.global_step;
        for rank in self.roster.waiting() {
            if self.admit(rank, ending, self.rounds.reduces + 1)?.is_none() {
                continue;
            }
            let window = Window { round: ending, target: 0, limit: 0, wall: None };
            orders.push((rank, ToWorker::Join { window, global_step }));
        }
        Ok(orders)
    }

    /// The watch: declares dead a rank silent past the deadline its own windows give
    /// (median + k·MAD, [`DeadlineRule`]) once a ping sent when it went late stays unanswered,
    /// or past the watchdog (the upper bound, and the deadline until its windows calibrate it
    /// or while it evaluates or a checkpoint is captured) — while not inside a collective; one
    /// that has not entered a reduce pending past its deadline; one still inside a reduce a
    /// quarter of the watchdog after its peers' collectives failed (they waited the watchdog
    /// for it); and, as a backstop, one inside its collective for twice the watchdog and a
    /// half. Pings quiet ranks.
    ///
    /// # Errors
    /// As [`rank_died`](Self::rank_died); [`Error::Unrecoverable`] when a reduce stays pending
    /// for [`STALLED_REDUCE`] watchdogs with every rank alive.
    pub(super) fn check_liveness(&mut self) -> Result<()> {
        let after = self.cfg.spec.watchdog;
        let rule = DeadlineRule::default();
        let pending = match &self.reduce {
            Reduce::Collective { round, acks, .. } => {
                self.group.pending_for().map(|d| (d, acks, *round))
            }
            _ => None,
        };
        let peers_gave_up = self.group.failing_for().is_some_and(|d| d > after / 4);
        let capturing = self.saves.capturing.is_some();
        let evaluating = self.eval.rank();
        let now = Instant::now();
        let mut deaths = Vec::new();
        let mut late = Vec::new();
        for rank in self.roster.live() {
            let Some(slot) = self.slots.get_mut(rank) else { continue };
            // A rank whose large frame is still crossing its link is heard.
            if let Some(at) = self.link.arriving(rank) {
                slot.heard = slot.heard.max(at);
            }
            let silent = now.saturating_duration_since(slot.heard);
            let calibrated = !capturing && evaluating != Some(rank);
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
                        if waited > slot.deadline(&rule, after)
                            && acks.get(rank).is_some_and(Option::is_none)
                            && collective != InCollective::Failed =>
                    {
                        Some(FaultCause::MissedReduce { round, after: waited })
                    }
                    _ => match slot.watch(&rule, after, calibrated, now, super::TICK) {
                        Watch::Dead(silent) => Some(FaultCause::Silent { after: silent }),
                        Watch::Late => {
                            late.push(rank);
                            None
                        }
                        Watch::OnTime | Watch::Pinged => None,
                    },
                },
            };
            if let Some(cause) = cause {
                deaths.push((rank, cause, silent));
            }
        }
        for rank in late {
            tracing::info!(rank, "rank {rank} is late past its deadline: pinging it");
            if let Some(slot) = self.slots.get_mut(rank) {
                slot.sent = now;
            }
            // A full queue holds messages already: the rank hears from us anyway.
            let _ = self.link.try_send(rank, ToWorker::Ping);
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
        let mut heard = self.roster.live();
        heard.extend(self.roster.joining());
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

    /// The membership authority: declares `rank` dead for `cause` (`failure` is what the run
    /// returns, as [`Error::Rank`], if this death ends it) and lets the survivors go on. The
    /// roster emits the death and every book follows it (its unfinished chunks go back to the
    /// living, ElChe retires it, a host round stops waiting for it); then a collective group
    /// is aborted and rebuilt from the survivors, who redo an interrupted reduce.
    ///
    /// # Errors
    /// The rank's failure past the failure limit; [`Error::Unrecoverable`] when no rank is left,
    /// or a lone survivor of an NCCL group.
    pub(super) fn rank_died(
        &mut self,
        rank: usize,
        cause: FaultCause,
        failure: RankFailure,
    ) -> Result<()> {
        // Its part of a reduce in progress that the consensus holds already counts for it.
        let held = match &self.reduce {
            Reduce::Collective { acks, .. } => acks.get(rank).copied().flatten().map_or(0, |a| a.0),
            Reduce::Host(hr) => hr.averaging_steps(rank),
            Reduce::Idle => 0,
        };
        let Some(change) = self.roster.die(rank, held) else { return Ok(()) };
        if self.eval.rank() == Some(rank) {
            // Asked again from another live rank.
            self.eval = Evaluation::Idle;
        }
        let Applied { requeued, average } = self.apply(&change)?;
        let survivors = self.roster.live();
        tracing::warn!(rank, %cause, ?survivors, "rank declared dead");
        if let Some(trail) = &mut self.trail {
            trail.died(rank, self.rounds.reduces, held, &requeued);
        }
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
        if self.roster.deaths() > self.cfg.spec.max_failures {
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
        // What the survivors will be handed changed: the dead rank's work is theirs now.
        self.advise(&survivors);
        match self.cfg.spec.backend {
            Backend::Collective => self.regroup(&survivors)?,
            Backend::Host => {
                if let Some(job) = average {
                    self.start_average(job)?;
                }
            }
        }
        self.check_collective_done()?;
        Ok(())
    }

    /// Collective backend: orders the current group aborted (waking anyone blocked in it, the
    /// dead included) and tells `members` to form the next one.
    pub(super) fn regroup(&mut self, members: &[usize]) -> Result<()> {
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
    pub(super) fn regroup_how(&self) -> Result<Regroup> {
        #[cfg(feature = "cuda")]
        if self.group.engine == Engine::Nccl {
            return Ok(Regroup::Nccl(flodl_nccl::UniqueId::new()?));
        }
        Ok(Regroup::Host)
    }

    /// Writes the failure bundle for `reason` (the last bundle this run saved, or its starting
    /// state when it saved none, re-labelled) as `failure.fdlck` next to the step bundles, and
    /// returns its path; `None` when the run has no checkpoint directory or the write fails
    /// (the run's own error is what matters then).
    /// What a job restarted from the last bundle trains again, in words: the reduces and
    /// cohort steps since that bundle, plus the windows in progress (at most one checkpoint
    /// interval when every reduce is saved).
    pub(super) fn work_lost(&self) -> String {
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
}

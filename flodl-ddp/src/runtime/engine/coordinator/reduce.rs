//! The coordinator's reduces: when one is due, triggering it, the host backend's averaging rounds on a helper thread under a deadline, and completing it.

use super::*;
use crate::control::elche::WindowReading;
use crate::control::exposure::{Exposure, RankExposure, reduce_exposed_ms};

impl Coordinator {
    /// Starts a reduce when every rank is ready for it; true when nothing is left to train
    /// (the run finishes). Once the consensus holds every batch of the run, the last epoch's
    /// evaluation is asked for and the run finishes without waiting for the ranks to report
    /// that they are out of work: their last update (or reduce) comes before either order on
    /// their link, and nothing is left for them to train.
    pub(super) fn step_reduce(&mut self) -> Result<bool> {
        let ready: Vec<Option<usize>> =
            self.slots.iter().map(|s| s.ready.map(|r| r.steps)).collect();
        let live: Vec<bool> = (0..ready.len()).map(|r| self.roster.is_live(r)).collect();
        let busy = !matches!(self.reduce, Reduce::Idle);
        match should_reduce(&ready, &live, busy)? {
            Trigger::Fire => {
                let steps: Vec<usize> = ready.iter().map(|s| s.unwrap_or(0)).collect();
                self.trigger(&steps)?;
                return Ok(false);
            }
            Trigger::Idle | Trigger::Waiting { .. } => {}
            Trigger::RoundInFlight | Trigger::NoLiveRank => return Ok(false),
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

    pub(super) fn trigger(&mut self, steps: &[usize]) -> Result<()> {
        let windows: Vec<WindowReading> = (self.slots.iter().zip(steps))
            .map(|(s, &steps)| WindowReading {
                wall_ms: s.ready.map_or(0.0, |r| r.wall_ms),
                steps: steps as u64,
                tail_ms: s.ready.and_then(|r| r.tail_ms),
            })
            .collect();
        self.rounds.walls = windows.iter().map(|w| w.wall_ms).collect();
        let counts = self.planned_counts();
        // ElChe weighs the exchange the ranks could not train through, as they measured it
        // for the last reduce (under `--fragments`, for the last cycle's).
        let ranks: Vec<RankExposure> = (self.slots.iter().zip(&windows))
            .map(|(s, w)| RankExposure {
                exposed_ms: s.ready.and_then(|r| r.exposed_ms),
                steps: w.steps,
                wall_ms: w.wall_ms,
            })
            .collect();
        let exposed = reduce_exposed_ms(&ranks);
        self.rounds.exposed = ranks.iter().map(|r| r.exposed_ms).collect();
        let exposure = match &mut self.staggered {
            Some(staggered) => {
                if let Some(ms) = exposed {
                    staggered.exposed_in(ms);
                }
                staggered.cycle_exposure()
            }
            None => Exposure::new(exposed.into_iter().collect()),
        };
        if let Some(e) = self.cadence.elche.as_mut() {
            e.report_windows(&windows, &exposure)?;
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
        let lowest = self.roster.lowest();
        let evaluator = self.eval.rank();
        match self.cfg.spec.backend {
            Backend::Collective => {
                let mut orders = joiners;
                let joining = orders.len();
                for rank in self.roster.live() {
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
                    let members = self.roster.live();
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
                let fragment = self.synced_part(steps, capture.is_some());
                let capture = capture.as_ref().map(|_| CaptureRequest { model: false });
                let deadline = started + self.cfg.spec.snapshot_timeout;
                let (world, live) = (self.cfg.world(), self.roster.live());
                let mut round = HostRound::new(
                    ending,
                    world,
                    &live,
                    deadline,
                    next.clone(),
                    eval,
                    counts,
                    fragment,
                );
                let (ordered, attempt, job) = match self.rounds.headstart.take() {
                    None => (Vec::new(), 0, None),
                    Some(headstart) => match round.take_headstart(headstart, capture.is_some()) {
                        Taken::Serves { ordered, job } => {
                            self.rounds.ordered_ahead.clone_from(&ordered);
                            (ordered, 0, job)
                        }
                        Taken::Superseded { attempt } => (Vec::new(), attempt, None),
                    },
                };
                for rank in live.into_iter().filter(|r| !ordered.contains(r)) {
                    let snapshot = ToWorker::Snapshot { round: ending, attempt, capture, fragment };
                    self.send(rank, snapshot)?;
                }
                self.reduce = Reduce::Host(round);
                if let Some(job) = job {
                    self.start_average(job)?;
                }
            }
        }
        for (slot, w) in self.slots.iter_mut().zip(next) {
            slot.window = w;
        }
        Ok(())
    }

    /// The part of the model the host round of the current window syncs: under `--fragments`
    /// the next fragment in turn, but the whole model for a checkpoint (`capture`) and for a
    /// reduce that may be the run's last, whose evaluation, final state and final bundle are
    /// then the consensus; `None` (whole) without fragments. `steps` are the ranks' steps
    /// ready (0 for one not ready yet). A rank may train on to its window's limit before the
    /// snapshot order reaches it (a follower's slack, `Async`), so the most it can hold is
    /// what is weighed: a reduce taken for the last that is not costs a whole exchange, never
    /// the consensus of the end.
    fn synced_part(&self, steps: &[usize], capture: bool) -> Option<usize> {
        let most: Vec<usize> = (steps.iter().zip(self.slots.iter()))
            .map(|(&s, slot)| s.max(slot.window.limit))
            .collect();
        let whole = capture || self.dispatch.completes_the_run(&most);
        self.staggered.as_ref().and_then(|s| s.fragment(self.rounds.reduces, whole))
    }

    /// Host backend: orders the snapshot of the anchor `rank`, ready while `waiting` still
    /// train, before the round is triggered, when its window lets it train no more (the
    /// anchor of `Cadence` or `Async`, [`Window::anchored`], without `--overlap`): its state
    /// then travels and is checked while the others finish their batch, instead of after. The
    /// part it syncs is the one the trigger would choose now; should the trigger choose
    /// another (a checkpoint comes due meanwhile), every rank is ordered again
    /// ([`HostRound::take_headstart`]).
    pub(super) fn order_ahead(&mut self, rank: usize, waiting: &[usize]) -> Result<()> {
        let done = self.slots.get(rank).is_some_and(|s| {
            s.window.overshoot() == 0 && s.ready.is_some_and(|r| r.steps >= s.window.limit)
        });
        if self.cfg.spec.backend != Backend::Host
            || self.cfg.spec.overlap.is_some()
            || !matches!(self.reduce, Reduce::Idle)
            || self.rounds.headstart.is_some()
            || waiting.is_empty()
            || !done
        {
            return Ok(());
        }
        let steps: Vec<usize> = self.slots.iter().map(|s| s.ready.map_or(0, |r| r.steps)).collect();
        let fragment = self.synced_part(&steps, false);
        let round = self.rounds.round;
        self.rounds.headstart = Some(Headstart::new(round, fragment, vec![rank]));
        let order = ToWorker::Snapshot { round, attempt: 0, capture: None, fragment };
        self.send(rank, order)
    }

    /// Before ElChe is calibrated, when every live rank but one is ready for the reduce of the
    /// current window, that one is the last the reduce waits for: its window loses its
    /// overshoot ([`Window::anchored`], in this copy and by [`ToWorker::Last`] in the rank's),
    /// so it reports at its target and waits for the order instead of beginning a batch that
    /// every rank would wait for. It is the calibrated anchor's rule for the windows with no
    /// anchor yet: in a probe the slowest rank began one more of its batches past its count
    /// while the fast ones waited in the reduce. (Once calibrated the anchor is anchored
    /// already, and a follower told it is due keeps the overshoot `Async` gives it.)
    pub(super) fn hold_the_last(&mut self) -> Result<()> {
        if self.paced_by().is_some() {
            return Ok(());
        }
        let round = self.rounds.round;
        let mut short = (self.roster.live().into_iter())
            .filter(|&r| self.slots.get(r).is_some_and(|s| s.ready.is_none()));
        let (Some(last), None) = (short.next(), short.next()) else { return Ok(()) };
        let Some(slot) = self.slots.get_mut(last) else { return Ok(()) };
        if slot.window.overshoot() == 0 {
            return Ok(());
        }
        slot.window = slot.window.anchored();
        self.send(last, ToWorker::Last { round })
    }

    /// Host backend: the helper thread's average for `round` is in. When it completes the
    /// pending round: the outer step, the checkpoint in capture, and the update to every rank.
    pub(super) fn averaged(
        &mut self,
        round: u64,
        state: Result<HostState>,
        divergence: Option<f64>,
    ) -> Result<()> {
        let Reduce::Host(hr) = &mut self.reduce else { return Ok(()) };
        let Some(done) = hr.averaged(round) else { return Ok(()) };
        let mut state = state?;
        self.outer_step(&mut state)?;
        // Under `--fragments` the average is one fragment's part: the consensus takes it.
        let fragment = done.fragment;
        let whole = match (fragment, &self.staggered, self.consensus.take()) {
            (Some(k), Some(staggered), Some(mut consensus)) => {
                staggered.cut.put(k, state.clone(), &mut consensus)?;
                consensus
            }
            _ => state.clone(),
        };
        // The ranks are paused since their snapshots: the book is at the cut.
        if self.saves.capturing.as_ref().is_some_and(|c| c.round == done.round) {
            // The reduce is completed below: it counts in the bundle (a whole sync: see
            // `Staggered::fragment`).
            self.finish_capture(Some(&whole), self.rounds.reduces + 1)?;
        }
        let evaluator = self.eval.rank();
        let global_step = self.rounds.global_step;
        // Each rank's update is a copy of the average, the last one the average itself.
        let live = self.roster.live();
        let mut average = state;
        for (i, &rank) in live.iter().enumerate() {
            let eval = if Some(rank) == evaluator { done.eval } else { None };
            let next = done.next[rank];
            let state = match i + 1 == live.len() {
                true => std::mem::take(&mut average),
                false => average.clone(),
            };
            self.send(rank, ToWorker::Update { state, next, eval, global_step, fragment })?;
        }
        let sync_ms = done.started.elapsed().as_secs_f64() * 1000.0;
        // The steps the divergence spans: a fragment's since its last sync.
        let span = match (fragment, &self.staggered) {
            (Some(k), Some(s)) => s.unsynced.weights(k, &done.steps).into_iter().max(),
            _ => None,
        };
        let divergence = divergence.map(|d| (d, span));
        if let Some(staggered) = &mut self.staggered {
            staggered.unsynced.synced(fragment, &done.steps);
            for rank in self.roster.waiting() {
                staggered.unsynced.restart(rank);
            }
        }
        self.complete_reduce(done.round, done.counts, done.steps, sync_ms, divergence);
        self.admit_waiting(&whole)?;
        self.consensus = Some(whole);
        // A standby resumes from the consensus alone: it is a cut of the run only when every
        // fragment was synced.
        if fragment.is_some() {
            return Ok(());
        }
        self.mirror_cut()
    }

    /// Host backend under `--fragments`: cuts the starting (or resumed) `state` into the
    /// fragments; nothing trained yet.
    ///
    /// # Errors
    /// [`crate::LogicError::TooManyFragments`] for more fragments than parameter values.
    pub(super) fn stagger(&mut self, state: &HostState) -> Result<()> {
        if self.cfg.spec.fragments > 1 {
            let world = self.cfg.world();
            self.staggered = Some(Staggered::new(state, self.cfg.spec.fragments, world)?);
        }
        Ok(())
    }

    /// Under `--fragments`, the final state. After a whole sync (the run's last reduce is one,
    /// see `trigger`) every live rank holds the consensus: the lowest live rank's state, as
    /// without fragments. Otherwise (a safety net: a rank's steps not synced) each fragment
    /// is the average of the live ranks' final states weighted by the steps since it was last
    /// synced (equal when none), so every rank's work since then is in it; buffers as
    /// fragment 0's average has them.
    ///
    /// # Errors
    /// [`Error::PeerGone`] without the lowest rank's state; a layout that does not fit.
    pub(super) fn final_average(
        &self,
        staggered: &Staggered,
        finals: &[Option<HostState>],
        lowest: usize,
    ) -> Result<HostState> {
        let Some(Some(own)) = finals.get(lowest) else {
            return Err(Error::PeerGone(Peer::Rank(lowest)));
        };
        let live = self.roster.live();
        if live.iter().all(|&r| staggered.unsynced.is_synced(r)) {
            return Ok(own.clone());
        }
        let (ranks, states): (Vec<usize>, Vec<HostState>) = live
            .into_iter()
            .filter_map(|r| finals.get(r).cloned().flatten().map(|s| (r, s)))
            .unzip();
        let zeros = vec![0; self.cfg.world()];
        let weights: Vec<Vec<usize>> = (0..staggered.cut.len())
            .map(|k| {
                let since = staggered.unsynced.weights(k, &zeros);
                ranks.iter().map(|&r| since.get(r).copied().unwrap_or(0)).collect()
            })
            .collect();
        average_fragments(&states, &staggered.cut, &weights, self.cfg.spec.gamma)
    }

    /// Host backend: replaces the average's parameters by the outer optimizer's step on them
    /// (a no-op for plain averaging).
    pub(super) fn outer_step(&mut self, state: &mut HostState) -> Result<()> {
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

    /// Soft-aborts a host round whose snapshots are late and asks again. A snapshot whose bytes
    /// are still coming is not late: the deadline counts from the last of them.
    pub(super) fn check_host_deadline(&mut self) -> Result<()> {
        let Reduce::Host(hr) = &mut self.reduce else { return Ok(()) };
        let missing = hr.missing();
        let timeout = self.cfg.spec.snapshot_timeout;
        for &rank in &missing {
            if let Some(at) = self.link.arriving(rank) {
                hr.arriving(rank, at, timeout);
            }
        }
        let age = hr.age();
        let Some((round, attempt)) = hr.retry_if_late(timeout) else {
            return Ok(());
        };
        self.rounds.stalled += 1;
        tracing::warn!(
            round,
            attempt,
            "host averaging round missed its snapshot deadline; retrying"
        );
        if self.rounds.stalled >= self.cfg.spec.max_stalled_rounds {
            if !missing.is_empty() && missing.len() < self.roster.live().len() {
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
        let fragment = match &self.reduce {
            Reduce::Host(hr) => hr.fragment(),
            _ => None,
        };
        for rank in self.roster.live() {
            self.send(rank, ToWorker::Snapshot { round, attempt, capture, fragment })?;
        }
        Ok(())
    }

    /// Completes the reduce of `round`: the guard hears `divergence` (with the steps it spans;
    /// `None`: the window's largest count), and the books, the ledger and the handle hear the
    /// reduce.
    pub(super) fn complete_reduce(
        &mut self,
        round: u64,
        counts: Vec<usize>,
        steps: Vec<usize>,
        sync_ms: f64,
        divergence: Option<(f64, Option<usize>)>,
    ) {
        self.reduce = Reduce::Idle;
        self.group.reduce_done(&mut self.slots);
        let cadence = &mut self.cadence;
        let divergence = divergence.map(|(d, span)| {
            (d, span.unwrap_or_else(|| steps.iter().copied().max().unwrap_or(0)) as u64)
        });
        if let Some((divergence, k_max)) = divergence {
            let verdict = cadence.guard.report(&ReduceReport { divergence, k_max });
            cadence.verdict = verdict;
            tracing::debug!(round, divergence, ?verdict, "divergence guard");
            let _ = self.outlets.guards.try_send(GuardEvent { round, divergence, k_max, verdict });
        }
        if self.cfg.spec.policy == Policy::Async {
            // Stable grows an auto bound, NudgeDown resets it; a guard that is off reads Stable,
            // a reduce it did not measure holds the bound.
            match (divergence.map(|(d, _)| d), &cadence.guard) {
                (Some(_), _) => cadence.overshoot.apply_verdict(cadence.verdict),
                (None, Guard::Off) => cadence.overshoot.apply_verdict(Verdict::Stable),
                (None, _) => {}
            }
        }
        self.rounds.stalled = 0;
        self.rounds.reduces += 1;
        self.rounds.completed_at = Instant::now();
        self.conduct.reduced(round, &steps);
        self.dispatch.add_reduce(sync_ms, &steps);
        if let Some(trail) = &mut self.trail {
            trail.reduced(self.rounds.reduces, &steps);
        }
        let event = ReduceEvent {
            round,
            epoch: self.dispatch.oldest().min(self.cfg.spec.epochs.saturating_sub(1)),
            at_ms: self.clock.at_ms(),
            anchor: self.cadence.elche.as_ref().map_or(1, ElChe::anchor),
            counts,
            steps,
            walls_ms: std::mem::take(&mut self.rounds.walls),
            exposed_ms: std::mem::take(&mut self.rounds.exposed),
            sync_ms,
            wire: {
                let fresh = vec![Default::default(); self.rounds.wire.len()];
                std::mem::replace(&mut self.rounds.wire, fresh)
            },
            ordered_ahead: std::mem::take(&mut self.rounds.ordered_ahead),
        };
        tracing::debug!(round, sync_ms, "reduce done");
        // Dropped when the handle does not drain its queue: events are for reports only.
        let _ = self.outlets.reduces.try_send(event);
    }

    /// Completes the pending collective reduce once every live rank acknowledged it.
    pub(super) fn check_collective_done(&mut self) -> Result<()> {
        let mut done = None;
        if let Reduce::Collective { round, acks, counts } = &mut self.reduce {
            let live = self.roster.live();
            if live.iter().all(|&r| acks.get(r).is_some_and(Option::is_some)) {
                let steps = acks.iter().map(|a| a.map_or(0, |a| a.0)).collect::<Vec<_>>();
                let sync = acks.iter().flatten().map(|a| a.1).fold(0.0, f64::max);
                let div = acks.iter().flatten().filter_map(|a| a.2).reduce(f64::max);
                done = Some((*round, std::mem::take(counts), steps, sync, div));
            }
        }
        if let Some((round, counts, steps, sync, div)) = done {
            self.complete_reduce(round, counts, steps, sync, div.map(|d| (d, None)));
            if self.saves.capturing.as_ref().is_some_and(|c| c.round == round) {
                // Every live rank is paused since its acknowledgement: the book is at the cut.
                self.finish_capture(None, self.rounds.reduces)?;
                for rank in self.roster.live() {
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
    pub(super) fn check_futile_reduce(&mut self) -> Result<()> {
        if !matches!(self.reduce, Reduce::Collective { .. })
            || !self.slots.all_failed(&self.roster.live())
        {
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
        let members = self.roster.live();
        self.regroup(&members)
    }

    /// Host backend: averages `job` on a helper thread, which reports
    /// [`Local::Averaged`]. When none of the ranks left in the round stepped (the one that did
    /// died), their snapshots are averaged equally.
    pub(super) fn start_average(&mut self, mut job: AverageJob) -> Result<()> {
        // A fragment's average weighs each rank by its steps since that fragment's last sync;
        // a whole sync under `--fragments` averages each fragment by its own.
        let mut by_fragment = None;
        if let Some(staggered) = &self.staggered {
            let mut steps = vec![0; self.cfg.world()];
            for (&rank, &n) in job.ranks.iter().zip(&job.steps) {
                if let Some(s) = steps.get_mut(rank) {
                    *s = n;
                }
            }
            let weights = |k: usize| -> Vec<usize> {
                let since = staggered.unsynced.weights(k, &steps);
                job.ranks.iter().map(|&r| since.get(r).copied().unwrap_or(0)).collect()
            };
            match job.fragment {
                Some(k) => job.steps = weights(k),
                None => {
                    let all: Vec<Vec<usize>> = (0..staggered.cut.len()).map(weights).collect();
                    by_fragment = Some((staggered.cut.clone(), all));
                }
            }
        }
        if job.steps.iter().all(|&s| s == 0) {
            job.steps.iter_mut().for_each(|s| *s = 1);
        }
        let tx = self.local.clone();
        let gamma = self.cfg.spec.gamma;
        // Under `--fragments` the guard follows one series: fragment 0's (fragments are of
        // equal size), each measured over the steps since its last sync (a whole sync is not).
        let series = match (job.fragment, &self.staggered) {
            (Some(k), _) => k == 0,
            (None, staggered) => staggered.is_none(),
        };
        let measure = self.cfg.measures_divergence() && series;
        std::thread::Builder::new()
            .name("flodl-host-average".into())
            .spawn(move || {
                let state = match &by_fragment {
                    Some((cut, weights)) => average_fragments(&job.states, cut, weights, gamma),
                    None => average(&job.states, &job.steps, gamma),
                };
                let divergence = match &state {
                    Ok(avg) if measure => Some(divergence(&job.states, &job.steps, avg)),
                    _ => None,
                };
                let round = job.round;
                let _ = tx.send(Local::Averaged { round, state, divergence });
            })
            .map_err(|source| Error::Spawn { what: "the averaging thread", source })?;
        Ok(())
    }
}

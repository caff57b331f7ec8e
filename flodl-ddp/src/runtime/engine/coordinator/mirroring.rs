//! The coordinator's side of the standby's lane: the seats published at every change of the
//! live set, the books at every completed host reduce's cut; in a cluster run, the lane's
//! frames carried to the standby rank's process over its link.

use super::*;
use crate::runtime::engine::standby::{
    ControllerState, Cut, CutParts, MirrorBody, Pump, Reach, StandbyLane, Term,
};

impl Coordinator {
    /// Opens the standby's lane when the run has a standby (the first frame is the whole
    /// state): the lane a caller gave, or in a cluster run the one to the standby rank's
    /// process.
    pub(super) fn open_standby(&mut self) {
        let tx = match (self.cfg.standby.clone(), self.cfg.spec.standby_rank()) {
            (Some(tx), _) => tx,
            (None, Some(rank)) if self.cfg.own.is_some() => {
                let (pump, tx) = Pump::to(rank);
                self.pump = Some(pump);
                self.link.watch(rank);
                tracing::info!(rank, "the controller's state is mirrored to rank {rank}'s process");
                tx
            }
            (None, _) => return,
        };
        // Under `--fragments` only a whole sync is a cut of the run: a reduce that saves a
        // checkpoint, and the run's last.
        let saves = self.cfg.checkpoints.as_ref().is_some_and(|c| c.interval.is_periodic());
        if self.cfg.spec.backend == Backend::Host && self.cfg.spec.fragments > 1 && !saves {
            tracing::warn!(
                fragments = self.cfg.spec.fragments,
                "the standby can take over only from a whole sync, which under fragments is a \
                 reduce that saves a checkpoint, and this run saves none before its end: give \
                 it periodic saves (fdl train --checkpoint-every-reduces N)"
            );
        }
        let state = ControllerState::new(Term(self.cfg.spec.term), self.roster.standings());
        self.standby = Some(StandbyLane::new(state, tx));
        // The whole state goes out at once: the standby knows the run from its start.
        self.mirror_seats();
    }

    /// Publishes the seats' standings to the standby, if any.
    pub(super) fn mirror_seats(&mut self) {
        let seats = self.roster.standings();
        if let Some(lane) = &mut self.standby {
            lane.publish(MirrorBody::Seats(seats));
        }
        self.pump_standby();
    }

    /// Forwards the lane's queued frames to the standby rank's process. A standby whose link is
    /// gone is sent nothing (the run goes on with no standby, and says so) until a process for
    /// its seat is admitted again, which is sent the whole state; so is a seat with no process
    /// taking part yet (one that died before a takeover joins the new term later).
    pub(super) fn pump_standby(&mut self) {
        use crate::runtime::engine::roster::Standing;
        let Some(pump) = &mut self.pump else { return };
        let standing = self.roster.standing(pump.rank);
        let alive = standing == Some(Standing::Alive);
        // A process admitted (the first, or one after the link went) is sent the whole state.
        let admitted = match (pump.reach, alive) {
            (Reach::Up, true) | (Reach::Awaited, false) => false,
            (Reach::Up, false) => {
                if standing == Some(Standing::Dead) {
                    standby_gone(pump.rank);
                }
                pump.reach = Reach::Lost { down: true };
                false
            }
            (Reach::Awaited, true) => {
                tracing::info!(rank = pump.rank, "the standby joined: it is sent the whole state");
                true
            }
            (Reach::Lost { down: true }, true) => {
                tracing::warn!(rank = pump.rank, "the standby is back: it is sent the whole state");
                true
            }
            (Reach::Lost { down }, alive) => {
                pump.reach = Reach::Lost { down: down || !alive };
                false
            }
        };
        if admitted {
            pump.reach = Reach::Up;
            // The whole state supersedes the changes queued meanwhile (the one announcing this
            // very admission among them), which would otherwise reach the process first.
            pump.held = None;
            pump.rx.drain().for_each(drop);
            if let Some(lane) = &mut self.standby {
                lane.resync();
            }
        }
        if pump.reach != Reach::Up {
            // Its frames would reach no process, or one that missed the whole state.
            pump.held = None;
            pump.rx.drain().for_each(drop);
            return;
        }
        while let Some(frame) = pump.held.take().or_else(|| pump.rx.try_recv().ok()) {
            match self.link.try_send(pump.rank, ToWorker::Mirror { frame: frame.clone() }) {
                Ok(()) => {}
                Err(LinkError::Full | LinkError::Timeout(_)) => {
                    pump.held = Some(frame);
                    return;
                }
                Err(LinkError::Gone) => {
                    standby_gone(pump.rank);
                    pump.reach = Reach::Lost { down: false };
                    pump.rx.drain().for_each(drop);
                    return;
                }
            }
        }
    }

    /// Host backend: publishes the books at the cut of the reduce just completed (every rank
    /// is paused from its snapshot until its update, so the dispatcher's completed ranges are
    /// exactly what the consensus holds). The collective backend's ranks do not pause, so its
    /// cut is not mirrored yet.
    pub(super) fn mirror_cut(&mut self) -> Result<()> {
        if self.standby.is_none() || self.cfg.spec.backend != Backend::Host {
            return Ok(());
        }
        let mut epochs = self.epochs.emitted.clone();
        epochs.extend(self.epochs.held.iter().map(|h| h.metrics.clone()));
        // The standby's rank was just sent this consensus (an update goes to every live rank
        // before the cut is published, and the mirror's frames follow it on the same bulk
        // lane): over an f32 wire those very bits, under a quantized one the connection's view,
        // within the controller's error feedback of them. The cut names what the rank holds by
        // digest; at a takeover the standby resumes from it (under a quantized wire the
        // feedback, under half a quantization step per value, is what is lost). The standby's
        // mirror checks the digest, so an update that overtook its frame is caught, never
        // taken for it.
        let sent = self
            .pump
            .as_ref()
            .filter(|pump| self.roster.live().contains(&pump.rank))
            .and_then(|_| self.link.watched());
        match sent {
            Some(_) => tracing::debug!("a cut names the consensus the standby's rank holds"),
            None => tracing::debug!("a cut carries the consensus"),
        }
        let parts = CutParts {
            reduces: self.rounds.reduces,
            global_step: self.rounds.global_step,
            seed: self.cfg.spec.seed,
            guard: &self.cadence.guard,
            outer: outer_state(&self.outer.optimizer, &self.outer.cpu)?,
            consensus: self.consensus.as_ref(),
            sent,
            epochs,
            shapes: &self.shapes,
        };
        let cut = Cut::of(&self.dispatch, self.cadence.elche.as_ref(), parts)?;
        if let Some(lane) = &mut self.standby {
            lane.publish(MirrorBody::Cut(Box::new(cut)));
        }
        self.pump_standby();
        Ok(())
    }
}

/// Says that the standby rank's process is gone and the run goes on without one.
fn standby_gone(rank: usize) {
    tracing::warn!(rank, "the standby is gone: the run goes on with no standby");
}

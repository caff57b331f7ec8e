//! The coordinator's side of the standby's lane: the seats published at every change of the
//! live set, the books at every completed host reduce's cut.

use super::*;
use crate::runtime::engine::standby::{
    ControllerState, Cut, CutParts, MirrorBody, StandbyLane, Term,
};

impl Coordinator {
    /// Opens the standby's lane when the run has a standby (the first frame is the whole
    /// state).
    pub(super) fn open_standby(&mut self) {
        if let Some(tx) = self.cfg.standby.clone() {
            let state = ControllerState::new(Term::default(), self.roster.standings());
            self.standby = Some(StandbyLane::new(state, tx));
            // The whole state goes out at once: the standby knows the run from its start.
            self.mirror_seats();
        }
    }

    /// Publishes the seats' standings to the standby, if any.
    pub(super) fn mirror_seats(&mut self) {
        let seats = self.roster.standings();
        if let Some(lane) = &mut self.standby {
            lane.publish(MirrorBody::Seats(seats));
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
        let parts = CutParts {
            reduces: self.rounds.reduces,
            global_step: self.rounds.global_step,
            seed: self.cfg.spec.seed,
            guard: &self.cadence.guard,
            outer: outer_state(&self.outer.optimizer, &self.outer.cpu)?,
            consensus: self.consensus.as_ref(),
            epochs,
            shapes: &self.shapes,
        };
        let cut = Cut::of(&self.dispatch, self.cadence.elche.as_ref(), parts)?;
        if let Some(lane) = &mut self.standby {
            lane.publish(MirrorBody::Cut(Box::new(cut)));
        }
        Ok(())
    }
}

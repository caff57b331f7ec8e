//! The coordinator's checkpoints: when one is due, the starting bundle, the ranks' captured parts assembled and saved, and the bundle a failed run leaves.

use super::*;

impl Coordinator {
    /// Why a checkpoint is due at the reduce being started, if one is.
    pub(super) fn save_due(&mut self) -> Option<SaveReason> {
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
    pub(super) fn starting_bundle(&self, initial: &HostState) -> Result<Checkpoint> {
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
    pub(super) fn take_capture(&mut self, rank: usize, round: u64, part: Option<Box<RankCapture>>) {
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
    pub(super) fn finish_capture(
        &mut self,
        consensus: Option<&HostState>,
        reduces: u64,
    ) -> Result<()> {
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
        if let Some(drill) = &mut self.drill {
            drill.reach(super::drill::HoldAt::Checkpoint, epoch);
        }
        let bundle = save(plan, &ckpt, None)?;
        self.saves.epochs_saved = self.saves.epochs_saved.max(epoch);
        self.saves.last_bundle = Some(ckpt);
        if c.stop {
            tracing::info!(path = %bundle.display(), "stopping at a checkpoint, as asked");
            return Err(Error::Stopped { bundle });
        }
        Ok(())
    }

    pub(super) fn save_failure_bundle(&mut self, reason: SaveReason) -> Option<std::path::PathBuf> {
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

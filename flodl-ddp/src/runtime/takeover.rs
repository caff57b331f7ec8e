//! A standby's takeover: what a standby rank's process mirrors of its controller's state, and
//! the bundle, term and survivors a controller taking over from it starts with.
//!
//! Failure model: crash-stop. A controller whose process died (its connections closed) or that
//! stayed silent past the ranks' deadlines is taken to be dead; the standby then declares the
//! next term and binds an address every rank was told at launch. The term is part of the
//! spec's hash that every rank proves at the hello, so a rank joins a controller of its own
//! term only, and the mirror refuses frames of an older term. A controller that is alive but
//! cut off is not detected as such: once its ranks have followed the standby it reaches none
//! of them (they closed its connections and dial the standby's address only), so it stalls
//! and its run ends on its own deadlines — but ranks that still reach it and not the standby
//! keep training for it, and that run's outputs are not the standby's.

use crate::Result;
use crate::checkpoint::Checkpoint;
use crate::runtime::engine::capture::takeover_bundle;
use crate::runtime::engine::standby::SharedMirror;
use crate::runtime::spec::RunSpec;

/// What a standby rank's process mirrors of its controller's state (see
/// [`crate::RankHandle::standby_mirror`]).
#[derive(Debug, Clone)]
pub struct StandbyMirror {
    shared: SharedMirror,
}

/// How a standby takes over from its controller's last mirrored cut.
#[derive(Debug)]
pub struct Takeover {
    /// The bundle the new controller resumes from: the consensus of the last reduce the
    /// standby heard of, with the dispatcher's coverage, ElChe, the guard and the epochs so
    /// far (the ranks' inner optimizer states are not in it: they start afresh).
    pub bundle: Checkpoint,
    /// The new controller's term (one more than the dead controller's).
    pub term: u64,
    /// Reduces the bundle's consensus holds.
    pub reduces: u64,
    /// The ranks alive when the controller was last heard, other than the one whose process
    /// hosted it: the ranks the new controller waits for.
    pub survivors: Vec<usize>,
}

impl StandbyMirror {
    pub(crate) fn new(shared: SharedMirror) -> StandbyMirror {
        StandbyMirror { shared }
    }

    /// The takeover into a run of `spec` (the run's spec: every process agrees on it), from the
    /// last cut mirrored; `None` before the first completed reduce reached the standby (there
    /// is then no consensus to go on from).
    ///
    /// # Errors
    /// A checkpoint error when the cut does not make a bundle (no consensus, shapes that do
    /// not fit it).
    pub fn takeover(&self, spec: &RunSpec) -> Result<Option<Takeover>> {
        let Some(state) = self.shared.state() else { return Ok(None) };
        let Some(cut) = &state.cut else { return Ok(None) };
        let bundle = takeover_bundle(spec, cut)?;
        let dead = spec.term_host(state.term.0);
        let survivors = (0..state.seats.len())
            .filter(|&r| Some(r) != dead && state.seats[r].is_live())
            .collect();
        Ok(Some(Takeover { bundle, term: state.term.next().0, reduces: cut.reduces, survivors }))
    }
}

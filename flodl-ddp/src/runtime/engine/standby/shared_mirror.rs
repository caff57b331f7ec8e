//! The standby process's mirror, shared between the rank's loop that folds the frames in and
//! the process that takes over from it once the controller is gone.

use std::sync::{Arc, Mutex};

use crate::runtime::engine::standby::controller_state::ControllerState;
use crate::runtime::engine::standby::mirror::{Mirror, MirrorError};
use crate::runtime::engine::standby::term::Term;

/// A [`Mirror`] behind a lock, cloned into each holder.
#[derive(Debug, Clone)]
pub(crate) struct SharedMirror {
    inner: Arc<Mutex<Mirror>>,
}

impl SharedMirror {
    /// An empty mirror of a run of `world` seats, obeying controllers of `term` and later.
    pub(crate) fn new(world: usize, term: Term) -> SharedMirror {
        SharedMirror { inner: Arc::new(Mutex::new(Mirror::new(world, term))) }
    }

    /// Folds in one frame ([`Mirror::accept`]).
    ///
    /// # Errors
    /// As [`Mirror::accept`]; a poisoned lock is taken over (the mirror checks every frame
    /// whole before it changes, so no half-folded state is left behind).
    pub(crate) fn accept(&self, bytes: &[u8]) -> Result<(), MirrorError> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).accept(bytes)
    }

    /// Keeps the state the standby's rank was just sent ([`Mirror::hold`]).
    pub(crate) fn hold(&self, state: crate::state::HostState) {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).hold(state);
    }

    /// The state mirrored so far (`None` before the first whole state).
    pub(crate) fn state(&self) -> Option<ControllerState> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).state().cloned()
    }
}

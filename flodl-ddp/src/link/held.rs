//! A starting state the receiving end of a connection holds already, so that the controller's
//! `Init` names it by digest instead of carrying it.
//!
//! Every rank builds its replica from the run's seed, so on a fresh start the state the
//! controller sends each rank (rank 0's) is, bit for bit, the one the rank built. A rank in a
//! process of its own offers its built state to its end of the connection and tells the
//! controller its digest in `Ready`; when the `Init` the controller sends is that state, the
//! frame carries the digest and the vectors' lengths instead of the values, and the rank's end
//! puts the offered state back in. Over a slow link this saves a whole model's transfer per
//! rank before anyone trains (80 MB at 100 Mbit/s: 6.4 s, shared by every rank behind it). A
//! resumed run's `Init` (the bundle's consensus) or a rejoining rank's (the consensus of the
//! moment) is another state: it travels whole.
//!
//! The digest is [`HostState::digest`] (SHA-256 of every value): a frame naming a digest the
//! receiving end does not hold is a protocol error, never a state made up.

use crate::state::HostState;

/// A starting state one end of a connection knows the receiving end holds: see the module
/// docs.
#[derive(Debug)]
pub(crate) struct Held {
    /// The state's [`HostState::digest`].
    digest: [u8; 32],
    /// The state itself, at the end that holds it (the rank's); none at the controller's.
    state: Option<HostState>,
}

impl Held {
    /// The rank's end: `state` is its own, offered to be named; returns it with its digest.
    pub(crate) fn own(state: HostState) -> Held {
        Held { digest: state.digest(), state: Some(state) }
    }

    /// The controller's end: the rank said it holds a state of `digest`.
    pub(crate) fn peer(digest: [u8; 32]) -> Held {
        Held { digest, state: None }
    }

    /// The held state's digest.
    pub(crate) fn digest(&self) -> [u8; 32] {
        self.digest
    }

    /// Whether `state` is the held one (its digest computed here).
    pub(crate) fn is(&self, state: &HostState) -> bool {
        state.digest() == self.digest
    }

    /// The held state, for a frame that names `digest`; it is given once.
    pub(crate) fn take(&mut self, digest: &[u8; 32]) -> Option<HostState> {
        if *digest != self.digest {
            return None;
        }
        self.state.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rank's end gives its state once, and only for its own digest; the controller's
    /// end recognises the same state by value and no other.
    #[test]
    fn a_held_state_is_named_by_its_digest_only() -> Result<(), String> {
        let state = HostState { params: vec![vec![0.5, -1.0]], buffers: vec![vec![2.0]] };
        let mut other = state.clone();
        other.params[0][1] = -1.0 + f32::EPSILON;
        let mut own = Held::own(state.clone());
        let peer = Held::peer(own.digest());
        if !peer.is(&state) || peer.is(&other) {
            return Err("the controller's end told the states apart wrongly".into());
        }
        if own.take(&other.digest()).is_some() {
            return Err("a state given for another digest".into());
        }
        if own.take(&state.digest()) != Some(state.clone()) {
            return Err("the held state not given for its digest".into());
        }
        if own.take(&state.digest()).is_some() {
            return Err("the held state given twice".into());
        }
        Ok(())
    }
}

//! The standby's lane: the frames a controller streams to its standby as its state changes —
//! every roster change and every completed reduce — numbered and stamped with its term. Its
//! own lane, apart from the ranks' links, so the mirror never holds up (or is held up by) a
//! rank's traffic.

use serde::{Deserialize, Serialize};

use crate::runtime::engine::roster::Standing;
use crate::runtime::engine::standby::controller_state::{ControllerState, Cut, CutConsensus};
use crate::runtime::engine::standby::term::Term;

/// Frames the lane holds before the controller's end counts the standby as behind.
const LANE: usize = 64;

/// One change of the controller's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum MirrorBody {
    /// The seats' standings changed (a death, a seat left vacant, a join): the standings now.
    Seats(Vec<Standing>),
    /// A reduce completed: the books at its cut.
    Cut(Box<Cut>),
    /// The whole state, sent first and whenever a change could not be queued (so a standby that
    /// fell behind catches up without a gap it cannot see).
    Whole(ControllerState),
}

/// A change as it travels: the controller's term and the change's number in the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MirrorFrame {
    pub(crate) term: Term,
    /// Numbers grow by one per change the controller published (queued or not).
    pub(crate) seq: u64,
    pub(crate) body: MirrorBody,
}

/// The bincode configuration of the lane's frames.
pub(crate) fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// The controller's end of the lane: it never waits for the standby.
#[derive(Debug)]
pub(crate) struct StandbyLane {
    state: ControllerState,
    seq: u64,
    /// A change was not queued: the next frame is the whole state.
    behind: bool,
    tx: flume::Sender<Vec<u8>>,
}

impl StandbyLane {
    /// The two ends of a lane: the standby's receiving end takes [`LANE`] frames at most.
    pub(crate) fn channel() -> (flume::Sender<Vec<u8>>, flume::Receiver<Vec<u8>>) {
        flume::bounded(LANE)
    }

    /// A lane from a controller whose state starts as `state`, sending into `tx` (made by
    /// [`StandbyLane::channel`]); its first frame is the whole state.
    pub(crate) fn new(state: ControllerState, tx: flume::Sender<Vec<u8>>) -> StandbyLane {
        StandbyLane { state, seq: 0, behind: true, tx }
    }

    /// The state as published so far.
    #[cfg(test)]
    pub(crate) fn state(&self) -> &ControllerState {
        &self.state
    }

    /// Publishes `body`: folds it into the state and queues it (the whole state when the
    /// standby is behind). A full lane or a gone standby is logged, never waited for.
    pub(crate) fn publish(&mut self, body: MirrorBody) {
        fold(&mut self.state, body.clone());
        let body = if self.behind { MirrorBody::Whole(self.state.clone()) } else { body };
        self.send(body);
    }

    /// Sends the whole state when a change was not queued (called at every tick of the
    /// controller, so the standby catches up even when no change follows).
    pub(crate) fn flush(&mut self) {
        if self.behind {
            self.send(MirrorBody::Whole(self.state.clone()));
        }
    }

    /// The standby's process was replaced: the next frame is the whole state. A cut in it that
    /// names its consensus by digest named what the old process held, which the new one never
    /// did: that cut is dropped, and the next reduce's cut (which carries its consensus, or
    /// names the update the new process was sent) completes the mirror.
    pub(crate) fn resync(&mut self) {
        let named = |cut: &Cut| matches!(cut.consensus, CutConsensus::Sent { .. });
        if self.state.cut.as_deref().is_some_and(named) {
            self.state.cut = None;
        }
        self.behind = true;
        self.flush();
    }

    /// Numbers `body` and queues it without waiting.
    fn send(&mut self, body: MirrorBody) {
        self.seq += 1;
        let frame = MirrorFrame { term: self.state.term, seq: self.seq, body };
        let bytes = match bincode::serde::encode_to_vec(&frame, config()) {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::warn!(%error, "a change of the controller's state did not encode");
                self.behind = true;
                return;
            }
        };
        match self.tx.try_send(bytes) {
            Ok(()) => self.behind = false,
            Err(flume::TrySendError::Full(_)) => {
                if !self.behind {
                    tracing::warn!(
                        seq = self.seq,
                        "the standby is behind: it will be sent the whole state"
                    );
                }
                self.behind = true;
            }
            Err(flume::TrySendError::Disconnected(_)) => {
                if !self.behind {
                    tracing::warn!("the standby is gone: the run goes on with no standby");
                }
                self.behind = true;
            }
        }
    }
}

/// Folds one change into a state: the one rule both ends apply.
pub(crate) fn fold(state: &mut ControllerState, body: MirrorBody) {
    match body {
        MirrorBody::Seats(seats) => state.seats = seats,
        MirrorBody::Cut(cut) => state.cut = Some(cut),
        MirrorBody::Whole(whole) => *state = whole,
    }
}

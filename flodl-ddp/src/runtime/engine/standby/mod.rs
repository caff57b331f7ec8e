//! Failover: the controller's state as one serializable value, the term that orders
//! controllers, the lane that streams the state's changes to a standby, the standby's mirror
//! of it (`capture::takeover_bundle` makes a bundle of its cut), the pump that carries the lane
//! to a standby rank's process, and the mirror a standby
//! rank's process shares between its rank and its takeover (`runtime/takeover.rs`).

mod controller_state;
mod lane;
mod mirror;
mod pump;
mod shared_mirror;
mod term;

pub(crate) use controller_state::{ControllerState, Cut, CutParts};
pub(crate) use lane::{MirrorBody, StandbyLane};
#[cfg(test)]
pub(crate) use mirror::Mirror;
pub(crate) use pump::{Pump, Reach};
pub(crate) use shared_mirror::SharedMirror;
pub(crate) use term::Term;

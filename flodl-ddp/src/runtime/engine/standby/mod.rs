//! Failover's first half: the controller's state as one serializable value, the term that
//! orders controllers, the lane that streams the state's changes to a standby, and the
//! standby's mirror of it (`capture::takeover_bundle` makes a bundle of its cut). The takeover
//! itself — the standby binding the controller's address and the ranks reconnecting to it —
//! is not built yet; see ARCHITECTURE.md.

mod controller_state;
mod lane;
mod mirror;
mod term;

pub(crate) use controller_state::{ControllerState, Cut, CutParts};
pub(crate) use lane::{MirrorBody, StandbyLane};
#[cfg(test)]
pub(crate) use mirror::Mirror;
pub(crate) use term::Term;

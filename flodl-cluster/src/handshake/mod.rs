//! Opening a session: TCP, mutual TLS and the hello exchange, on the controller's side (which
//! pairs each rank's two lanes) and on a joining rank's side.

mod controller;
mod dropped;
mod join;
mod refusal;
mod registry;
mod slots;

pub use controller::Controller;
pub use join::join;
pub use slots::{AddressSlot, AddressSlots};

//! A session: one ordered, bidirectional stream of opaque frames between the controller and one
//! rank, carried on two lanes (two connections), with the transport's own heartbeats.
//!
//! Each frame gets a sequence number when it is sent; the receiver merges the two lanes back into
//! send order, holding at most one frame per lane (a lane's frames arrive in order, so the frame
//! it waits for is always at the head of one lane). A silent, closed, reset or misbehaving lane
//! ends the session: the user receives the frames that arrived in order, then [`NetError::Gone`].
//!
//! The network side runs as tokio tasks; the user's side is synchronous (bounded flume channels),
//! with `_async` twins for code that itself runs on tokio.
//!
//! [`NetError::Gone`]: crate::NetError::Gone

mod arrival;
mod config;
mod deadline;
mod ends;
mod engine;
mod lane;
mod merge;
mod runtime;

pub use arrival::Arrival;
pub use config::{Caps, Liveness, SessionConfig};
pub use ends::{Session, SessionReceiver, SessionSender};
pub use lane::Lane;

pub(crate) use engine::{Conn, start};
pub(crate) use runtime::{Reactor, reactor};

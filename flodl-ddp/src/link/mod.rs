//! The link between the coordinator and the ranks: the only way they talk.
//!
//! The runtime's logic sees two narrow ends, [`CoordinatorLink`] and [`RankLink`], that carry
//! the plain-data [`wire`] messages with a deadline on every wait and a clear [`LinkError::Gone`]
//! when the other end is gone. What reaches the coordinator arrives in one inbox as [`Inbound`]
//! events, in order per rank: a rank's messages, then its `Gone` once its end is dropped. The
//! in-process link ([`local`]) is a pair of bounded flume queues per rank; the network link
//! ([`net`]) carries the same messages as [`frame`]s over a connection per rank and delivers
//! into the same inbox; [`route`] sends each rank's orders through whichever of the two
//! reaches it (a controller's own rank stays in-process). Each end, connection and rendezvous
//! is a struct over a private enum of its flavors (no trait objects): the flavors sit side by
//! side here, in-process and network, in-memory ([`memory`]) and mutual TLS ([`tls`]).
//!
//! **Architecture Invariant:** nothing crosses a link but [`wire`] messages; the one
//! process-local act, aborting a rank's collective group while the rank is blocked inside it, is
//! the link's own response to [`wire::ToWorker::AbortGroup`] (the rank arms it with
//! [`RankLink::arm_abort`]).

pub(crate) mod delta;
pub(crate) mod ends;
pub(crate) mod failure;
pub(crate) mod frame;
pub(crate) mod frames;
#[doc(hidden)]
pub mod fuzz;
pub(crate) mod held;
pub(crate) mod inbound;
pub(crate) mod link_error;
pub(crate) mod local;
pub(crate) mod memory;
pub(crate) mod net;
pub(crate) mod raw_run;
pub(crate) mod rendezvous;
#[doc(hidden)]
pub mod rig;
pub(crate) mod roll_call;
pub(crate) mod route;
pub(crate) mod samples;
pub(crate) mod text;
#[cfg(feature = "cluster")]
pub(crate) mod tls;
pub(crate) mod views;
pub(crate) mod wire;

pub(crate) use ends::{CoordinatorLink, RankLink, heartbeat};
pub(crate) use inbound::Inbound;
pub(crate) use link_error::LinkError;

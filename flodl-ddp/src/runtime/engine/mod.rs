//! The engine: the coordinator, the ranks' loops, the seats and rounds they share, checkpoint
//! capture and the host averaging round. The face (`runtime/`) starts it and reads what it
//! writes; it never imports the face.

pub(crate) mod books;
pub(crate) mod capture;
pub(crate) mod comm;
pub(crate) mod coordinator;
pub(crate) mod divergence;
pub(crate) mod fault;
pub(crate) mod formation;
pub(crate) mod host_groups;
pub(crate) mod host_round;
pub(crate) mod ledger;
pub(crate) mod outlets;
pub(crate) mod prefetch;
pub(crate) mod rank;
pub(crate) mod roster;
pub(crate) mod run_config;
pub(crate) mod scrutiny;
pub(crate) mod slot;
pub(crate) mod solo;
pub(crate) mod staging;
pub(crate) mod standby;
mod start;
pub(crate) mod trail;

pub(crate) use start::{start, start_rank};

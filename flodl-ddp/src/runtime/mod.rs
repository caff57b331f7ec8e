//! The running system: the `Trainer` builder, the handle, the coordinator, the ranks' loops,
//! fault handling, checkpoint capture and the host averaging round.

pub(crate) mod capture;
pub(crate) mod cluster;
pub(crate) mod comm;
pub(crate) mod coordinator;
pub(crate) mod divergence;
pub(crate) mod fault;
pub(crate) mod formation;
pub(crate) mod handle;
pub(crate) mod host_groups;
pub(crate) mod host_round;
pub(crate) mod ledger;
pub(crate) mod prefetch;
pub(crate) mod rank;
pub(crate) mod slot;
pub(crate) mod solo;
pub(crate) mod spec;
pub(crate) mod staging;
pub(crate) mod trainer;

//! The contract between the runtime and a model: what a rank trains ([`Replica`]) and the
//! fault-injection wrapper every test and tool shares ([`FailingReplica`]).

pub(crate) mod failing;
pub(crate) mod replica;
pub(crate) mod staging;

pub use failing::{FailingReplica, Failure};
pub use replica::{Batch, BatchEval, Replica, ReplicaContext};

//! The contract between the runtime and a model: what a rank trains ([`Replica`]), the
//! optional parts trainer options need ([`Capability`]), evaluating a replica on a dataset
//! ([`evaluate`]) and the fault-injection wrapper every test and tool shares
//! ([`FailingReplica`]).

pub(crate) mod capability;
pub(crate) mod evaluation;
pub(crate) mod failing;
pub(crate) mod model_size;
pub(crate) mod replica;
pub(crate) mod requirement;
pub(crate) mod staging;

pub use capability::{Capability, TrainerOption};
pub use evaluation::evaluate;
pub use failing::{FailingReplica, Failure};
pub use replica::{Batch, BatchEval, Replica, ReplicaContext};

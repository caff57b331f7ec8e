//! flodl-ddp's integration tests: one binary, a module per subject.

mod breakdown;
mod checkpoint;
mod cluster;
mod common;
mod cooperative;
mod custom_replica;
mod dispatch;
mod divergence;
mod elche;
mod eval;
mod fault;
mod follow;
mod gpu;
mod overshoot;
mod prefetch;
mod refinements;
mod resume;
mod runtime;
// The custom replica of the crate docs and README (its `main` is the example's).
#[allow(dead_code)]
#[path = "../../examples/softmax.rs"]
mod softmax;
mod spec;
mod staging;

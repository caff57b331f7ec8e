//! flodl-ddp's integration tests: one binary, a module per subject.

mod breakdown;
mod checkpoint;
mod common;
mod dispatch;
mod divergence;
mod elche;
mod eval;
mod fault;
mod gpu;
mod guard;
mod outer;
mod overshoot;
mod partition;
mod policy;
mod prefetch;
mod refinements;
mod resume;
mod runtime;
mod schedule;
mod spec;

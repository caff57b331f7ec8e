//! flodl-ddp's integration tests: one binary, a module per subject.

mod checkpoint;
mod chunk_pool;
mod chunk_size;
mod common;
mod divergence;
mod elche;
mod epoch_stream;
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

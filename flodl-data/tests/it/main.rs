//! flodl-data's integration tests: one binary, a module per subject.

mod in_memory;
mod mnist;
mod prefetch;
mod sharding;
mod staging;
mod text;

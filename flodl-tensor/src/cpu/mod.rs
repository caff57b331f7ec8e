//! The CPU backend: host storage, the stream's worker threads and the kernels.

mod multiversion;
mod storage;
mod workers;

pub(crate) mod elementwise;
pub(crate) mod linalg;
pub(crate) mod nn;
pub(crate) mod optim;
pub(crate) mod quant;
pub(crate) mod reduce;
pub(crate) mod weighted_sum;

pub(crate) use storage::CpuStorage;
pub(crate) use workers::CpuWorkers;

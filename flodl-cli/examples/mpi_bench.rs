//! MPI against in-process throughput, side by side in one invocation: the MNIST skew workload
//! (MLP 784-256-128-10, batch 64, 5 epochs, rank 1 slowed 2.5x) on the collective backend with
//! 2 in-process ranks (`fdl train --ranks 2`, `HostComm`) and with 2 MPI processes
//! (`fdl launch --mpi --nproc 2`: the controller in its own process, the ranks under mpirun,
//! `MpiComm`), `Cadence` and `Async`.
//!
//! ```text
//! cargo build --release -p flodl-cli --features mpi --bin fdl --example mpi_bench
//! target/release/examples/mpi_bench [EXTRA FDL FLAGS...]
//! ```
//! Throughput is samples trained / training wall time, from each run's summary.json.

mod bench_kit;
mod side_by_side;

fn main() -> side_by_side::Result {
    side_by_side::compare("collective", &["launch", "--mpi", "--nproc", "2"], "MPI processes")
}

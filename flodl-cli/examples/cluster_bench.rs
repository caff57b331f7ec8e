//! Cluster against in-process throughput, side by side in one invocation: the MNIST workload
//! (MLP 784-256-128-10, batch 64, 5 epochs, rank 1 slowed 2.5x) on 2 in-process ranks
//! (`fdl train --ranks 2`) and on 2 rank processes over mutual TLS on loopback
//! (`fdl launch --nproc 2`), `Cadence` and `Async` on the host backend.
//!
//! ```text
//! cargo build --release -p flodl-cli --bin fdl --example cluster_bench
//! target/release/examples/cluster_bench [EXTRA FDL FLAGS...]
//! ```
//! Throughput is samples trained / training wall time, from each run's summary.json.

mod bench_kit;
mod side_by_side;

fn main() -> side_by_side::Result {
    side_by_side::compare("host", &["launch", "--nproc", "2"], "processes")
}

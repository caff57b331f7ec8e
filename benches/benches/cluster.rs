//! Cluster control-plane benchmarks: the bulk lane over loopback mutual TLS.
//!
//! - `cpu_bulk_100MB`: one 100 MB frame from a rank to the controller (send until the controller
//!   has it in hand); throughput is the frame's bytes. The goal is at least 1.5 GB/s (torch gloo
//!   reaches 1.4 GB/s over loopback on this machine kind).
//! - `cpu_snapshot_round_trip`: one 235k-parameter f32 snapshot (940 KB) from a rank to the
//!   controller and back; throughput counts both directions' bytes.
//!
//! Both sides run in this process, each on its own runtime, over 127.0.0.1.

use std::thread;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use flodl_benches::{Unit, bench_name, criterion_config};
use flodl_cluster::{
    Caps, Controller, ControllerAddr, Hello, JobKeys, Lane, Session, SessionConfig, Tls, join,
};

const WAIT: Duration = Duration::from_secs(30);
const BULK: usize = 100_000_000;
const SNAPSHOT: usize = 235_000 * 4;

/// A controller and one joined rank: (controller side, rank side), and what keeps them alive.
fn pair() -> (Session, Session, Controller, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let files = JobKeys::generate(dir.path(), &["127.0.0.1".to_string()]).expect("job keys");
    let cfg = SessionConfig::new(
        Tls::load(&files).expect("TLS"),
        Caps { control: 1 << 20, bulk: 2 * BULK },
    );
    let run = [1u8; 32];
    let controller =
        Controller::bind("127.0.0.1:0".parse().expect("an address"), run, 1, cfg.clone())
            .expect("bind");
    let addr = ControllerAddr { host: "127.0.0.1".into(), port: controller.local_addr().port() };
    let joiner = thread::spawn(move || join(&addr, Hello::new(run, 0, 1), cfg, WAIT));
    let at_controller = controller.accept(WAIT).expect("accept");
    let at_rank = joiner.join().expect("the joiner").expect("join");
    (at_controller, at_rank, controller, dir)
}

fn cluster(c: &mut Criterion) {
    let (at_controller, at_rank, _controller, _dir) = pair();
    let mut group = c.benchmark_group("cluster");

    let frame = vec![0x5au8; BULK];
    group.throughput(Unit::Bytes.throughput(BULK as u64));
    group.bench_function(BenchmarkId::new(bench_name("cpu", "bulk", Unit::Bytes), "100MB"), |b| {
        b.iter_batched(
            || frame.clone(),
            |frame| {
                at_rank.send(Lane::Bulk, frame, WAIT).expect("send");
                at_controller.recv(WAIT).expect("recv")
            },
            BatchSize::PerIteration,
        )
    });

    let snapshot = vec![0x3cu8; SNAPSHOT];
    group.throughput(Unit::Bytes.throughput(2 * SNAPSHOT as u64));
    group.bench_function(
        BenchmarkId::new(bench_name("cpu", "snapshot_round_trip", Unit::Bytes), "940KB"),
        |b| {
            b.iter_batched(
                || snapshot.clone(),
                |snapshot| {
                    at_rank.send(Lane::Bulk, snapshot, WAIT).expect("send");
                    let at_controller_side = at_controller.recv(WAIT).expect("recv");
                    at_controller.send(Lane::Bulk, at_controller_side, WAIT).expect("send back");
                    at_rank.recv(WAIT).expect("recv back")
                },
                BatchSize::PerIteration,
            )
        },
    );
    group.finish();
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = cluster
}
criterion_main!(benches);

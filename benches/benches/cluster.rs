//! Cluster control-plane benchmarks: the bulk lane over loopback mutual TLS.
//!
//! - `cpu_bulk_100MB`: one 100 MB frame from a rank to the controller (send until the controller
//!   has it in hand, as the `Bytes` of `recv_bytes`, which the runtime takes); throughput is the
//!   frame's bytes. `cpu_bulk_vec_100MB`: the same, taken as a `Vec` (`recv`). The goal is at least 1.5 GB/s (torch gloo
//!   reaches 1.4 GB/s over loopback on this machine kind).
//! - `cpu_snapshot_round_trip`: one 235k-parameter f32 snapshot (940 KB) from a rank to the
//!   controller and back; throughput counts both directions' bytes.
//!
//! - `*_cputime`: the same transfers timed by the CPU time the whole process consumed (all
//!   threads, from `/proc/self/task/*/schedstat`), so the figure is bytes per CPU-second,
//!   comparable whatever else the machine runs; with two free cores (sender and receiver in
//!   parallel) the wall-clock rate can reach up to twice it. Left out where `/proc` is missing.
//!
//! - `cpu_aes128gcm_seal`: the limit beside them, in the same run: 100 MB sealed in place in
//!   16 KiB records (TLS's record size) with ring's AES-128-GCM, the provider and cipher suite the
//!   sessions negotiate, on one thread. Opening costs the same passes (CTR and GHASH), so a
//!   connection whose sender and receiver each have a core of their own is bounded by this rate.
//!
//! Both sides run in this process, each on its own runtime, over 127.0.0.1.

use std::thread;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use flodl_benches::{Unit, bench_name, criterion_config};
use flodl_cluster::{
    Caps, Controller, ControllerAddr, Hello, JobKeys, Lane, Session, SessionConfig, Tls, join,
};
use ring::aead::{AES_128_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

/// CPU time this process's live threads have consumed (nanosecond resolution, summed over
/// `/proc/self/task/*/schedstat`; the runtimes' threads live as long as the sessions).
fn process_cpu_time() -> Option<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        // A thread may exit between the listing and the read: it no longer counts.
        let Ok(stat) = std::fs::read_to_string(path) else { continue };
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

/// Runs `iters` transfers made by `run` on copies of `input`, returning the CPU time they took
/// (the copies are made outside the measured span).
fn cpu_time_of(iters: u64, input: &[u8], mut run: impl FnMut(Vec<u8>)) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let copy = input.to_vec();
        let before = process_cpu_time().unwrap_or_default();
        run(copy);
        total += process_cpu_time().unwrap_or_default().saturating_sub(before);
    }
    total
}

const WAIT: Duration = Duration::from_secs(30);
const BULK: usize = 100_000_000;
const SNAPSHOT: usize = 235_000 * 4;

/// A controller and one joined rank: (controller side, rank side), and what keeps them alive.
fn pair() -> (Session, Session, Controller, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let keys = JobKeys::generate(&dir.path().join("keys"), 1, &["127.0.0.1".to_string()], false)
        .expect("job keys");
    let caps = Caps { control: 1 << 20, bulk: 2 * BULK };
    let cfg = SessionConfig::new(Tls::load(&keys.controller()).expect("TLS"), caps);
    let rank_cfg = SessionConfig::new(Tls::load(&keys.rank(0)).expect("TLS"), caps);
    let run = [1u8; 32];
    let controller =
        Controller::bind("127.0.0.1:0".parse().expect("an address"), run, 1, cfg.clone())
            .expect("bind");
    let addr = ControllerAddr { host: "127.0.0.1".into(), port: controller.local_addr().port() };
    let joiner = thread::spawn(move || join(&addr, Hello::new(run, 0, 1), rank_cfg, WAIT));
    let at_controller = controller.accept(WAIT).expect("accept");
    let at_rank = joiner.join().expect("the joiner").expect("join");
    (at_controller, at_rank, controller, dir)
}

/// The bytes of one TLS record's plaintext at most.
const RECORD: usize = 16 * 1024;

/// Seals `buf` in place record by record (nonces never repeat within a call).
fn seal_records(key: &LessSafeKey, buf: &mut [u8]) -> usize {
    let mut tags = 0;
    for (i, record) in buf.chunks_mut(RECORD).enumerate() {
        let mut nonce = [0u8; NONCE_LEN];
        nonce[4..].copy_from_slice(&(i as u64).to_be_bytes());
        let tag = key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), record)
            .expect("seal");
        tags += usize::from(tag.as_ref()[0] & 1);
    }
    tags
}

fn cluster(c: &mut Criterion) {
    let (at_controller, at_rank, _controller, _dir) = pair();
    let mut group = c.benchmark_group("cluster");

    let key = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &[7u8; 16]).expect("a key"));
    let mut plain = vec![0x5au8; BULK];
    group.throughput(Unit::Bytes.throughput(BULK as u64));
    group.bench_function(
        BenchmarkId::new(bench_name("cpu", "aes128gcm_seal", Unit::Bytes), "100MB"),
        |b| b.iter(|| seal_records(&key, &mut plain)),
    );
    drop(plain);

    let frame = vec![0x5au8; BULK];
    group.throughput(Unit::Bytes.throughput(BULK as u64));
    group.bench_function(BenchmarkId::new(bench_name("cpu", "bulk", Unit::Bytes), "100MB"), |b| {
        b.iter_batched(
            || frame.clone(),
            |frame| {
                at_rank.send(Lane::Bulk, frame, WAIT).expect("send");
                at_controller.recv_bytes(WAIT).expect("recv")
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function(
        BenchmarkId::new(bench_name("cpu", "bulk_vec", Unit::Bytes), "100MB"),
        |b| {
            b.iter_batched(
                || frame.clone(),
                |frame| {
                    at_rank.send(Lane::Bulk, frame, WAIT).expect("send");
                    at_controller.recv(WAIT).expect("recv")
                },
                BatchSize::PerIteration,
            )
        },
    );

    if process_cpu_time().is_some() {
        group.bench_function(
            BenchmarkId::new(bench_name("cpu", "bulk_cputime", Unit::Bytes), "100MB"),
            |b| {
                b.iter_custom(|iters| {
                    cpu_time_of(iters, &frame, |frame| {
                        at_rank.send(Lane::Bulk, frame, WAIT).expect("send");
                        at_controller.recv_bytes(WAIT).expect("recv");
                    })
                })
            },
        );
    }

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
    if process_cpu_time().is_some() {
        group.bench_function(
            BenchmarkId::new(
                bench_name("cpu", "snapshot_round_trip_cputime", Unit::Bytes),
                "940KB",
            ),
            |b| {
                b.iter_custom(|iters| {
                    let copies: Vec<Vec<u8>> = (0..iters).map(|_| snapshot.clone()).collect();
                    let before = process_cpu_time().unwrap_or_default();
                    for copy in copies {
                        at_rank.send(Lane::Bulk, copy, WAIT).expect("send");
                        let back = at_controller.recv(WAIT).expect("recv");
                        at_controller.send(Lane::Bulk, back, WAIT).expect("send back");
                        at_rank.recv(WAIT).expect("recv back");
                    }
                    process_cpu_time().unwrap_or_default().saturating_sub(before)
                })
            },
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = cluster
}
criterion_main!(benches);

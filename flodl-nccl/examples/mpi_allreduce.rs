//! All-reduce bandwidth, side by side in one invocation: `HostComm` with 2 ranks as threads of
//! this process, then `MpiComm` with 2 processes started by `mpirun` (this same binary), both
//! on a weighted all-reduce of 10M f32 (and 1M), as algorithm bandwidth (bytes of one rank's
//! buffer / time per all-reduce, the median of the timed rounds).
//!
//! ```text
//! cargo build --release -p flodl-nccl --features mpi --example mpi_allreduce
//! target/release/examples/mpi_allreduce
//! ```

use std::process::Command;
use std::time::{Duration, Instant};

use flodl_nccl::{HostComm, MpiComm};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Elements per all-reduce.
const SIZES: [usize; 2] = [10_000_000, 1_000_000];
/// Untimed rounds, then timed rounds.
const WARMUP: usize = 3;
const ROUNDS: usize = 20;
/// Set in the processes mpirun starts.
const CHILD: &str = "FLODL_MPI_BENCH_CHILD";

/// The median of `times`, in seconds.
fn median(mut times: Vec<Duration>) -> f64 {
    times.sort();
    times.get(times.len() / 2).map_or(f64::NAN, Duration::as_secs_f64)
}

/// GB/s of one rank's `n` f32 in `secs`.
fn gbps(n: usize, secs: f64) -> f64 {
    (n * 4) as f64 / secs / 1e9
}

/// Times `reduce` on a buffer of `n`.
fn time(n: usize, mut reduce: impl FnMut(&mut [f32]) -> Result) -> Result<f64> {
    let mut buf = vec![1.0f32; n];
    let mut times = Vec::with_capacity(ROUNDS);
    for round in 0..WARMUP + ROUNDS {
        let t = Instant::now();
        reduce(&mut buf)?;
        if round >= WARMUP {
            times.push(t.elapsed());
        }
    }
    Ok(median(times))
}

fn host(n: usize) -> Result<f64> {
    let secs = std::thread::scope(|s| {
        let ranks: Vec<_> = HostComm::group(2)
            .into_iter()
            .map(|mut comm| {
                s.spawn(move || {
                    time(n, |b| Ok(comm.all_reduce_weighted_f32(&mut [b], 0.5)?))
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|r| r.join().map_err(|_| "rank panicked".to_string())?)
            .collect::<std::result::Result<Vec<f64>, String>>()
    })?;
    Ok(secs.into_iter().fold(0.0, f64::max))
}

/// One rank of the mpirun world: prints its figures.
fn child() -> Result {
    let mut comm = MpiComm::world()?;
    comm.set_timeout(Duration::from_secs(120));
    let rank = comm.rank();
    if rank == 0 {
        println!("library: {}", comm.library_version()?.lines().next().unwrap_or("?"));
    }
    for n in SIZES {
        let secs = time(n, |b| Ok(comm.all_reduce_weighted_f32(&mut [b], 0.5)?))?;
        println!("mpi {rank} {n} {secs:.6}");
    }
    if std::env::var("PROBE").is_ok() {
        let secs = time(1, |_| Ok(comm.barrier()?))?;
        println!("probe {rank} barrier {secs:.6}");
        let secs = time(SIZES[0], |b| Ok(comm.all_reduce_sum_f32(&mut [b])?))?;
        println!("probe {rank} sum {secs:.6}");
    }
    Ok(())
}

fn main() -> Result {
    if std::env::var(CHILD).is_ok() {
        return child();
    }
    let mut host_figures = Vec::new();
    for n in SIZES {
        host_figures.push((n, host(n)?));
    }
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-np", "2"]);
    if std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0) {
        cmd.arg("--allow-run-as-root");
    }
    let out = cmd.args(["-x", CHILD]).env(CHILD, "1").arg(std::env::current_exe()?).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "mpirun {}: {text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    // Per size, the slower rank's time is the operation's.
    let mut mpi: Vec<(usize, f64)> = SIZES.iter().map(|&n| (n, 0.0)).collect();
    for line in text.lines() {
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["mpi", _rank, n, secs] => {
                let (n, secs) = (n.parse::<usize>()?, secs.parse::<f64>()?);
                if let Some(slot) = mpi.iter_mut().find(|(m, _)| *m == n) {
                    slot.1 = slot.1.max(secs);
                }
            }
            _ => println!("{line}"),
        }
    }
    println!("| f32 elements | HostComm 2 threads GB/s | MpiComm 2 processes GB/s | MPI ms |");
    println!("|---|---|---|---|");
    for ((n, h), (_, m)) in host_figures.iter().zip(&mpi) {
        println!("| {n} | {:.2} | {:.2} | {:.2} |", gbps(*n, *h), gbps(*n, *m), m * 1e3);
    }
    Ok(())
}

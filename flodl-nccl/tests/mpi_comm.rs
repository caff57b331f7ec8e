//! `MpiComm` across 3 processes: this test binary starts itself under
//! `mpirun --oversubscribe -np 3` (plus `--allow-run-as-root` as root), each process running
//! `world_member` as one rank; the parent checks every rank reported its cases passed.
//! Without `mpirun` on the PATH it skips with a printed reason, unless `FLODL_REQUIRE_MPI=1`.
#![cfg(feature = "mpi")]

use std::process::Command;
use std::time::{Duration, Instant};

use flodl_nccl::{Collective, Error, MpiComm};
use flodl_tensor::{DType, Stream, Tensor};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Set in the processes mpirun starts.
const CHILD: &str = "FLODL_MPI_TEST_CHILD";
const WORLD: usize = 3;

/// Whether the MPI tests must run (CI sets it): a missing mpirun is then a failure.
fn mpi_required() -> bool {
    std::env::var("FLODL_REQUIRE_MPI").is_ok_and(|v| v == "1")
}

/// `mpirun`, or why the MPI tests cannot run here.
fn mpirun() -> std::result::Result<Command, String> {
    let found = Command::new("mpirun").arg("--version").output();
    match found {
        Ok(out) if out.status.success() => {
            let mut cmd = Command::new("mpirun");
            cmd.args(["--oversubscribe", "-np", &WORLD.to_string()]);
            if nix_root() {
                cmd.arg("--allow-run-as-root");
            }
            Ok(cmd)
        }
        _ => Err("mpirun is not on the PATH (Debian: apt-get install openmpi-bin)".into()),
    }
}

/// Whether this process runs as root (Open MPI then needs `--allow-run-as-root`): the owner of
/// `/proc/self` is the process's effective user.
fn nix_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}

/// The 3-rank world runs `world_member` in each process and every rank passes.
#[test]
fn three_processes_reduce_broadcast_and_agree_on_mismatches() -> Result {
    let mut cmd = match mpirun() {
        Ok(cmd) => cmd,
        Err(why) if !mpi_required() => {
            flodl_tensor::skip(&why);
            return Ok(());
        }
        Err(why) => return Err(why.into()),
    };
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let out = cmd
        .args(["-x", CHILD])
        .env(CHILD, "1")
        .arg(exe)
        .args(["--exact", "world_member", "--nocapture", "--test-threads=1"])
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mpirun {}: {stdout}\n{stderr}", out.status);
    for rank in 0..WORLD {
        let line = format!("mpi rank {rank} of {WORLD}: every case passed");
        assert!(stdout.contains(&line), "no {line:?} in:\n{stdout}\n{stderr}");
    }
    assert!(started.elapsed() < Duration::from_secs(120), "took {:?}", started.elapsed());
    Ok(())
}

/// What rank `r` holds of a case's buffer `b` at element `i`.
fn value(r: usize, b: usize, i: usize) -> f32 {
    ((r + 1) * 10 + b) as f32 + (i % 97) as f32 * 0.25
}

/// One rank of the world (started by the test above under mpirun). In the ordinary run it does
/// nothing, saying so: its check is the test above's (so it is not a skip, and not listed).
#[test]
fn world_member() -> Result {
    if std::env::var(CHILD).is_err() {
        println!("not a test alone: one rank of the mpirun world the test above starts");
        return Ok(());
    }
    let mut comm = MpiComm::world()?;
    comm.set_timeout(Duration::from_secs(60));
    let (rank, world) = (comm.rank(), comm.world_size());
    assert_eq!(world, WORLD);
    let weights = [0.5f32, 0.25, 0.25];
    // Buffer lengths per case: one empty, odd sizes, a megabyte-sized one.
    for lens in [vec![1], vec![7, 0, 3], vec![1000, 1 << 18], vec![]] {
        let mut bufs: Vec<Vec<f32>> = lens
            .iter()
            .enumerate()
            .map(|(b, &n)| (0..n).map(|i| value(rank, b, i)).collect())
            .collect();
        let mut slices: Vec<&mut [f32]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
        comm.all_reduce_weighted_f32(&mut slices, weights[rank])?;
        for (b, buf) in bufs.iter().enumerate() {
            for (i, got) in buf.iter().enumerate() {
                let want: f32 = (0..world).map(|r| weights[r] * value(r, b, i)).sum();
                assert!(
                    (got - want).abs() <= want.abs() * 1e-6,
                    "{lens:?} [{b}][{i}]: {got} != {want}"
                );
            }
        }
    }
    // Sum and broadcast through the tensor contract.
    let stream = Stream::cpu_with_threads(1);
    let mut t = Tensor::zeros(&[5], DType::F32, &stream)?;
    t.copy_from_host(&[rank as f32 + 1.0; 5], &stream)?;
    comm.all_reduce_sum(&mut [&mut t], &stream)?;
    let mut host = vec![0.0f32; 5];
    t.copy_to_host(&mut host, &stream)?;
    assert_eq!(host, vec![6.0; 5], "sum");
    t.copy_from_host(&[rank as f32; 5], &stream)?;
    Collective::broadcast(&mut comm, &mut [&mut t], 2, &stream)?;
    t.copy_to_host(&mut host, &stream)?;
    assert_eq!(host, vec![2.0; 5], "broadcast from rank 2");
    comm.barrier()?;
    // A disagreement is an error on every rank and changes nothing.
    let n = if rank == 1 { 4 } else { 3 };
    let mut odd = vec![1.0f32; n];
    match comm.all_reduce_sum_f32(&mut [&mut odd[..]]) {
        Err(Error::Mismatch { .. }) => {}
        other => return Err(format!("rank {rank}: a length mismatch gave {other:?}").into()),
    }
    assert_eq!(odd, vec![1.0; n], "a mismatched reduce wrote");
    match comm.broadcast_f32(&mut [&mut odd[..]], 7) {
        Err(Error::InvalidArgument(_)) => {}
        other => return Err(format!("rank {rank}: root 7 gave {other:?}").into()),
    }
    // Still usable after the refusals.
    let mut one = [1.0f32];
    comm.all_reduce_sum_f32(&mut [&mut one[..]])?;
    assert_eq!(one, [3.0]);
    // Aborted before an operation: it fails here and ends nothing.
    comm.abort_handle().abort();
    match comm.barrier() {
        Err(Error::Aborted) => {}
        other => return Err(format!("rank {rank}: barrier after abort gave {other:?}").into()),
    }
    println!("mpi rank {rank} of {world}: every case passed");
    Ok(())
}

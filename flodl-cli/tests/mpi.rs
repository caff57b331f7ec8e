//! MPI jobs of real processes on loopback (feature `mpi`): `fdl launch --mpi --nproc 3` runs
//! the controller in a process of its own and the 3 ranks under
//! `mpirun --oversubscribe -np 3` (plus `--allow-run-as-root` as root) as one MPI world, the
//! collective backend's data plane. Without `mpirun` on the PATH the tests skip with a printed
//! reason, unless `FLODL_REQUIRE_MPI=1` (CI sets it).
#![cfg(feature = "mpi")]

use std::process::Command;
use std::time::{Duration, Instant};

mod support;

use support::launched::{
    FDL, Launched, Result, accuracy, in_process, kill9, summary, trains_as_well,
};

/// A small job: 3 ranks' worth of 4,096 training and 1,000 test images, 2 epochs.
const JOB: [&str; 12] = [
    "--backend",
    "collective",
    "--train-subset",
    "4096",
    "--test-subset",
    "1000",
    "--epochs",
    "2",
    "--hidden",
    "64",
    "--batch-size",
    "32",
];

/// Why the MPI tests cannot run here, when they cannot; an error when they must.
fn skip() -> Result<Option<String>> {
    let found = Command::new("mpirun").arg("--version").output();
    if found.is_ok_and(|o| o.status.success()) {
        return Ok(None);
    }
    let why = "mpirun is not on the PATH (Debian: apt-get install openmpi-bin)".to_owned();
    if std::env::var("FLODL_REQUIRE_MPI").is_ok_and(|v| v == "1") {
        return Err(format!("FLODL_REQUIRE_MPI=1 but {why}").into());
    }
    Ok(Some(why))
}

/// Every policy on the collective backend across 3 MPI processes completes, with the
/// controller outside the world, and its accuracy is in the band of the in-process run.
#[test]
fn every_policy_across_three_mpi_processes_matches_in_process() -> Result {
    if let Some(why) = skip()? {
        flodl_tensor::skip(&why);
        return Ok(());
    }
    let tmp = tempfile::tempdir()?;
    for policy in ["sync", "cadence", "async"] {
        let mut flags = vec!["--policy", policy];
        flags.extend(JOB);
        let alone = in_process(&flags, &tmp.path().join(format!("alone-{policy}")))?;
        let job = tmp.path().join(format!("mpi-{policy}"));
        let started = Instant::now();
        let out = Command::new(FDL)
            .args(["launch", "--mpi", "--nproc", "3", "--quiet", "--out"])
            .arg(&job)
            .args(&flags)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{policy}: {stdout}\n{stderr}");
        for rank in 0..3 {
            let joined = format!("rank {rank} of 3: joined the controller");
            assert!(stdout.contains(&joined), "{policy}: no {joined:?} in {stdout}");
        }
        assert!(stdout.contains("[launch] the controller exited with 0"), "{stdout}");
        assert!(stdout.contains("[launch] mpirun exited with 0"), "{stdout}");
        let mpi = accuracy(&job)?;
        trains_as_well(&format!("{policy}: in-process against MPI"), alone, mpi, 0.75)?;
        let s = summary(&job)?;
        assert_eq!(s["spec"]["placement"], "processes");
        assert_eq!(s["spec"]["backend"], "collective");
        println!("{policy}: in-process {alone:.4}, MPI {mpi:.4} in {:?}", started.elapsed());
    }
    Ok(())
}

/// A slow job: every rank slowed so an epoch lasts about a second.
const SLOW: [&str; 14] = [
    "--backend",
    "collective",
    "--policy",
    "cadence",
    "--train-subset",
    "6144",
    "--test-subset",
    "1000",
    "--epochs",
    "4",
    "--slowdown",
    "20,20,20",
    "--watchdog",
    "10",
];

/// `kill -9` of rank 1's process mid-run ends the MPI job (a world cannot shrink); the
/// launcher restarts the 2 survivors from the last bundle (elastic resume 3 → 2), the work
/// lost is printed, and the restarted job completes with an accuracy in the band of the clean
/// in-process run.
#[test]
fn a_killed_mpi_rank_restarts_the_job_from_the_last_bundle() -> Result {
    if let Some(why) = skip()? {
        flodl_tensor::skip(&why);
        return Ok(());
    }
    let tmp = tempfile::tempdir()?;
    let clean = in_process(&SLOW, &tmp.path().join("clean"))?;
    let dir = tmp.path().join("killed");
    let ckpt = tmp.path().join("ckpt");
    let mut args = vec!["launch", "--mpi", "--nproc", "3", "--max-restarts", "1"];
    let (dir_s, ckpt_s) = (dir.to_string_lossy().into_owned(), ckpt.to_string_lossy().into_owned());
    // Saved at every reduce: a death loses at most the windows in progress.
    args.extend(["--out", &dir_s, "--checkpoint-dir", &ckpt_s, "--checkpoint-every-reduces", "1"]);
    args.extend(SLOW);
    let mut job = Launched::spawn(Command::new(FDL).args(&args))?;
    let line = job.wait_for("rank 1 of 3: joined the controller (pid", Duration::from_secs(60))?;
    let pid: i32 = line
        .rsplit("(pid ")
        .next()
        .and_then(|p| p.trim_end_matches(')').parse().ok())
        .ok_or("no pid")?;
    // Killed once epoch 2 is done: by then the bundle of the reduce that ended epoch 1 is
    // written (a kill right after epoch 1's line can land before it, and the last bundle then
    // holds no epoch: the fresh-clone CI of fed4bc5 hit that).
    job.wait_for("epoch 2/4", Duration::from_secs(90))?;
    kill9(pid)?;
    let (code, out) = job.finish(Duration::from_secs(240))?;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("an MPI world cannot shrink"), "{out}");
    assert!(out.contains("work lost:"), "{out}");
    assert!(out.contains("restart 1 of 1: 2 rank(s) (2 survived)"), "{out}");
    assert!(out.contains("resuming from"), "{out}");
    let mpi = accuracy(&dir)?;
    trains_as_well("clean against restarted", clean, mpi, 0.75)?;
    for line in out.lines().filter(|l| l.contains("[launch]") || l.contains("error:")) {
        println!("{line}");
    }
    println!("clean {clean:.4}, restarted {mpi:.4}");
    let s = summary(&dir)?;
    assert!(s["epochs_restored"].as_u64().is_some_and(|n| n >= 1), "{s}");
    assert_eq!(s["spec"]["devices"].as_array().map(Vec::len), Some(2), "{s}");
    Ok(())
}

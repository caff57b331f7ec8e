//! Cluster jobs of real processes on loopback: `fdl launch` and `fdl train` joining over
//! mutual TLS, with ranks and the controller killed, a rank of another run specification and
//! hostile clients on the controller's port.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;

use support::launched::{
    FDL, Launched, Result, accuracy, audit, by_hand, free_port, in_process, keys, kill9, own_key,
    summary, trains_as_well,
};

/// A small job: 3 ranks' worth of 4,096 training and 1,000 test images, 2 epochs.
const JOB: [&str; 12] = [
    "--backend",
    "host",
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

/// `fdl launch --nproc 3` under each policy completes with every rank exiting 0, and its
/// accuracy is in the band of the in-process run of the same flags (bf16 on the wire for one).
#[test]
fn launched_jobs_match_in_process_runs() -> Result {
    let tmp = tempfile::tempdir()?;
    for (policy, wire) in [("sync", "f32"), ("cadence", "f32"), ("async", "bf16")] {
        let alone = tmp.path().join(format!("alone-{policy}"));
        in_process(&[&["--policy", policy][..], &JOB].concat(), &alone)?;
        let job = tmp.path().join(format!("job-{policy}"));
        let out = Command::new(FDL)
            .args([
                "launch", "--nproc", "3", "--policy", policy, "--wire", wire, "--quiet", "--out",
            ])
            .arg(&job)
            .args(JOB)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{policy}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for rank in 0..3 {
            assert!(stdout.contains(&format!("[launch] rank {rank} exited with 0")), "{stdout}");
        }
        let (a, c) = (accuracy(&alone)?, accuracy(&job)?);
        trains_as_well(&format!("{policy}: in-process against launched"), a, c, 0.75)?;
        let s = summary(&job)?;
        assert_eq!(s["spec"]["placement"], "processes");
        assert_eq!(s["spec"]["wire"], wire);
    }
    Ok(())
}

/// Elastic resume across processes: a bundle a 3-process job saved early in its first epoch
/// resumes onto 2 processes, and one of a 2-process job onto 3. The job says what changed, the
/// resumed run trains exactly the samples the bundle left of each epoch (a fast rank may have
/// started the next epoch before the bundle was saved: its first batches are in the bundle's
/// coverage too), and its accuracy is in the band of the saving job's.
#[test]
fn launched_jobs_resume_onto_another_world() -> Result {
    use flodl_ddp::checkpoint::{Checkpoint, step_bundles};
    let tmp = tempfile::tempdir()?;
    for (from, to) in [(3usize, 2usize), (2, 3)] {
        let ck = tmp.path().join(format!("ck-{from}"));
        let saved = tmp.path().join(format!("saved-{from}"));
        let (nfrom, nto) = (from.to_string(), to.to_string());
        let out = Command::new(FDL)
            .args(["launch", "--nproc", &nfrom, "--policy", "cadence", "--quiet"])
            .args(["--checkpoint-every-reduces", "2", "--keep-checkpoints", "100"])
            .arg("--checkpoint-dir")
            .arg(&ck)
            .arg("--out")
            .arg(&saved)
            .args(JOB)
            .output()?;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        // The first bundle of the first epoch with part of it done.
        let mut chosen = None;
        for (_, path) in step_bundles(&ck)? {
            let c = Checkpoint::read(&path)?;
            if c.epoch == 0 && c.coverage_of(0).is_some_and(|e| !e.is_complete()) {
                chosen = Some((path, c));
                break;
            }
        }
        let (bundle, ckpt) = chosen.ok_or("no mid-epoch bundle")?;
        assert_eq!(ckpt.world_size, from);
        // An epoch the bundle holds no coverage of was not started: all 4,096 samples are left.
        let left = |e: u64| ckpt.coverage_of(e).map_or(4096, |c| c.total - c.done_count());
        let resumed = tmp.path().join(format!("resumed-{from}-{to}"));
        let out = Command::new(FDL)
            .args(["launch", "--nproc", &nto, "--policy", "cadence", "--resume"])
            .arg(&bundle)
            .arg("--out")
            .arg(&resumed)
            .args(JOB)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(&format!("resuming {from} ranks onto {to}")), "{stdout}");
        let s = summary(&resumed)?;
        assert_eq!(s["epochs_completed"], 2, "{s}");
        let metrics = std::fs::read_to_string(resumed.join("metrics.jsonl"))?;
        let epochs: Vec<Value> = metrics
            .lines()
            .map(serde_json::from_str::<Value>)
            .collect::<std::result::Result<Vec<_>, _>>()?
            .into_iter()
            .filter(|l| l["kind"] == "epoch")
            .collect();
        let samples =
            |e: u64| epochs.iter().find(|l| l["epoch"] == e).and_then(|l| l["samples"].as_u64());
        assert_eq!(samples(0), Some(left(0) as u64), "{from} → {to}: the rest of epoch 0");
        assert_eq!(samples(1), Some(left(1) as u64), "{from} → {to}: the rest of epoch 1");
        // Every sample once in the resumed model, through the saving job's ledger.
        println!("{}", audit(&resumed, &[&saved])?);
        let (a, b) = (accuracy(&saved)?, accuracy(&resumed)?);
        trains_as_well(&format!("{from} → {to}: saved against resumed"), a, b, 0.75)?;
    }
    Ok(())
}

/// A launched job records each rank process's time breakdown as an in-process run does: the
/// controller's `summary.json` has every rank's parts summing to the training wall, with compute
/// and the host round trip over the network (reduce) on both ranks; `metrics.jsonl`'s epochs
/// carry each rank's breakdown; the report draws both ranks' lanes and names the rank that held
/// the run back.
#[test]
fn launched_jobs_account_for_every_rank_process_time() -> Result {
    let tmp = tempfile::tempdir()?;
    let job = tmp.path().join("job");
    // Four times the other jobs' data: at 4096 samples a quiet machine trains in ~70 ms, which
    // the edges below would swamp.
    let longer = JOB.map(|a| if a == "4096" { "16384" } else { a });
    let out = Command::new(FDL)
        .args(["launch", "--nproc", "2", "--policy", "cadence", "--slowdown", "1,3", "--quiet"])
        .arg("--out")
        .arg(&job)
        .args(longer)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let s = summary(&job)?;
    let wall_ms = s["train_wall_s"].as_f64().ok_or("train_wall_s")? * 1000.0;
    let ranks = s["ranks"].as_array().ok_or("ranks")?;
    assert_eq!(ranks.len(), 2, "{s}");
    let parts =
        ["compute", "data", "reduce", "exchange", "waiting", "evaluation", "checkpoint", "other"];
    for r in ranks {
        let ms = |p: &str| r["time"][format!("{p}_ms")].as_f64().unwrap_or(f64::NAN);
        let sum: f64 = parts.iter().map(|p| ms(p)).sum();
        // A short run: a few ms of scheduling noise are more than 1% of it, and the two
        // deliveries at a rank's edges, which none of its clocks sees (the first order, the last
        // report), cross the network link and a loaded machine's scheduler (9 ms seen beside
        // the other tests of this binary).
        let edges_ms = 2.0 * 15.0;
        assert!((sum - wall_ms).abs() < 0.05 * wall_ms + edges_ms, "{sum} ms of {wall_ms} ms: {r}");
        assert!(ms("compute") > 0.0 && ms("reduce") > 0.0, "{r}");
    }
    assert!(s["held_back"]["rank"].as_u64().is_some_and(|r| r < 2), "{s}");
    let metrics = std::fs::read_to_string(job.join("metrics.jsonl"))?;
    let epochs: Vec<Value> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "epoch")
        .collect();
    assert_eq!(epochs.len(), 2, "{metrics}");
    for e in &epochs {
        for r in e["ranks"].as_array().ok_or("no ranks")? {
            assert!(r["time"]["compute_ms"].as_f64().is_some_and(|c| c > 0.0), "{e}");
        }
    }
    let html = std::fs::read_to_string(job.join("report.html"))?;
    assert!(html.contains("<h2>Rank activity</h2>"), "no swimlane");
    assert!(html.contains("Held the run back most: <b>rank "), "no rank named");
    for rank in 0..2 {
        assert!(html.contains(&format!("<title>rank {rank} epoch")), "no lane for rank {rank}");
    }
    Ok(())
}

/// A slow job: every rank slowed so an epoch lasts about half a second.
const SLOW: [&str; 14] = [
    "--backend",
    "host",
    "--policy",
    "cadence",
    "--train-subset",
    "8192",
    "--test-subset",
    "500",
    "--epochs",
    "6",
    "--slowdown",
    "30,30,30",
    "--watchdog",
    "5",
];

/// `kill -9` of rank 2's process mid-run: it is declared dead, the run completes with the
/// survivors, every later epoch trains every sample once, and the job exits 0.
#[test]
fn a_killed_rank_process_leaves_the_run_to_the_survivors() -> Result {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("killed");
    let mut job = Launched::start(&SLOW, &dir)?;
    job.wait_for("epoch 1/6", Duration::from_secs(60))?;
    kill9(job.pids[2])?;
    let (code, out) = job.finish(Duration::from_secs(90))?;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("rank 2 was killed by signal 9"), "{out}");
    let s = summary(&dir)?;
    let faults = s["faults"].as_array().ok_or("no faults")?;
    assert_eq!(faults.len(), 1, "{s}");
    assert_eq!(faults[0]["rank"], 2);
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl"))?;
    let epochs: Vec<Value> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "epoch")
        .collect();
    assert_eq!(epochs.len(), 6, "{metrics}");
    println!("{}", audit(&dir, &[])?);
    let last = epochs.last().ok_or("no epoch")?;
    let ranks = last["ranks"].as_array().ok_or("no ranks")?;
    assert_eq!(
        ranks.get(2).and_then(|r| r["samples"].as_u64()),
        Some(0),
        "rank 2 trained after death: {last}"
    );
    Ok(())
}

/// The controller's process (rank 0) killed in a job without a standby (`--standby none`; with
/// one, `failover.rs`): every other rank exits non-zero within the watchdog, saying the
/// coordinator is gone; nothing hangs; the last bundle resumes the job.
#[test]
fn a_killed_controller_ends_every_rank() -> Result {
    let tmp = tempfile::tempdir()?;
    let ck = tmp.path().join("ck");
    let ck_flag = ck.to_str().ok_or("path")?;
    let mut args = SLOW.to_vec();
    args.extend(["--checkpoint-dir", ck_flag, "--standby", "none"]);
    let mut job = Launched::start(&args, &tmp.path().join("headless"))?;
    job.wait_for("epoch 1/6", Duration::from_secs(60))?;
    let killed = Instant::now();
    kill9(job.pids[0])?;
    let (code, out) = job.finish(Duration::from_secs(40))?;
    assert_eq!(code, Some(137), "{out}");
    for rank in [1, 2] {
        assert!(out.contains(&format!("[launch] rank {rank} exited with 1")), "{out}");
        assert!(out.contains(&format!("[rank {rank}] error: rank {rank} failed")), "{out}");
    }
    assert!(out.contains("coordinator is gone"), "{out}");
    assert!(killed.elapsed() < Duration::from_secs(5 + 15), "took {:?}", killed.elapsed());
    let again = tmp.path().join("resumed");
    args.extend(["--resume", ck_flag]);
    let (code, out) = Launched::start(&args, &again)?.finish(Duration::from_secs(90))?;
    assert_eq!(code, Some(0), "{out}");
    let s = summary(&again)?;
    assert!(s["epochs_restored"].as_u64().is_some_and(|n| n >= 1), "nothing restored: {s}");
    assert_eq!(s["epochs_completed"], 6, "{s}");
    Ok(())
}

/// A rank process of a job, started by hand with the cluster's environment and its own key
/// (rank 0's process hosts the controller: the controller's key).
fn rank(keys: &Path, port: u16, rank: usize, extra: &[&str], out: &Path) -> Result<Child> {
    by_hand(keys, port, rank, &own_key(rank), &JOB, extra, out)
}

/// Hostile clients on the controller's port while the job forms (no certificate: random
/// bytes; a TLS hello-less stall) do not disturb it; then a rank started with another run
/// specification is refused with a line on both sides, and the honest job still completes.
#[test]
fn hostile_and_mismatched_clients_do_not_disturb_a_job() -> Result {
    let tmp = tempfile::tempdir()?;
    let keydir = tmp.path().join("keys");
    keys(&keydir)?;
    let port = free_port()?;
    let out = tmp.path().join("run");
    let controller = rank(&keydir, port, 0, &[], &out)?;
    // Random bytes and a silent connection, as soon as the controller listens.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut garbage = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(e.into()),
        }
    };
    let noise: Vec<u8> =
        (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let _ = garbage.write_all(&noise);
    let _silent = std::net::TcpStream::connect(("127.0.0.1", port))?;
    let stranger = rank(&keydir, port, 2, &["--seed", "7"], &out)?.wait_with_output()?;
    let said = String::from_utf8_lossy(&stranger.stderr);
    assert!(!stranger.status.success() && said.contains("refused"), "the stranger: {said}");
    let honest = [rank(&keydir, port, 1, &[], &out)?, rank(&keydir, port, 2, &[], &out)?];
    for r in honest {
        let o = r.wait_with_output()?;
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let o = controller.wait_with_output()?;
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "controller: {said}");
    assert!(said.contains("refused"), "the controller did not say it refused the stranger: {said}");
    assert!(accuracy(&out)? > 0.5);
    Ok(())
}

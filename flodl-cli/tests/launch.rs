//! Cluster jobs of real processes on loopback: `fdl launch` and `fdl train` joining over
//! mutual TLS, with ranks and the controller killed, a rank of another run specification and
//! hostile clients on the controller's port.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const FDL: &str = env!("CARGO_BIN_EXE_fdl");

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
/// Accuracy a launched job may differ by from the in-process run of the same flags.
const BAND: f64 = 0.06;

fn summary(dir: &Path) -> Result<Value> {
    Ok(serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json"))?)?)
}

fn accuracy(dir: &Path) -> Result<f64> {
    summary(dir)?["test"]["accuracy"].as_f64().ok_or_else(|| "no test accuracy".into())
}

/// `fdl launch --nproc 3` under each policy completes with every rank exiting 0, and its
/// accuracy is in the band of the in-process run of the same flags (bf16 on the wire for one).
#[test]
fn launched_jobs_match_in_process_runs() -> Result {
    let tmp = tempfile::tempdir()?;
    for (policy, wire) in [("sync", "f32"), ("cadence", "f32"), ("async", "bf16")] {
        let alone = tmp.path().join(format!("alone-{policy}"));
        let out = Command::new(FDL)
            .args(["train", "--ranks", "3", "--policy", policy, "--quiet", "--out"])
            .arg(&alone)
            .args(JOB)
            .output()?;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
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
        assert!(a > 0.75 && (a - c).abs() <= BAND, "{policy}: in-process {a:.3}, launched {c:.3}");
        let s = summary(&job)?;
        assert_eq!(s["spec"]["placement"], "processes");
        assert_eq!(s["spec"]["wire"], wire);
    }
    Ok(())
}

/// Elastic resume across processes: a bundle a 3-process job saved early in its first epoch
/// resumes onto 2 processes, and one of a 2-process job onto 3. The job says what changed, the
/// resumed run trains exactly the samples the bundle left (its first epoch reports just those)
/// and every sample of the next epoch, and its accuracy is in the band of the saving job's.
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
        let left = ckpt.coverage_of(0).map_or(0, |c| c.total - c.done_count());
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
        assert_eq!(samples(0), Some(left as u64), "{from} → {to}: the rest of epoch 0");
        assert_eq!(samples(1), Some(4096), "{from} → {to}: epoch 1");
        let (a, b) = (accuracy(&saved)?, accuracy(&resumed)?);
        assert!(a > 0.75 && (a - b).abs() <= BAND, "{from} → {to}: saved {a:.3}, resumed {b:.3}");
    }
    Ok(())
}

/// A launched job whose output lines arrive on a channel; pids by rank.
struct Launched {
    child: Child,
    lines: mpsc::Receiver<String>,
    pids: Vec<i32>,
    seen: Vec<String>,
}

impl Launched {
    fn start(args: &[&str], out: &Path) -> Result<Launched> {
        let mut child = Command::new(FDL)
            .args(["launch", "--nproc", "3", "--out"])
            .arg(out)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let (tx, lines) = mpsc::channel();
        for stream in [
            child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child.stderr.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(std::result::Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        let mut job = Launched { child, lines, pids: Vec::new(), seen: Vec::new() };
        for rank in 0..3 {
            let line =
                job.wait_for(&format!("[launch] rank {rank}: pid"), Duration::from_secs(20))?;
            job.pids.push(line.rsplit(' ').next().ok_or("no pid")?.parse()?);
        }
        Ok(job)
    }

    /// The first line containing `what`, within `wait`.
    fn wait_for(&mut self, what: &str, wait: Duration) -> Result<String> {
        let deadline = Instant::now() + wait;
        while let Ok(line) =
            self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.seen.push(line.clone());
            if line.contains(what) {
                return Ok(line);
            }
        }
        Err(format!("no line with {what:?} within {wait:?}; saw:\n{}", self.seen.join("\n")).into())
    }

    /// Waits for the launcher to exit; its code and every line.
    fn finish(mut self, wait: Duration) -> Result<(Option<i32>, String)> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(status) = self.child.try_wait()? {
                while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(500)) {
                    self.seen.push(line);
                }
                return Ok((status.code(), self.seen.join("\n")));
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return Err(format!(
                    "the launcher did not exit within {wait:?}:\n{}",
                    self.seen.join("\n")
                )
                .into());
            }
            while let Ok(line) = self.lines.try_recv() {
                self.seen.push(line);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn kill9(pid: i32) -> Result {
    let ok = Command::new("kill").args(["-9", &pid.to_string()]).status()?.success();
    if ok { Ok(()) } else { Err(format!("kill -9 {pid} failed").into()) }
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
    let per_epoch = (8192 / 64) * 64;
    let epochs: Vec<Value> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "epoch")
        .collect();
    assert_eq!(epochs.len(), 6, "{metrics}");
    for e in &epochs {
        assert_eq!(e["samples"].as_u64(), Some(per_epoch as u64), "an epoch's coverage: {e}");
    }
    let last = epochs.last().ok_or("no epoch")?;
    let ranks = last["ranks"].as_array().ok_or("no ranks")?;
    assert_eq!(
        ranks.get(2).and_then(|r| r["samples"].as_u64()),
        Some(0),
        "rank 2 trained after death: {last}"
    );
    Ok(())
}

/// The controller's process (rank 0) killed: every other rank exits non-zero within the
/// watchdog, saying the coordinator is gone; nothing hangs; the last bundle resumes the job.
#[test]
fn a_killed_controller_ends_every_rank() -> Result {
    let tmp = tempfile::tempdir()?;
    let ck = tmp.path().join("ck");
    let ck_flag = ck.to_str().ok_or("path")?;
    let mut args = SLOW.to_vec();
    args.extend(["--checkpoint-dir", ck_flag]);
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

/// A rank process of a job, started by hand with the cluster's environment.
fn rank(keys: &Path, port: u16, rank: usize, extra: &[&str], out: &Path) -> Result<Child> {
    Ok(Command::new(FDL)
        .args(["train", "--quiet", "--join-timeout", "20", "--out"])
        .arg(out)
        .args(JOB)
        .args(extra)
        .env("FLODL_RANK", rank.to_string())
        .env("FLODL_WORLD_SIZE", "3")
        .env("FLODL_LOCAL_RANK", rank.to_string())
        .env("FLODL_CONTROLLER_ADDR", "127.0.0.1")
        .env("FLODL_CONTROLLER_PORT", port.to_string())
        .env("FLODL_TLS_CA", keys.join("ca.pem"))
        .env("FLODL_TLS_CERT", keys.join("cert.pem"))
        .env("FLODL_TLS_KEY", keys.join("key.pem"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn keys(dir: &Path) -> Result {
    let out = Command::new(FDL).args(["cluster", "keys"]).arg(dir).output()?;
    if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).into()) }
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

//! Rank processes that join a running job again: `fdl launch --max-restarts` restarts a killed
//! rank process, which the controller admits at a reduce from the consensus; the run completes
//! with every sample of every epoch trained once.

use std::time::Duration;

use serde_json::Value;

mod support;

use support::launched::{
    Launched, Result, accuracy, audit, in_process, kill9, records, summary, trains_as_well,
};

/// Epochs of the job.
const EPOCHS: usize = 8;
/// The job's flags: every rank slowed so an epoch lasts a second or two.
const JOB: [&str; 16] = [
    "--backend",
    "host",
    "--policy",
    "cadence",
    "--train-subset",
    "8192",
    "--test-subset",
    "1000",
    "--epochs",
    "8",
    "--hidden",
    "64",
    "--slowdown",
    "20,20,20",
    "--watchdog",
    "10",
];

/// Every epoch recorded, and `fdl audit` finds each of its samples in the final model exactly
/// once.
fn check_coverage(dir: &std::path::Path) -> Result<Vec<Value>> {
    let epochs = records(dir, "epoch")?;
    if epochs.len() != EPOCHS {
        return Err(format!("{} epochs recorded, {EPOCHS} expected", epochs.len()).into());
    }
    let report = audit(dir, &[])?;
    println!("{report}");
    Ok(epochs)
}

/// `kill -9` of rank 2's process mid-run under `--max-restarts 1`: the launcher restarts it, it
/// rejoins at a reduce and trains (its windows after the rejoin have steps), every epoch trains
/// every sample once, and the accuracy is in the band of the clean in-process run.
#[test]
fn a_killed_rank_process_is_restarted_and_rejoins() -> Result {
    let tmp = tempfile::tempdir()?;
    let clean = tmp.path().join("clean");
    let flags: Vec<&str> = JOB.iter().copied().filter(|f| !f.contains("20,20")).collect();
    let flags: Vec<&str> = flags.into_iter().filter(|f| *f != "--slowdown").collect();
    in_process(&flags, &clean)?;
    let dir = tmp.path().join("rejoined");
    let mut job = Launched::start_with(3, &["--max-restarts", "1"], &JOB, &dir, &[])?;
    job.wait_for("epoch 1/8", Duration::from_secs(90))?;
    kill9(job.pids[2])?;
    job.wait_for("[launch] restarting rank 2 (restart 1 of at most 1)", Duration::from_secs(20))?;
    job.wait_for("rank 2 rejoined at reduce", Duration::from_secs(90))?;
    let (code, out) = job.finish(Duration::from_secs(180))?;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("rank 2 was killed by signal 9"), "{out}");
    assert!(out.contains("[launch] rank 2 exited with 0"), "the restarted rank: {out}");
    let s = summary(&dir)?;
    let faults = s["faults"].as_array().ok_or("no faults")?;
    let rejoins = s["rejoins"].as_array().ok_or("no rejoins")?;
    assert_eq!((faults.len(), rejoins.len()), (1, 1), "{s}");
    assert_eq!((faults[0]["rank"].as_u64(), rejoins[0]["rank"].as_u64()), (Some(2), Some(2)));
    assert_eq!(rejoins[0]["members"], serde_json::json!([0, 1, 2]));
    check_coverage(&dir)?;
    // Its windows after the rejoin: rank 2 trained in reduces after it was admitted.
    let back = rejoins[0]["at_ms"].as_f64().ok_or("no rejoin time")?;
    let trained_after: u64 = records(&dir, "reduce")?
        .iter()
        .filter(|r| r["at_ms"].as_f64().is_some_and(|t| t > back))
        .filter_map(|r| r["steps"].get(2).and_then(Value::as_u64))
        .sum();
    assert!(trained_after > 0, "rank 2 trained nothing after its rejoin");
    let (a, c) = (accuracy(&clean)?, accuracy(&dir)?);
    trains_as_well("clean against with a rejoin", a, c, 0.8)?;
    Ok(())
}

/// Seats left and taken again while the run starts: sessions opened with ranks 1's and 2's keys
/// hold the start (the controller waits for their replicas); rank 2's closes, and its seat is
/// left vacant, then taken by a real rank 2 process, which starts with the others; rank 1's
/// closes, and ranks 0 and 2 train; a real rank 1 process then joins the training run. Every
/// sample of every epoch once, nobody counted dead. Before, the first close failed the start
/// ("rank 2 is gone"), which for a takeover's run waiting for its survivors ended the job.
#[test]
fn seats_left_and_taken_while_the_run_starts() -> Result {
    use support::impostor::run_hash;
    use support::launched::{
        by_hand, free_port, keys, outcome, own_key, rejoined, samples_by_rank,
    };

    let tmp = tempfile::tempdir()?;
    let keydir = tmp.path().join("keys");
    keys(&keydir)?;
    let port = free_port()?;
    let out = tmp.path().join("run");
    let mut job: Vec<&str> = JOB.to_vec();
    let at = job.iter().position(|f| *f == "--epochs").ok_or("no --epochs")? + 1;
    job[at] = "4";
    let run = run_hash(&keydir, port, 2, &job)?;
    let controller = by_hand(&keydir, port, 0, &own_key(0), &job, &[], &out)?;
    let silent = |rank: usize| -> Result<flodl_cluster::Session> {
        let files = flodl_cluster::TlsFiles {
            ca: keydir.join("ca.pem"),
            cert: keydir.join(format!("rank-{rank}.pem")),
            key: keydir.join(format!("rank-{rank}.key")),
        };
        let caps = flodl_cluster::Caps { control: 1 << 20, bulk: 64 << 20 };
        let mut cfg = flodl_cluster::SessionConfig::new(flodl_cluster::Tls::load(&files)?, caps);
        // It holds seats as fdl's ranks would: speaking their messages' version.
        cfg.app = flodl_ddp::WIRE_VERSION;
        let addr = flodl_cluster::ControllerAddr { host: "127.0.0.1".into(), port };
        let hello = flodl_cluster::Hello::new(run, rank, 3);
        Ok(flodl_cluster::join(&addr, hello, cfg, Duration::from_secs(60))?)
    };
    let (one, two) = (silent(1)?, silent(2)?);
    // Every seat taken: the run is starting, waiting for the two replicas.
    std::thread::sleep(Duration::from_secs(1));
    two.close();
    std::thread::sleep(Duration::from_secs(1));
    let mut late_two = by_hand(&keydir, port, 2, &own_key(2), &job, &[], &out)?;
    wait_line(&mut late_two, "joined the controller")?;
    std::thread::sleep(Duration::from_secs(1));
    one.close();
    let mut late_one = by_hand(&keydir, port, 1, &own_key(1), &job, &[], &out)?;
    wait_line(&mut late_one, "joined the controller")?;
    for (child, who) in [(controller, "the controller"), (late_two, "rank 2"), (late_one, "rank 1")]
    {
        let (ok, said) = outcome(child)?;
        if !ok {
            return Err(format!("{who} failed:\n{said}").into());
        }
    }
    let s = summary(&out)?;
    assert_eq!(s["faults"].as_array().map_or(0, Vec::len), 0, "{s}");
    assert_eq!(s["epochs_completed"].as_u64(), Some(4), "{s}");
    assert_eq!(rejoined(&s), vec![1], "{s}");
    let samples = samples_by_rank(&s)?;
    assert!(samples.len() == 3 && samples.iter().all(|&n| n > 0.0), "{samples:?}");
    println!("{}", audit(&out, &[])?);
    Ok(())
}

/// Waits (a minute at most) for a line holding `what` on `child`'s stdout, which it takes.
fn wait_line(child: &mut std::process::Child, what: &str) -> Result<()> {
    use std::io::BufRead;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = lines.recv_timeout(left).map_err(|_| format!("no line with {what:?}"))?;
        if line.contains(what) {
            return Ok(());
        }
    }
}

//! The hostile-member test: one process of a launched job, holding its real rank key, attacks
//! the controller over the real link (the hidden attacker mode, `FLODL_HOSTILE=2:ATTACK`), one
//! attack per job. Each attack evicts the attacker only, with a fault naming it and its
//! misconduct; the honest ranks finish with every sample of every epoch trained once and the
//! accuracy of a clean run. Before a job forms, a member's key can neither serve as the
//! controller, nor take another rank's seat, nor join with other data.

use std::path::Path;
use std::time::{Duration, Instant};

use flodl_data::mnist::{Mnist, Split, Verify, vendored_dir};
use flodl_data::{Dataset, HostBatch};
use flodl_tensor::Device;

mod support;

use support::impostor::{FakeController, claim, run_hash};
use support::launched::{
    Launched, Result, accuracy, audit, by_hand, free_port, in_process, keys, outcome, own_key,
    records, summary, trains_as_well,
};

/// Training samples and epochs of each job.
const TRAIN: usize = 4096;
const EPOCHS: usize = 2;
/// The jobs' flags: small, so nine jobs and a clean run cost a CI step little.
const JOB: [&str; 14] = [
    "--backend",
    "host",
    "--policy",
    "cadence",
    "--train-subset",
    "4096",
    "--test-subset",
    "500",
    "--epochs",
    "2",
    "--hidden",
    "32",
    "--watchdog",
    "10",
];
/// Epochs of the `persist` attack's job (its flag below): long enough for a restarted
/// process to come back while it trains.
const PERSIST_EPOCHS: &str = "150";
/// Jobs run at once.
const AT_ONCE: usize = 3;

/// Each attack of rank 2, and the misconduct the controller's fault must name (`None`: an
/// attack the controller cannot see, which must change nothing).
const ATTACKS: [(&str, Option<&str>); 13] = [
    ("start-state", Some("StartState")),
    ("steps", Some("StepsBeyondDispatch")),
    ("nan-snapshot", Some("NonFinite")),
    ("inf-snapshot", Some("NonFinite")),
    ("misshaped-snapshot", Some("Misshaped")),
    ("unsolicited-eval", Some("Unsolicited")),
    ("unsolicited-group-id", Some("Unsolicited")),
    ("replay", Some("Replayed")),
    ("flood", Some("Flooded")),
    // A pace a hundred times its own (to be elected the evaluating rank) and the accuracy of
    // shifted test labels (0.3%) in its evaluations: the job reports its own process's.
    ("forged-eval", None),
    // Its Stop ignored, its frames sent on: the controller ends its connection; restarted by
    // the launcher, its seat is closed to it.
    ("persist", Some("NonFinite")),
    // Its snapshots without their checkpoint parts, in a job that checkpoints every 2 reduces:
    // the bundle would miss its place in its chunk.
    ("part-dropped", Some("PartMissing")),
    // A NaN as what each reduce cost it, which ElChe would size windows by.
    ("nan-exposure", Some("NonFinite")),
];

/// The controller's line when an evicted rank's process connects again.
const BARRED: &str = "the rank was evicted for misconduct, and its seat stays closed";

/// One attack's job: rank 2 evicted for `misconduct` and nobody else (or nobody), every
/// epoch's samples trained once (the ledger's audit); the job's accuracy.
fn attacked(attack: &str, misconduct: Option<&str>, dir: &Path) -> Result<f64> {
    let hostile = format!("2:{attack}");
    let persist = attack == "persist";
    let launcher: &[&str] = if persist { &["--max-restarts", "1"] } else { &[] };
    let mut flags = JOB.to_vec();
    let mut epochs = EPOCHS;
    if persist {
        // A few seconds of training, so that the restarted process connects while the run
        // still trains.
        epochs = PERSIST_EPOCHS.parse()?;
        let at = flags.iter().position(|f| *f == "--epochs").ok_or("no --epochs")? + 1;
        flags[at] = PERSIST_EPOCHS;
    }
    let checkpoints = dir.join("checkpoints").to_string_lossy().into_owned();
    if attack == "part-dropped" {
        flags.extend(["--checkpoint-dir", &checkpoints, "--checkpoint-every-reduces", "2"]);
    }
    let job = Launched::start_with(3, launcher, &flags, dir, &[("FLODL_HOSTILE", &hostile)])?;
    let (code, out) = job.finish(Duration::from_secs(240))?;
    let tail: String = out.lines().rev().take(40).collect::<Vec<_>>().join("\n");
    if code != Some(0) {
        return Err(format!("{attack}: the job exited with {code:?}:\n{tail}").into());
    }
    let s = summary(dir)?;
    let faults = s["faults"].as_array().ok_or("no faults")?;
    let evicted: Vec<(Option<u64>, String)> =
        faults.iter().map(|f| (f["rank"].as_u64(), f["cause"].to_string())).collect();
    let named = match misconduct {
        Some(misconduct) => {
            evicted.len() == 1
                && evicted[0].0 == Some(2)
                && evicted[0].1.contains("Misconduct")
                && evicted[0].1.contains(misconduct)
        }
        None => evicted.is_empty(),
    };
    if !named {
        return Err(
            format!("{attack}: faults {evicted:?}, expected rank 2 for {misconduct:?}").into()
        );
    }
    if persist {
        let rejoins = s["rejoins"].as_array().map_or(0, Vec::len);
        let still_heard = out.contains("still heard");
        // Turned away with a Stop, the restarted process ends at once: it neither follows the
        // standby nor waits for the launcher to kill it after the run.
        let lingered =
            out.contains("rank 2 outlived") || out.contains("rank 2: the controller is gone");
        if !out.contains("restarting rank 2")
            || !out.contains(BARRED)
            || rejoins != 0
            || still_heard
            || lingered
        {
            return Err(format!(
                "{attack}: restarted and turned away expected, {rejoins} rejoin(s), heard on \
                 after its Stop: {still_heard}, lingered: {lingered}:\n{tail}"
            )
            .into());
        }
    }
    // An evicted rank's unreduced work goes back like a dead rank's: exactly once still.
    audit(dir, &[])?;
    let recorded = records(dir, "epoch")?;
    if recorded.len() != epochs {
        return Err(format!("{attack}: {} epochs recorded", recorded.len()).into());
    }
    let per_epoch = (TRAIN / 64) * 64;
    for e in &recorded {
        if e["samples"].as_u64() != Some(per_epoch as u64) {
            return Err(format!("{attack}: an epoch's coverage is not exactly once: {e}").into());
        }
    }
    Ok(s["test"]["accuracy"].as_f64().ok_or("no test accuracy")?)
}

/// Every attack of the list, three jobs at a time: each evicts only the attacker and the
/// survivors train as well as the clean run of the same flags.
#[test]
fn a_hostile_member_is_evicted_and_the_job_trains_on() -> Result {
    let started = Instant::now();
    let tmp = tempfile::tempdir()?;
    let clean = in_process(&JOB, &tmp.path().join("clean"))?;
    let mut failures = Vec::new();
    for batch in ATTACKS.chunks(AT_ONCE) {
        let results: Vec<(&str, std::result::Result<f64, String>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .map(|&(attack, misconduct)| {
                    let dir = tmp.path().join(attack);
                    scope.spawn(move || {
                        (attack, attacked(attack, misconduct, &dir).map_err(|e| e.to_string()))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| ("?", Err("panicked".into()))))
                .collect()
        });
        for (attack, r) in results {
            let r = r.and_then(|acc| {
                trains_as_well(attack, clean, acc, 0.5).map(|()| acc).map_err(|e| e.to_string())
            });
            match r {
                Ok(acc) => eprintln!("{attack}: as expected; accuracy {acc:.3} (clean {clean:.3})"),
                Err(e) => failures.push(format!("{attack}: {e}")),
            }
        }
    }
    eprintln!("{} attacks in {:?}", ATTACKS.len(), started.elapsed());
    if failures.is_empty() { Ok(()) } else { Err(failures.join("\n").into()) }
}

/// A copy of the vendored MNIST directory, its test labels written as a plain idx file with no
/// `SHA256SUMS`; with `alter`, the first test label another digit: data of the same length and
/// layout, but other.
fn copy_data(dir: &Path, alter: bool) -> Result {
    std::fs::create_dir_all(dir)?;
    let vendored = vendored_dir();
    for name in
        ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"]
    {
        std::fs::copy(vendored.join(name), dir.join(name))?;
    }
    let test = Mnist::load(&vendored, Split::Test, Verify::Skip)?;
    let mut batch = HostBatch::new(&Mnist::layout(), Device::Cpu);
    test.fetch(&(0..test.len()).collect::<Vec<_>>(), &mut batch)?;
    let mut labels: Vec<u8> = batch.i32(Mnist::LABEL)?.iter().map(|&l| l as u8).collect();
    if alter {
        labels[0] = (labels[0] + 1) % 10;
    }
    let mut idx = vec![0, 0, 8, 1];
    idx.extend((labels.len() as u32).to_be_bytes());
    idx.extend(labels);
    std::fs::write(dir.join("t10k-labels-idx1-ubyte"), idx)?;
    Ok(())
}

/// Before the job forms, on its controller's port: a rank's key cannot serve as the controller;
/// then, the controller up, a rank's key claiming another rank's seat is refused, and a rank
/// with other data (one test label changed) is refused at the hello with a line saying the
/// data's checksums may differ. The honest ranks then join (one with the same data copied
/// elsewhere) and the job completes.
#[test]
fn a_members_key_serves_no_controller_takes_no_other_seat_and_brings_no_other_data() -> Result {
    let tmp = tempfile::tempdir()?;
    let keydir = tmp.path().join("keys");
    keys(&keydir)?;
    let altered = tmp.path().join("other-data");
    copy_data(&altered, true)?;
    let same = tmp.path().join("same-data");
    copy_data(&same, false)?;
    let port = free_port()?;
    let out = tmp.path().join("run");
    // Rank 2's key as the controller, on the controller's port, before it.
    let fake = by_hand(&keydir, port, 0, "rank-2", &JOB, &[], &out)?;
    let (ok, said) = outcome(fake)?;
    assert!(!ok && said.contains("rank 2"), "a controller on rank 2's key: {said}");
    let controller = by_hand(&keydir, port, 0, &own_key(0), &JOB, &[], &out)?;
    // Rank 2's key claiming rank 1's seat.
    let (ok, said) = outcome(by_hand(&keydir, port, 1, "rank-2", &JOB, &[], &out)?)?;
    // Refused by the process itself; a process that skips that check is refused by the
    // controller (`flodl-cluster`'s `seats` test, with a hand-made client).
    assert!(
        !ok && said.contains("rank 2's certificate, not rank 1's"),
        "rank 2's key as rank 1: {said}"
    );
    // Rank 2 with other data.
    let data = ["--data", altered.to_str().ok_or("path")?];
    let (ok, said) = outcome(by_hand(&keydir, port, 2, &own_key(2), &JOB, &data, &out)?)?;
    assert!(
        !ok && said.contains("checksums of the training and test data"),
        "rank 2 with other data: {said}"
    );
    let honest = [
        by_hand(&keydir, port, 1, &own_key(1), &JOB, &[], &out)?,
        // The same data from another directory, in another form: the samples are compared,
        // not where they came from.
        by_hand(
            &keydir,
            port,
            2,
            &own_key(2),
            &JOB,
            &["--data", same.to_str().ok_or("path")?],
            &out,
        )?,
    ];
    for r in honest {
        let (ok, said) = outcome(r)?;
        assert!(ok, "an honest rank: {said}");
    }
    let (ok, said) = outcome(controller)?;
    assert!(ok, "the controller: {said}");
    assert!(accuracy(&out)? > 0.5);
    Ok(())
}

/// A member's key used by hand, past the checks `fdl` makes of its own key, against the real
/// processes of a job. Served as the controller (rank 2's key) on the controller's port before
/// it, and on another port a rank was pointed at: the honest rank refuses it at TLS, completes
/// no handshake and sends it nothing. Then, the controller up, the same key says the hello of
/// rank 1 (with the run's real specification hash) before the honest rank 1 joins and while it
/// trains: each claim is refused by the controller, naming both ranks; the honest job completes
/// with every sample trained once.
#[test]
fn a_members_key_used_by_hand_poses_as_no_controller_and_takes_no_seat() -> Result {
    let tmp = tempfile::tempdir()?;
    let keydir = tmp.path().join("keys");
    keys(&keydir)?;
    let port = free_port()?;
    let out = tmp.path().join("run");
    for (what, at) in [("the controller's port", port), ("another port", free_port()?)] {
        let listener = std::net::TcpListener::bind(("127.0.0.1", at))?;
        let fake = FakeController::serve(listener, &keydir, "rank-2")?;
        let (ok, said) = outcome(by_hand(&keydir, at, 1, &own_key(1), &JOB, &[], &out)?)?;
        let came = fake.wait_for(1, Duration::from_secs(5));
        let (completed, read) = (
            fake.completed.load(std::sync::atomic::Ordering::Acquire),
            fake.read.load(std::sync::atomic::Ordering::Acquire),
        );
        drop(fake);
        if ok || !said.contains("TLS") || !came || completed != 0 || read != 0 {
            return Err(format!(
                "rank 2's key as a controller on {what}: the rank exited ok={ok}, \
                 connected={came}, handshakes completed {completed}, bytes sent {read}:\n{said}"
            )
            .into());
        }
    }
    let run = run_hash(&keydir, port, 2, &JOB)?;
    let hello = flodl_cluster::Hello::new(run, 1, 3);
    let want = "claims rank 1 but its certificate is rank 2's";
    let mut controller = by_hand(&keydir, port, 0, &own_key(0), &JOB, &[], &out)?;
    // Before the honest rank 1: once the controller listens.
    let deadline = Instant::now() + Duration::from_secs(60);
    let before = loop {
        match claim(&keydir, port, "rank-2", hello) {
            Ok(answer) => break answer,
            Err(_) if Instant::now() < deadline && controller.try_wait()?.is_none() => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(format!("the controller never listened: {e}").into()),
        }
    };
    if !before.contains(want) {
        return Err(format!("rank 2's key claiming rank 1's free seat: {before:?}").into());
    }
    let mut honest = vec![
        by_hand(&keydir, port, 1, &own_key(1), &JOB, &[], &out)?,
        by_hand(&keydir, port, 2, &own_key(2), &JOB, &[], &out)?,
    ];
    // While the honest rank 1 runs: every claim answered is refused the same way.
    let mut refused_while_running = 0;
    while honest[0].try_wait()?.is_none() {
        // A claim that meets the job's end (the controller going away) gets no word; one the
        // controller read must get the seat's refusal, never another answer nor a held lane.
        match claim(&keydir, port, "rank-2", hello) {
            Ok(answer) if answer.contains(want) => refused_while_running += 1,
            Ok(answer) if answer.starts_with("TLS failed") || answer.is_empty() => {}
            Ok(answer) => {
                return Err(format!("a claim of rank 1's seat while it runs: {answer:?}").into());
            }
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    for r in honest.drain(..) {
        let (ok, said) = outcome(r)?;
        if !ok {
            return Err(format!("an honest rank failed: {said}").into());
        }
    }
    let (ok, said) = outcome(controller)?;
    if !ok {
        return Err(format!("the controller failed: {said}").into());
    }
    if refused_while_running == 0 {
        return Err("no claim was answered while rank 1 ran".into());
    }
    let acc = accuracy(&out)?;
    if acc < 0.5 {
        return Err(format!("the job's accuracy {acc}").into());
    }
    audit(&out, &[])?;
    eprintln!("{refused_while_running} claims refused while rank 1 ran; accuracy {acc:.3}");
    Ok(())
}

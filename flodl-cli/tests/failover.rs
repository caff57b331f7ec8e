//! The controller survives its own death: `kill -9` of rank 0's process (which hosts the
//! controller) mid-epoch in a 3-process job; the standby in rank 1's process takes over as the
//! controller of term 1 at the address the ranks were told at launch, rank 2 follows it, rank
//! 0's seat is a dead rank's, and the run completes without a restart with every sample of
//! every epoch once in the final model. A controller stopped (SIGSTOP) rather than killed is
//! found silent, taken over and fenced, and a rank restarted after the takeover joins the
//! controller of the new term. Takeovers chain: the controller of term 1 is taken over in turn.
//! A drill holds the controller inside a reduce and inside a checkpoint so that it is killed
//! exactly there.

use std::time::Duration;

mod support;

use support::launched::{
    Launched, Result, accuracy, audit, in_process, kill9, median, records, rejoined, signal,
    summary, trains_as_well,
};

/// Epochs of the job.
const EPOCHS: usize = 6;
/// The job's flags: every rank slowed so an epoch lasts a second or two.
const JOB: [&str; 18] = [
    "--backend",
    "host",
    "--policy",
    "cadence",
    "--train-subset",
    "8192",
    "--test-subset",
    "1000",
    "--epochs",
    "6",
    "--hidden",
    "64",
    "--slowdown",
    "20,20,20",
    "--watchdog",
    "10",
    "--standby",
    "1",
];

/// `kill -9` of the controller's process after the first epoch: the standby takes over (the
/// launcher and the standby say so), the job exits 0 with the standby's status, the standby's
/// run directory records every epoch, `fdl audit` of it through rank 0's ledger finds every
/// sample once, and the accuracy is in the band of the clean in-process run.
#[test]
fn the_standby_takes_over_when_the_controller_is_killed() -> Result {
    let tmp = tempfile::tempdir()?;
    let clean = clean_run(tmp.path())?;
    let dir = tmp.path().join("run");
    let mut job = Launched::start_with(3, &[], &JOB, &dir, &[])?;
    job.wait_for("epoch 1/6", Duration::from_secs(90))?;
    kill9(job.pids[0])?;
    let killed = std::time::Instant::now();
    job.wait_for("rank 1 takes over as the controller of term 1", Duration::from_secs(60))?;
    job.wait_for("[standby] the run goes on in", Duration::from_secs(60))?;
    // A figure, not a bound: from the kill to the new controller's start, then to its first
    // reduce (BENCHMARKS.md).
    let to_start = killed.elapsed().as_secs_f64();
    let (code, out) = job.finish(Duration::from_secs(240))?;
    assert_eq!(code, Some(0), "{out}");
    // The launcher sees the death first (and names the standby the job's status) or the
    // standby's notice first (and fences the old process): either way both lines come.
    assert!(out.contains("rank 0 was killed by signal 9"), "{out}");
    assert!(out.contains("[launch] rank 1 took over as the controller of term 1"), "{out}");
    assert!(out.contains("rank 2: the controller is gone"), "{out}");
    let taken = tmp.path().join("run-term1");
    let epochs = records(&taken, "epoch")?;
    if epochs.len() != EPOCHS {
        return Err(format!("{} epochs recorded, {EPOCHS} expected", epochs.len()).into());
    }
    let s = summary(&taken)?;
    assert_eq!(s["epochs_completed"].as_u64(), Some(EPOCHS as u64), "{s}");
    let first = records(&taken, "reduce")?
        .iter()
        .filter_map(|r| r["at_ms"].as_f64())
        .fold(f64::INFINITY, f64::min);
    let before: Vec<f64> =
        records(&dir, "reduce")?.iter().filter_map(|r| r["at_ms"].as_f64()).collect();
    let round = median(before.windows(2).map(|w| w[1] - w[0]).collect());
    eprintln!(
        "kill to the standby's run: {to_start:.2} s; its first reduce {:.2} s after its start; \
         median round before the kill {:.0} ms",
        first / 1000.0,
        round.unwrap_or(f64::NAN)
    );
    let report = audit(&taken, &[&dir])?;
    println!("{report}");
    let (a, b) = (accuracy(&clean)?, accuracy(&taken)?);
    trains_as_well("clean against taken over", a, b, 0.8)?;
    Ok(())
}

/// Under `--wire q4` the standby's rank holds the connection's view of the consensus, not the
/// consensus: each cut names that view by digest instead of carrying 80 MB behind a slow link.
/// `kill -9` of the controller after the first epoch: no mirror frame is refused (every cut
/// found its view), the standby takes over from it, and the run completes with every sample
/// once and the accuracy in the band of the clean in-process run.
#[test]
fn a_q4_job_is_taken_over_from_the_view_its_standby_holds() -> Result {
    let tmp = tempfile::tempdir()?;
    let clean = clean_run(tmp.path())?;
    let dir = tmp.path().join("run");
    let q4: Vec<&str> = JOB.iter().copied().chain(["--wire", "q4"]).collect();
    let log = ("RUST_LOG", "warn,flodl_ddp::runtime::engine::coordinator::mirroring=debug");
    let mut job = Launched::start_with(3, &[], &q4, &dir, &[log])?;
    job.wait_for("epoch 1/6", Duration::from_secs(90))?;
    kill9(job.pids[0])?;
    job.wait_for("rank 1 takes over as the controller of term 1", Duration::from_secs(60))?;
    let (code, out) = job.finish(Duration::from_secs(240))?;
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("a mirror frame refused"), "{out}");
    assert!(out.contains("a cut names the consensus the standby's rank holds"), "{out}");
    assert!(!out.contains("a cut carries the consensus"), "{out}");
    let taken = tmp.path().join("run-term1");
    assert_eq!(summary(&taken)?["epochs_completed"].as_u64(), Some(EPOCHS as u64), "{out}");
    println!("{}", audit(&taken, &[&dir])?);
    let (a, b) = (accuracy(&clean)?, accuracy(&taken)?);
    trains_as_well("clean against a q4 job taken over", a, b, 0.8)?;
    Ok(())
}

/// `kill -9` of the standby's process (rank 1) after the first epoch: it is a dead rank like any
/// other, the controller says the run goes on with no standby, and the job completes in its
/// own run directory with every sample once.
#[test]
fn a_killed_standby_leaves_the_run_going_without_one() -> Result {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    let mut job = Launched::start_with(3, &[], &JOB, &dir, &[])?;
    job.wait_for("epoch 1/6", Duration::from_secs(90))?;
    kill9(job.pids[1])?;
    let (code, out) = job.finish(Duration::from_secs(240))?;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("rank 1 was killed by signal 9"), "{out}");
    assert!(out.contains("the standby is gone: the run goes on with no standby"), "{out}");
    assert!(!out.contains("[standby] the controller is gone"), "{out}");
    let faults = summary(&dir)?["faults"].as_array().map_or(0, Vec::len);
    assert_eq!(faults, 1, "{out}");
    let epochs = records(&dir, "epoch")?;
    assert_eq!(epochs.len(), EPOCHS, "{out}");
    println!("{}", audit(&dir, &[])?);
    Ok(())
}

/// The standby's process replaced between two reduces, then the controller killed (4 processes,
/// `--max-restarts 4`, windows of seconds): `kill -9` of rank 1's process right after a cut
/// that named the consensus its rank held by digest, so that its new process is admitted at
/// the next reduce with that cut the last one mirrored (tried again, up to three times, when
/// the new process came only after the next reduce). The new process is sent the whole state
/// without that cut, which it never held, refuses no mirror frame, and the admitting reduce's
/// cut completes its mirror; `kill -9` of the controller's process then: the new standby takes
/// over from its mirror, and the run completes with every sample of every epoch once.
#[test]
fn a_replaced_standby_takes_over_when_the_controller_is_killed() -> Result {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    let flags = job_with(&[("--slowdown", "200,200,200,200"), ("--epochs", "6")], &[])?;
    let log = ("RUST_LOG", "warn,flodl_ddp::runtime::engine::coordinator=debug");
    let mut job = Launched::start_with(4, &["--max-restarts", "4"], &flags, &dir, &[log])?;
    job.wait_for("epoch 1/6", Duration::from_secs(120))?;
    let named = "a cut names the consensus the standby's rank holds";
    let mut hit = false;
    for _ in 0..3 {
        job.wait_for(named, Duration::from_secs(60))?;
        kill9(job.pids[1])?;
        job.wait_for("[launch] restarting rank 1", Duration::from_secs(30))?;
        // The new process is back before any cut (the order this test is for), or a cut came
        // first (it carried its consensus: the standby's rank was dead).
        let back = "the standby is back";
        let first = job.wait_until(
            "the standby back, or a cut",
            |l| l.contains(back) || l.contains("a cut carries the consensus"),
            Duration::from_secs(90),
        )?;
        job.wait_for("rank 1 rejoined at reduce", Duration::from_secs(90))?;
        if first.contains(back) {
            hit = true;
            break;
        }
    }
    if !hit {
        return Err("the standby's new process never came back before the next cut".into());
    }
    // An epoch ended after the admission: its cuts have reached the new process.
    let ended = |line: &str| line.starts_with("[rank 0] epoch");
    job.wait_until("an epoch after the rejoin", ended, Duration::from_secs(90))?;
    kill9(job.pids[0])?;
    job.wait_for("rank 1 takes over as the controller of term 1", Duration::from_secs(90))?;
    let (code, out) = job.finish(Duration::from_secs(300))?;
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("a mirror frame refused"), "{out}");
    let taken = tmp.path().join("run-term1");
    let s = summary(&taken)?;
    assert_eq!(s["epochs_completed"].as_u64(), Some(6), "{out}");
    println!("{}", audit(&taken, &[&dir])?);
    Ok(())
}

/// `kill -9` of the controller's process before any reduce completed (3 processes, ranks slowed
/// so the first window lasts seconds, `--max-restarts 2`): the standby has nothing to take over
/// from and says so, and the job ends within the launcher's grace with the standby's failure as
/// its status; the standby is not restarted as a rank, which would leave the others waiting for
/// a controller that never comes. The job runs `--fragments 2` without periodic saves, which
/// the controller warns of at its start (no whole sync before the end: nothing to take over
/// from at any time).
#[test]
fn a_standby_with_nothing_to_take_over_from_ends_the_job() -> Result {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    let flags = job_with(&[("--slowdown", "3000,3000,3000")], &["--fragments", "2"])?;
    let mut job = Launched::start_with(3, &["--max-restarts", "2"], &flags, &dir, &[])?;
    // The ranks joined, and the controller opened the standby's lane (its warning comes then,
    // after the joins: a kill before it would leave nothing to check).
    for rank in 1..3 {
        let joined = format!("rank {rank} of 3: joined the controller");
        job.seen_or_wait_for(&joined, Duration::from_secs(60))?;
    }
    job.seen_or_wait_for(WHOLE_SYNC_WARNING, Duration::from_secs(60))?;
    kill9(job.pids[0])?;
    let (code, out) = job.finish(Duration::from_secs(90))?;
    assert!(out.contains("nothing to take over from"), "{out}");
    assert!(!out.contains("restarting rank 1"), "{out}");
    assert_ne!(code, Some(0), "{out}");
    Ok(())
}

/// What the controller warns of when its standby can take over only at the run's end.
const WHOLE_SYNC_WARNING: &str = "the standby can take over only from a whole sync";

/// Under `--fragments 2` a cut of the run is a whole sync, which a reduce that saves a
/// checkpoint makes (`--checkpoint-every-reduces 3`): `kill -9` of the controller's process
/// after the first epoch, the standby takes over from the last one, and the run completes in its
/// own directory with every sample of every epoch once.
#[test]
fn under_fragments_the_standby_takes_over_from_the_last_checkpointed_reduce() -> Result {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    let ck = tmp.path().join("ck").to_string_lossy().into_owned();
    let saves = ["--fragments", "2", "--checkpoint-dir", &ck, "--checkpoint-every-reduces", "3"];
    let flags = job_with(&[], &saves)?;
    let mut job = Launched::start_with(3, &[], &flags, &dir, &[])?;
    job.wait_for("epoch 1/6", Duration::from_secs(90))?;
    kill9(job.pids[0])?;
    job.wait_for("rank 1 takes over as the controller of term 1", Duration::from_secs(60))?;
    let (code, out) = job.finish(Duration::from_secs(240))?;
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains(WHOLE_SYNC_WARNING), "{out}");
    let taken = tmp.path().join("run-term1");
    assert_eq!(summary(&taken)?["epochs_completed"].as_u64(), Some(EPOCHS as u64), "{out}");
    println!("{}", audit(&taken, &[&dir])?);
    Ok(())
}

/// `kill -STOP` of the controller's process in a 4-process job with `--max-restarts 4`: the
/// ranks find it silent, the standby takes over and announces its term to the launcher, which
/// fences the stopped old controller (kills it: one controller per job), restarts rank 0's
/// process as a rank of term 1 and takes the job's status from the standby; then rank 2's
/// process is killed, restarted at the controller of term 1 and rejoins; every sample of every
/// epoch is once in the final model.
#[test]
fn a_stopped_controller_is_taken_over_and_fenced_and_a_restarted_rank_joins_the_new_term() -> Result
{
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    // Long enough after the takeover for a restarted process to start and join.
    let mut job = four_processes("12", 4, &dir)?;
    job.wait_for("epoch 1/12", Duration::from_secs(90))?;
    signal("STOP", job.pids[0])?;
    job.wait_for("[rank 2] rank 2: the controller is of term 1", Duration::from_secs(90))?;
    // Killed once the new controller trains (a death while a run starts ends that run): an
    // epoch it trained itself, not one restored from the takeover's bundle, has an ETA.
    let trained = |line: &str| line.starts_with("[rank 1] epoch") && line.contains("ETA");
    job.wait_until("epoch the new controller trained", trained, Duration::from_secs(90))?;
    kill9(job.pids[2])?;
    job.wait_for("[launch] restarting rank 2", Duration::from_secs(30))?;
    for line in [
        "rank 1 takes over as the controller of term 1",
        "[launch] rank 1 took over as the controller of term 1",
        "rank 0's process (the controller of term 0) is still there: killing it",
        "[standby] the run goes on in",
    ] {
        assert!(
            job.seen.iter().any(|l| l.contains(line)),
            "{line:?} missing:\n{}",
            job.seen.join("\n")
        );
    }
    let (code, out) = job.finish(Duration::from_secs(300))?;
    assert_eq!(code, Some(0), "{out}");
    // The restarted process joined the new term's controller and trained to the end.
    let restarted = out.split("[launch] restarting rank 2").nth(1).unwrap_or_default();
    assert!(restarted.contains("rank 2: the controller is of term 1"), "{out}");
    assert!(restarted.contains("[rank 2] rank 2: finished"), "{out}");
    assert!(!out.contains("rank 0 outlived"), "{out}");
    // Rank 0's process came back as a rank of the new term and trained to the end.
    let rank0 = out.split("[launch] restarting rank 0").nth(1).unwrap_or_default();
    assert!(rank0.contains("[rank 0] rank 0: the controller is of term 1"), "{out}");
    assert!(rank0.contains("[rank 0] rank 0: finished"), "{out}");
    let taken = tmp.path().join("run-term1");
    let s = summary(&taken)?;
    assert_eq!(s["epochs_completed"].as_u64(), Some(12), "{out}");
    // Both came back into the run: the world is whole again.
    let rejoined = rejoined(&s);
    assert!(rejoined.contains(&0) && rejoined.contains(&2), "rejoins {rejoined:?}:\n{out}");
    println!("{}", audit(&taken, &[&dir])?);
    Ok(())
}

/// Takeovers chain: in a 4-process job with `--max-restarts 2`, `kill -9` of rank 0's process
/// (the controller of term 0) makes rank 1's the controller of term 1, mirroring to rank 2's;
/// once that controller trains, `kill -9` of rank 1's process makes rank 2's the controller of
/// term 2. Both killed processes come back as ranks of the newest term; the run completes in
/// `run-term2`, and `fdl audit` through the chain (term 1's ledger, then term 0's) finds every
/// sample once.
#[test]
fn takeovers_chain_when_each_new_controller_is_killed_in_turn() -> Result {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    let mut job = four_processes("16", 2, &dir)?;
    job.wait_for("epoch 1/16", Duration::from_secs(90))?;
    kill9(job.pids[0])?;
    job.wait_for("[launch] rank 1 took over as the controller of term 1", Duration::from_secs(60))?;
    // Killed once the new controller trains and its standby heard of a reduce: an epoch it
    // trained itself has an ETA.
    // And once the restarted rank 0 is back in the run (in either order): the case of a rank
    // still joining when its term's controller dies has a test of its own
    // (a_rank_joining_a_dying_term_joins_the_next_and_stands_by_for_the_one_after).
    let (trained, rejoined) = (std::cell::Cell::new(false), std::cell::Cell::new(false));
    let both = |line: &str| {
        trained.set(trained.get() || line.starts_with("[rank 1] epoch") && line.contains("ETA"));
        rejoined.set(rejoined.get() || line.contains("rank 0 rejoined at reduce"));
        trained.get() && rejoined.get()
    };
    let what = "an epoch the term-1 controller trained, and rank 0 rejoined";
    job.wait_until(what, both, Duration::from_secs(90))?;
    kill9(job.pids[1])?;
    job.wait_for("[launch] rank 2 took over as the controller of term 2", Duration::from_secs(60))?;
    let (code, out) = job.finish(Duration::from_secs(300))?;
    assert_eq!(code, Some(0), "{out}");
    for line in [
        "rank 1 takes over as the controller of term 1",
        "the standby (it takes over as the controller of term 2",
        "rank 2 takes over as the controller of term 2",
        // The launcher's view of the second kill, whichever came first (the death or the
        // notice; see the_standby_takes_over_when_the_controller_is_killed).
        "[launch] rank 1 was killed by signal 9",
        "rank 3: the controller is of term 2",
        "[rank 3] rank 3: finished",
    ] {
        assert!(out.contains(line), "{line:?} missing:\n{out}");
    }
    // Both killed processes came back as ranks of a later term and trained to the end.
    for rank in [0, 1] {
        let back =
            out.split(&format!("[launch] restarting rank {rank}")).nth(1).unwrap_or_default();
        assert!(back.contains(&format!("[rank {rank}] rank {rank}: finished")), "{out}");
    }
    let (term1, term2) = (tmp.path().join("run-term1"), tmp.path().join("run-term2"));
    assert_eq!(summary(&term2)?["epochs_completed"].as_u64(), Some(16), "{out}");
    println!("{}", audit(&term2, &[&term1, &dir])?);
    Ok(())
}

/// `kill -9` of the controller's process while a restarted rank is joining it (4 processes,
/// `--max-restarts 2`): rank 2's process is killed, and the controller's right after the
/// launcher restarts it. The joiner finds its term's controller gone and joins the next term's
/// as soon as rank 1's standby has taken over (it tries both in turn). Rank 2 is the standby of
/// term 2: the term-1 controller sends the new process the whole state when it is admitted, so
/// when rank 1's process is killed in turn, rank 2 takes over. The run completes in term 2's
/// directory with every sample once across the three.
#[test]
fn a_rank_joining_a_dying_term_joins_the_next_and_stands_by_for_the_one_after() -> Result {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    let mut job = four_processes("24", 2, &dir)?;
    job.wait_for("epoch 1/24", Duration::from_secs(90))?;
    kill9(job.pids[2])?;
    job.wait_for("[launch] restarting rank 2", Duration::from_secs(30))?;
    kill9(job.pids[0])?;
    // Rank 2 back at term 1, then a reduce after it (its mirror has a cut to take over from).
    let rejoined = std::cell::Cell::new(false);
    let then_a_reduce = |line: &str| {
        let reduced = rejoined.get() && line.starts_with("[rank 1] epoch");
        rejoined.set(rejoined.get() || line.contains("rank 2 rejoined at reduce"));
        reduced
    };
    let what = "rank 2 rejoined at term 1, then an epoch";
    job.wait_until(what, then_a_reduce, Duration::from_secs(90))?;
    kill9(job.pids[1])?;
    job.wait_for("[launch] rank 2 took over as the controller of term 2", Duration::from_secs(60))?;
    let (code, out) = job.finish(Duration::from_secs(300))?;
    assert_eq!(code, Some(0), "{out}");
    let restarted = out.split("[launch] restarting rank 2").nth(1).unwrap_or_default();
    // The new process starts after the controller's kill: it finds no controller answering,
    // and joins the next term's without waiting out the watchdog.
    for line in [
        "rank 2: no controller answered within",
        "joined rank 1's standby at",
        "rank 2: the controller is of term 1",
        "rank 2: the standby (it takes over as the controller of term 2",
        "rank 2 takes over as the controller of term 2",
    ] {
        assert!(restarted.contains(line), "{line:?} missing:\n{out}");
    }
    assert!(!out.contains("a mirror frame refused"), "{out}");
    let (term1, term2) = (tmp.path().join("run-term1"), tmp.path().join("run-term2"));
    assert_eq!(summary(&term2)?["epochs_completed"].as_u64(), Some(24), "{out}");
    println!("{}", audit(&term2, &[&term1, &dir])?);
    Ok(())
}

/// `kill -9` of the controller's process in a 4-process job that saves a checkpoint at every
/// reduce (the controller is capturing or writing a bundle for much of its time; the kill is
/// not timed to land in a save): the standby takes over, ranks 2 and 3 follow it, the run
/// completes in the standby's directory with every sample once, and the shared checkpoint
/// directory yields an intact bundle of the finished run.
#[test]
fn a_controller_killed_in_a_four_process_job_saving_every_reduce_is_taken_over() -> Result {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("run");
    let ck = tmp.path().join("ck");
    let ck_flag = ck.to_str().ok_or("a checkpoint path that is not UTF-8")?;
    let saving = ["--checkpoint-dir", ck_flag, "--checkpoint-every-reduces", "1"];
    let mut job = four_processes_with("8", 0, &dir, &saving)?;
    job.wait_for("epoch 1/8", Duration::from_secs(90))?;
    kill9(job.pids[0])?;
    let (code, out) = job.finish(Duration::from_secs(300))?;
    assert_eq!(code, Some(0), "{out}");
    for line in [
        "rank 0 was killed by signal 9",
        "rank 1 takes over as the controller of term 1",
        "rank 2: the controller is gone",
        "rank 3: the controller is gone",
        "[rank 3] rank 3: finished",
    ] {
        assert!(out.contains(line), "{line:?} missing:\n{out}");
    }
    let taken = tmp.path().join("run-term1");
    assert_eq!(summary(&taken)?["epochs_completed"].as_u64(), Some(8), "{out}");
    println!("{}", audit(&taken, &[&dir])?);
    println!("{}", newest_bundle(&ck)?);
    Ok(())
}

/// The controller killed at a chosen point of its work, where the hidden drill
/// (`FLODL_CONTROLLER_DRILL`) holds it after the first epoch: with a host reduce in flight
/// (every snapshot in, the ranks waiting for the update), then with a checkpoint captured and
/// not yet written (a checkpoint every epoch). Each time the standby takes over from the last
/// reduce it mirrored, the run completes with every sample once, and the checkpoint directory
/// still gives an intact bundle.
#[test]
fn the_controller_killed_in_a_reduce_or_a_checkpoint_is_taken_over() -> Result {
    for point in ["reduce", "checkpoint"] {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("run");
        let ck = tmp.path().join("ck");
        let ck_flag = ck.to_str().ok_or("a checkpoint path that is not UTF-8")?;
        let mut flags: Vec<&str> = JOB.to_vec();
        flags.extend(["--checkpoint-dir", ck_flag, "--checkpoint-every", "1"]);
        let drill = format!("{point}:30000");
        let env = [("FLODL_CONTROLLER_DRILL", drill.as_str())];
        let mut job = Launched::start_with(3, &[], &flags, &dir, &env)?;
        job.wait_for("controller drill: holding", Duration::from_secs(90))?;
        kill9(job.pids[0])?;
        let (code, out) = job.finish(Duration::from_secs(240))?;
        assert_eq!(code, Some(0), "{point}: {out}");
        for line in
            ["rank 1 takes over as the controller of term 1", "rank 2: the controller is gone"]
        {
            assert!(out.contains(line), "{point}: {line:?} missing:\n{out}");
        }
        let taken = tmp.path().join("run-term1");
        let s = summary(&taken)?;
        assert_eq!(s["epochs_completed"].as_u64(), Some(EPOCHS as u64), "{point}: {out}");
        println!("{point}: {}", audit(&taken, &[&dir])?);
        println!("{point}: {}", newest_bundle(&ck)?);
    }
    Ok(())
}

/// The job run clean in one process (no slowdown, no standby) into `tmp/clean`: the band the
/// taken-over runs' accuracy is checked against.
fn clean_run(tmp: &std::path::Path) -> Result<std::path::PathBuf> {
    let clean = tmp.join("clean");
    let flags: Vec<&str> = JOB
        .iter()
        .copied()
        .filter(|f| !["--slowdown", "20,20,20", "--standby", "1"].contains(f))
        .collect();
    in_process(&flags, &clean)?;
    Ok(clean)
}

/// The bundle a resume from the checkpoint directory `ck` takes (an error when none is intact),
/// in words.
fn newest_bundle(ck: &std::path::Path) -> Result<String> {
    let located = flodl_ddp::checkpoint::locate(ck)?;
    Ok(format!(
        "newest intact bundle {} (epoch {}); skipped {:?}",
        located.path.display(),
        located.checkpoint.epoch,
        located.skipped
    ))
}

/// The job on 4 processes, every rank slowed 60× (an epoch lasts about a second), for `epochs`
/// epochs with `--max-restarts restarts`, into `dir`.
fn four_processes(
    epochs: &'static str,
    restarts: usize,
    dir: &std::path::Path,
) -> Result<Launched> {
    four_processes_with(epochs, restarts, dir, &[])
}

/// [`four_processes`] with `extra` flags.
fn four_processes_with(
    epochs: &'static str,
    restarts: usize,
    dir: &std::path::Path,
    extra: &[&str],
) -> Result<Launched> {
    let flags = job_with(&[("--slowdown", "60,60,60,60"), ("--epochs", epochs)], extra)?;
    let restarts = restarts.to_string();
    Launched::start_with(4, &["--max-restarts", &restarts], &flags, dir, &[])
}

/// [`JOB`] with the value after each flag `name` in `values` replaced, then `extra` flags.
fn job_with<'a>(values: &[(&str, &'a str)], extra: &[&'a str]) -> Result<Vec<&'a str>> {
    let mut flags: Vec<&str> = JOB.iter().copied().chain(extra.iter().copied()).collect();
    for &(name, value) in values {
        let at = flags.iter().position(|f| *f == name).ok_or(format!("no {name}"))?;
        *flags.get_mut(at + 1).ok_or(format!("no value after {name}"))? = value;
    }
    Ok(flags)
}

//! The controller soak: `fdl launch --nproc 4 --max-restarts K` while the process hosting the
//! controller is killed every interval (at a random moment within it), so each standby in turn
//! takes over for a new term and each killed process comes back as a rank of a later one. The run
//! completes in the last term's run directory, `fdl audit` through the whole chain of ledgers
//! finds every sample of every epoch once, and the accuracy is in the clean run's band. Prints
//! the takeovers, the median time from a kill to the new controller's announcement and to its
//! first completed reduce (in seconds and in the rounds of the controller before it).
//!
//! Short by default (about 45 s, a kill every ~15 s); `FLODL_SOAK_SECS=600` and
//! `FLODL_SOAK_EVERY=60` for the long one (a kill every minute for 10 minutes).

use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};

mod support;

use support::launched::{
    Launched, Result, accuracy, audit, clean_epoch, env_secs, kill9, median, sized_slowdown,
    soak_flags, summary, trains_as_well,
};

/// Processes of the job.
const WORLD: usize = 4;
/// The first standby (the default): term `t`'s controller runs on rank `(1 + t − 1) mod WORLD`.
const FIRST_STANDBY: usize = 1;

/// The rank whose process hosts the controller of `term`.
fn host(term: usize) -> usize {
    if term == 0 { 0 } else { (FIRST_STANDBY + term - 1) % WORLD }
}

#[test]
fn the_controller_killed_every_interval_is_taken_over_each_time() -> Result {
    let soak = Duration::from_secs(env_secs("FLODL_SOAK_SECS", 45)?);
    let every = Duration::from_secs(env_secs("FLODL_SOAK_EVERY", 15)?);
    let epochs = (soak.as_secs() / 2).max(16);
    let restarts = (soak.as_secs() / every.as_secs().max(1) + 4).to_string();
    let owned = soak_flags(16384, epochs);
    let flags: Vec<&str> = owned.iter().map(String::as_str).collect();
    let tmp = tempfile::tempdir()?;
    let clean = tmp.path().join("clean");
    // About 2-3 s an epoch (sized on this machine now, as the rank soak does), so the run
    // outlasts the soak whether the machine is quiet or loaded.
    let clean_epoch = clean_epoch(&flags, &clean, epochs)?;
    let slowdown =
        sized_slowdown(WORLD, 16384, Duration::from_millis(2500), clean_epoch, tmp.path())?;
    let slowdowns = vec![slowdown.to_string(); WORLD].join(",");
    let dir = tmp.path().join("soak");
    let mut args = flags.clone();
    args.extend(["--slowdown", &slowdowns, "--quiet"]);
    let log = ("RUST_LOG", "warn,flodl_ddp::runtime::engine::coordinator=debug");
    let launcher = ["--max-restarts", restarts.as_str()];
    let started = Instant::now();
    let mut job = Launched::start_with(WORLD, &launcher, &args, &dir, &[log])?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(env_secs("FLODL_SOAK_SEED", 31)?);
    let mut term = 0usize;
    // Per takeover: seconds from the kill to the announcement, and to the first reduce done.
    let (mut announced, mut recovered) = (Vec::new(), Vec::new());
    // Per controller: when its reduces were seen done (for its round time).
    let mut rounds: Vec<f64> = Vec::new();
    let mut last_done: Option<Instant> = None;
    let done_by = |rank: usize, line: &str| {
        line.starts_with(&format!("[rank {rank}]")) && line.contains("reduce done")
    };
    // The first controller trains before the first kill.
    job.wait_until("a reduce of the first controller", |l| done_by(0, l), Duration::from_secs(90))?;
    while started.elapsed() + every / 2 < soak {
        let at = Instant::now() + every.mul_f64(rng.random_range(0.5..1.5));
        let mut ended = false;
        while Instant::now() < at {
            if job.child.try_wait()?.is_some() {
                ended = true;
                break;
            }
            if let Some(line) = job.next_line(Duration::from_millis(100))
                && done_by(host(term), &line)
            {
                let now = Instant::now();
                if let Some(t) = last_done.replace(now) {
                    rounds.push((now - t).as_secs_f64());
                }
            }
        }
        if ended || job.child.try_wait()?.is_some() {
            break;
        }
        let (dead, next) = (host(term), host(term + 1));
        let pid = job.pids[dead];
        kill9(pid)?;
        let killed = Instant::now();
        last_done = None;
        term += 1;
        println!(
            "soak: killed rank {dead}'s process (the controller of term {}) at {:?}",
            term - 1,
            started.elapsed()
        );
        // The takeover, the new controller's first reduce, and the killed process back as a
        // rank of the new term and admitted (it may be a later term's standby), before the
        // next kill: one pass over the lines, as they may come in any order.
        let took = format!("[launch] rank {next} took over as the controller of term {term}");
        let restarted = format!("[launch] restarting rank {dead}");
        let rejoined = format!("rank {dead} rejoined at reduce");
        let mut seen: [Option<f64>; 4] = [None; 4];
        let deadline = Instant::now() + Duration::from_secs(240);
        while seen.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(line) = job.next_line(left) else {
                let tail = job.seen.iter().rev().take(60).rev().cloned().collect::<Vec<_>>();
                return Err(format!(
                    "takeover {term}: seen {seen:?}; last lines:\n{}",
                    tail.join("\n")
                )
                .into());
            };
            let at = Some(killed.elapsed().as_secs_f64());
            let hits = [
                line.contains(&took),
                done_by(next, &line),
                line.contains(&restarted),
                line.contains(&rejoined),
            ];
            for (slot, hit) in seen.iter_mut().zip(hits) {
                if hit && slot.is_none() {
                    *slot = at;
                }
            }
        }
        announced.extend(seen[0]);
        recovered.extend(seen[1]);
    }
    let limit = soak + Duration::from_secs(180 + epochs * 10);
    let (code, out) = job.finish(limit)?;
    let wall = started.elapsed();
    assert_eq!(code, Some(0), "{}", out.lines().rev().take(60).collect::<Vec<_>>().join("\n"));
    assert!(term >= 2, "only {term} takeovers in {soak:?}");
    let run_of = |t: usize| {
        if t == 0 { dir.clone() } else { tmp.path().join(format!("soak-term{t}")) }
    };
    let last = run_of(term);
    let s = summary(&last)?;
    assert_eq!(s["epochs_completed"].as_u64(), Some(epochs), "{s}");
    let chain: Vec<std::path::PathBuf> = (0..term).rev().map(run_of).collect();
    let earlier: Vec<&std::path::Path> = chain.iter().map(|p| p.as_path()).collect();
    let audited = audit(&last, &earlier)?;
    let round = median(rounds);
    let (a, c) = (accuracy(&clean)?, accuracy(&last)?);
    let in_rounds = |x: Option<f64>| match (x, round) {
        (Some(x), Some(r)) if r > 0.0 => format!("{:.1}", x / r),
        _ => "-".into(),
    };
    println!(
        "controller soak: {:.0} s wall, {term} takeovers (a kill every ~{every:?}), median kill → \
         new controller announced {} s, kill → its first reduce done {} s ({} of the median round, \
         {} ms), {epochs} epochs, accuracy {c:.4} (clean run {a:.4})",
        wall.as_secs_f64(),
        median(announced).map_or("-".into(), |m| format!("{m:.2}")),
        median(recovered.clone()).map_or("-".into(), |m| format!("{m:.2}")),
        in_rounds(median(recovered)),
        round.map_or("-".into(), |r| format!("{:.0}", r * 1000.0)),
    );
    println!("{audited}");
    trains_as_well("clean against the controller soak", a, c, 0.8)?;
    Ok(())
}

//! The chaos harness: `fdl launch --nproc 4 --backend host --max-restarts K` while a rank
//! process other than rank 0's (which hosts the controller) is killed once per `rate` interval,
//! at a moment drawn uniformly within it, and restarted by the launcher. The run completes,
//! `fdl audit` finds every sample of every epoch in the final model exactly once, and the
//! accuracy is in the clean run's band. Prints the work retention (from the audit), the
//! recovery time per death (death → next completed reduce), the time from each death to its
//! rank's rejoin, and the accuracy.
//!
//! Short by default (bounded, about a minute, a kill every ~6 s; counts and exactness only, no
//! speed assertion). The long form, torchft's rates: `FLODL_CHAOS_RATE=60 FLODL_CHAOS_SECS=600
//! FLODL_CHAOS_THEN_RATE=15 FLODL_CHAOS_THEN_SECS=300`, which also runs the same job without
//! failures and prints the throughput against it. `FLODL_CHAOS_SLOWDOWN=F` slows every rank by
//! `F` instead of the factor sized on the machine for 2-3 s an epoch (`sized_slowdown`, a few
//! seconds of short calm jobs), `FLODL_CHAOS_SEED` seeds the kills.

use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};

mod support;

use support::launched::{
    Launched, Result, accuracy, audit, clean_epoch, env_secs, kill9, median, records,
    sized_slowdown, soak_flags, summary, trains_as_well,
};

const TRAIN: usize = 16384;
const NPROC: usize = 4;

/// The work retention `fdl audit` printed.
fn retention(report: &str) -> Option<f64> {
    let line = report.lines().find(|l| l.starts_with("work retention: "))?;
    line.trim_start_matches("work retention: ").split_whitespace().next()?.parse().ok()
}

/// Samples trained per second of the run's training (every epoch's samples over the wall of
/// the last epoch's end).
fn throughput(dir: &std::path::Path) -> Result<f64> {
    let epochs = records(dir, "epoch")?;
    let samples: f64 = epochs.iter().filter_map(|e| e["samples"].as_f64()).sum();
    let wall = epochs.last().and_then(|e| e["t_s"].as_f64()).ok_or("no epoch time")?;
    Ok(samples / wall.max(1e-9))
}

#[test]
fn ranks_killed_at_random_moments_at_a_rate() -> Result {
    // (interval, how long) per phase: a kill at a uniform moment of each interval.
    let mut phases = vec![(
        Duration::from_secs(env_secs("FLODL_CHAOS_RATE", 6)?),
        Duration::from_secs(env_secs("FLODL_CHAOS_SECS", 30)?),
    )];
    let then = env_secs("FLODL_CHAOS_THEN_SECS", 0)?;
    if then > 0 {
        phases.push((
            Duration::from_secs(env_secs("FLODL_CHAOS_THEN_RATE", 15)?),
            Duration::from_secs(then),
        ));
    }
    let total: Duration = phases.iter().map(|p| p.1).sum();
    let long = total >= Duration::from_secs(300);
    // About 2-3 s an epoch (the slowdown sized on the machine now), so the job outlasts the
    // chaos whether the machine is quiet or loaded.
    let epochs = (total.as_secs() / 2 + 10).max(20);
    let kills_max: u64 = phases.iter().map(|(r, d)| d.as_secs() / r.as_secs().max(1) + 1).sum();
    let restarts = (kills_max + 4).to_string();
    let owned = soak_flags(TRAIN, epochs);
    let flags: Vec<&str> = owned.iter().map(String::as_str).collect();
    let tmp = tempfile::tempdir()?;
    let clean = tmp.path().join("clean");
    let clean_epoch = clean_epoch(&flags, &clean, epochs)?;
    // Sized by short calm launched jobs: a factor from the clean run alone gave 9 to 30 s an
    // epoch on the same quiet machine, and the 25-epoch job outlasted the test's deadline.
    let slowdown = match std::env::var("FLODL_CHAOS_SLOWDOWN") {
        Ok(v) => v.parse::<f64>().map_err(|e| format!("FLODL_CHAOS_SLOWDOWN={v}: {e}"))?,
        Err(_) => {
            sized_slowdown(NPROC, TRAIN, Duration::from_millis(2500), clean_epoch, tmp.path())?
        }
    };
    let slowdowns = vec![slowdown.to_string(); NPROC].join(",");
    let mut args = flags.clone();
    args.extend(["--slowdown", &slowdowns, "--quiet"]);
    // The same job without failures: the throughput the chaotic one is compared with.
    let calm = if long {
        let dir = tmp.path().join("calm");
        let job = Launched::start_with(NPROC, &[], &args, &dir, &[])?;
        let (code, out) = job.finish(total * 3 + Duration::from_secs(300))?;
        assert_eq!(code, Some(0), "the calm job: {out}");
        Some(throughput(&dir)?)
    } else {
        None
    };
    let dir = tmp.path().join("chaos");
    let launcher = ["--max-restarts", restarts.as_str()];
    let started = Instant::now();
    let mut job = Launched::start_with(NPROC, &launcher, &args, &dir, &[])?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(env_secs("FLODL_CHAOS_SEED", 30)?);
    let mut kills = 0usize;
    let mut phase_start = Duration::ZERO;
    'phases: for &(rate, length) in &phases {
        let mut interval = phase_start;
        while interval + rate <= phase_start + length {
            let at = interval + rate.mul_f64(rng.random_range(0.0..1.0));
            interval += rate;
            while started.elapsed() < at {
                if job.child.try_wait()?.is_some() {
                    break 'phases;
                }
                job.next_line(Duration::from_millis(50));
            }
            let rank = rng.random_range(1..NPROC);
            kill9(job.pids[rank])?;
            kills += 1;
            println!("chaos: killed rank {rank} at {:?}", started.elapsed());
            // Its restart and rejoin before the next kill (each kill is a death of a member).
            job.wait_for(&format!("[launch] restarting rank {rank}"), Duration::from_secs(60))?;
            if job
                .wait_for(&format!("rank {rank} rejoined at reduce"), Duration::from_secs(180))
                .is_err()
            {
                if job.child.try_wait()?.is_some() {
                    break 'phases;
                }
                return Err(format!("rank {rank} did not rejoin").into());
            }
            interval = interval.max(started.elapsed());
        }
        phase_start += length;
    }
    let (code, out) = job.finish(total + Duration::from_secs(120 + epochs * 10))?;
    assert_eq!(code, Some(0), "{}", out.lines().rev().take(60).collect::<Vec<_>>().join("\n"));
    // The standby's process, however often replaced, mirrors the controller frame by frame: a
    // refusal would leave the run without a standby that can take over.
    let refused: Vec<&str> = out.lines().filter(|l| l.contains("a mirror frame refused")).collect();
    assert!(refused.is_empty(), "the standby refused mirror frames:\n{}", refused.join("\n"));
    let s = summary(&dir)?;
    let faults = s["faults"].as_array().cloned().unwrap_or_default();
    let rejoins = s["rejoins"].as_array().cloned().unwrap_or_default();
    let reduces: Vec<f64> =
        records(&dir, "reduce")?.iter().filter_map(|r| r["at_ms"].as_f64()).collect();
    let recoveries: Vec<f64> = faults
        .iter()
        .filter_map(|f| f["at_ms"].as_f64())
        .filter_map(|t| reduces.iter().find(|&&r| r > t).map(|r| r - t))
        .collect();
    let back_in: Vec<f64> = faults
        .iter()
        .filter_map(|f| {
            let (rank, t) = (f["rank"].as_u64()?, f["at_ms"].as_f64()?);
            rejoins
                .iter()
                .filter(|j| j["rank"].as_u64() == Some(rank))
                .filter_map(|j| j["at_ms"].as_f64())
                .find(|&j| j > t)
                .map(|j| j - t)
        })
        .collect();
    let audited = audit(&dir, &[]);
    let (a, c) = (accuracy(&clean)?, accuracy(&dir)?);
    let relative = match calm {
        Some(calm) => format!("{:.3}", throughput(&dir)? / calm),
        None => "-".into(),
    };
    let fmt = |xs: &[f64]| xs.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" ");
    println!(
        "chaos: {NPROC} rank processes, phases {phases:?}, {:.0} s wall, {kills} kills, {} deaths, \
         {} rejoins; work retention {}; recovery ms per death (death → next completed reduce) \
         [{}], median {}; death → rejoin ms [{}], median {}; throughput against the calm job \
         {relative}; accuracy {c:.4} (clean in-process run {a:.4}); load {}",
        started.elapsed().as_secs_f64(),
        faults.len(),
        rejoins.len(),
        audited.as_deref().ok().and_then(retention).map_or("-".into(), |r| format!("{r:.4}")),
        fmt(&recoveries),
        median(recoveries.clone()).map_or("-".into(), |m| format!("{m:.0}")),
        fmt(&back_in),
        median(back_in.clone()).map_or("-".into(), |m| format!("{m:.0}")),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    );
    println!("{}", audited?);
    assert!(kills >= 2, "only {kills} kills");
    assert_eq!(faults.len(), kills, "every kill is a death survived: {s}");
    assert!(rejoins.len() + 1 >= kills, "{} rejoins for {kills} kills", rejoins.len());
    trains_as_well("clean against chaos", a, c, 0.8)?;
    Ok(())
}

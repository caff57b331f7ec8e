//! `fdl launch` jobs driven by a test: output lines on a channel, rank pids, the run directory's
//! records.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub(crate) type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

pub(crate) const FDL: &str = env!("CARGO_BIN_EXE_fdl");

/// A duration in seconds from the environment variable `name` (a soak's or a chaos run's
/// length), or `default` when it is unset.
pub(crate) fn env_secs(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => Ok(v.parse().map_err(|e| format!("{name}={v}: {e}"))?),
        Err(_) => Ok(default),
    }
}

/// The median of `xs` (the mean of the middle two for an even count); `None` when empty.
pub(crate) fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    (n > 0).then(|| if n % 2 == 1 { xs[n / 2] } else { (xs[n / 2 - 1] + xs[n / 2]) / 2.0 })
}

/// The in-process run of `flags` on 3 CPU ranks (`fdl train --ranks 3`) into `out`; its test
/// accuracy.
pub(crate) fn in_process(flags: &[&str], out: &Path) -> Result<f64> {
    let run = Command::new(FDL)
        .args(["train", "--ranks", "3", "--quiet", "--out"])
        .arg(out)
        .args(flags)
        .output()?;
    if !run.status.success() {
        return Err(format!(
            "in-process run {flags:?} failed: {}",
            String::from_utf8_lossy(&run.stderr)
        )
        .into());
    }
    accuracy(out)
}

/// How far a job's accuracy may fall below the run it is compared with (the in-process run of
/// the same flags, or the job whose bundle it resumed): short `Cadence` and `Async` runs vary by
/// a few points from run to run.
pub(crate) const BAND: f64 = 0.06;

/// Checks that a job trained as well as the run it is compared with: its accuracy `got` at
/// least `floor` and at most [`BAND`] below `reference`. One-sided: a loaded machine now and
/// then lands the reference run itself a few points low, which says nothing about the job.
pub(crate) fn trains_as_well(what: &str, reference: f64, got: f64, floor: f64) -> Result {
    if got < floor || got < reference - BAND {
        return Err(format!("{what}: {reference:.3} against {got:.3} (floor {floor})").into());
    }
    Ok(())
}

/// The run directory's `summary.json`.
pub(crate) fn summary(dir: &Path) -> Result<Value> {
    Ok(serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json"))?)?)
}

/// The ranks that joined the run again, in the order of a run summary's `rejoins`.
pub(crate) fn rejoined(summary: &Value) -> Vec<u64> {
    summary["rejoins"]
        .as_array()
        .map(|r| r.iter().filter_map(|e| e["rank"].as_u64()).collect())
        .unwrap_or_default()
}

/// The samples each rank trained, by rank, from a run summary.
pub(crate) fn samples_by_rank(summary: &Value) -> Result<Vec<f64>> {
    Ok(summary["ranks"]
        .as_array()
        .ok_or("no ranks")?
        .iter()
        .map(|r| r["samples"].as_f64().unwrap_or(0.0))
        .collect())
}

/// Waits for `child` to end: whether it succeeded, and its stderr.
pub(crate) fn outcome(child: std::process::Child) -> Result<(bool, String)> {
    let o = child.wait_with_output()?;
    Ok((o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned()))
}

/// The final test accuracy of a run directory.
pub(crate) fn accuracy(dir: &Path) -> Result<f64> {
    summary(dir)?["test"]["accuracy"].as_f64().ok_or_else(|| "no test accuracy".into())
}

/// The records of `metrics.jsonl` of kind `kind`, in order.
pub(crate) fn records(dir: &Path, kind: &str) -> Result<Vec<Value>> {
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl"))?;
    Ok(metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == kind)
        .collect())
}

/// The `--slowdown` (every rank's) under which an epoch of a calm `nproc`-process job of
/// [`soak_flags`] with `train` samples lasts about `epoch` on this machine now, from a guess by
/// the clean in-process run's epoch, `clean_epoch` seconds ([`clean_epoch`]). A slowed rank
/// holds each step for the factor times its compute, and a step computed right after a sleep
/// is slower than one in a busy loop (cold caches, a core clocked down): by several times on a
/// quiet machine, less on a loaded one. So the clean in-process run does not
/// size it (measured: a launched epoch of 0.5 to 1.25 times the factor times the clean run's
/// epoch, 9 to 30 s at the same sizing on the same machine). Two calm jobs of an eighth of the
/// samples for two epochs do: each scales the factor by the target over its ranks' median
/// compute in its last epoch (times eight); the second runs at the first's estimate, since a
/// step's compute depends on how long its rank slept before it.
pub(crate) fn sized_slowdown(
    nproc: usize,
    train: usize,
    epoch: Duration,
    clean_epoch: f64,
    dir: &Path,
) -> Result<f64> {
    const PART: usize = 8;
    let mut factor = (6.0 / clean_epoch.max(1e-3)).clamp(40.0, 1000.0).round();
    for round in 0..2 {
        let owned = soak_flags(train / PART, 2);
        let mut args: Vec<&str> = owned.iter().map(String::as_str).collect();
        let slowdowns = vec![factor.to_string(); nproc].join(",");
        args.extend(["--slowdown", &slowdowns, "--quiet"]);
        let out = dir.join(format!("sizing{round}"));
        let job = Launched::start_with(nproc, &[], &args, &out, &[])?;
        let (code, text) = job.finish(Duration::from_secs(180))?;
        if code != Some(0) {
            return Err(format!("the sizing job at --slowdown {factor}: {text}").into());
        }
        // The ranks' compute (slowdown included) in the last epoch, which scales with the
        // samples; an epoch's evaluation and reduces do not, and the short one is mostly them.
        let last = records(&out, "epoch")?.pop().ok_or("the sizing job recorded no epoch")?;
        let computes: Vec<f64> = last["ranks"]
            .as_array()
            .map(|ranks| ranks.iter().filter_map(|r| r["compute_ms"].as_f64()).collect())
            .unwrap_or_default();
        let compute = median(computes).ok_or("the sizing job's epoch has no ranks")?;
        let estimate = compute / 1000.0 * PART as f64;
        let next = (factor * epoch.as_secs_f64() / estimate.max(1e-3)).clamp(10.0, 4000.0).round();
        println!("sizing: {estimate:.1} s of compute an epoch at --slowdown {factor}; next {next}");
        factor = next;
    }
    Ok(factor)
}

/// The job the soaks and the chaos run share: host backend, Cadence, `train` samples of a
/// 64-wide MLP for `epochs` epochs, 1,000 test samples, a 10 s watchdog.
pub(crate) fn soak_flags(train: usize, epochs: u64) -> Vec<String> {
    let (train, epochs) = (train.to_string(), epochs.to_string());
    let flags = [
        "--backend",
        "host",
        "--policy",
        "cadence",
        "--train-subset",
        &train,
        "--test-subset",
        "1000",
        "--epochs",
        &epochs,
        "--hidden",
        "64",
        "--watchdog",
        "10",
    ];
    flags.iter().map(|f| f.to_string()).collect()
}

/// Runs `flags` in-process into `out` ([`in_process`]) and returns the seconds one of its
/// `epochs` epochs took: what a soak sizes its ranks' slowdown from.
pub(crate) fn clean_epoch(flags: &[&str], out: &Path, epochs: u64) -> Result<f64> {
    let timed = Instant::now();
    in_process(flags, out)?;
    Ok(timed.elapsed().as_secs_f64() / epochs as f64)
}

/// `fdl audit dir` (through the runs it resumed, nearest first, when given): its report when it
/// exits 0, every sample of every epoch in the final model exactly once; its output as the
/// error otherwise.
pub(crate) fn audit(dir: &Path, resumed_from: &[&Path]) -> Result<String> {
    let mut command = Command::new(FDL);
    command.arg("audit").arg(dir);
    for earlier in resumed_from {
        command.arg("--resumed-from").arg(earlier);
    }
    let run = command.output()?;
    let out =
        format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    if !run.status.success() {
        return Err(format!("fdl audit {} failed ({}):\n{out}", dir.display(), run.status).into());
    }
    Ok(out)
}

/// `kill -NAME pid` (`NAME` a signal's name or number: `STOP`, `CONT`, `9`).
pub(crate) fn signal(name: &str, pid: i32) -> Result {
    let ok = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status()?.success();
    if ok { Ok(()) } else { Err(format!("kill -{name} {pid} failed").into()) }
}

/// `kill -9 pid`.
pub(crate) fn kill9(pid: i32) -> Result {
    signal("9", pid)
}

/// A launched job whose output lines arrive on a channel; the current pid of each rank.
pub(crate) struct Launched {
    pub(crate) child: Child,
    lines: mpsc::Receiver<String>,
    pub(crate) pids: Vec<i32>,
    pub(crate) seen: Vec<String>,
    /// The job's run directory, when known: a job that outlives its wait says how far it got.
    out: Option<std::path::PathBuf>,
}

impl Launched {
    /// `fdl launch --nproc 3 --out OUT ARGS`.
    pub(crate) fn start(args: &[&str], out: &Path) -> Result<Launched> {
        Launched::start_with(3, &[], args, out, &[])
    }

    /// `fdl launch --nproc NPROC LAUNCHER --out OUT ARGS` with `env` added.
    pub(crate) fn start_with(
        nproc: usize,
        launcher: &[&str],
        args: &[&str],
        out: &Path,
        env: &[(&str, &str)],
    ) -> Result<Launched> {
        let mut job = Launched::spawn(
            Command::new(FDL)
                .args(["launch", "--nproc", &nproc.to_string()])
                .args(launcher)
                .arg("--out")
                .arg(out)
                .args(args)
                .envs(env.iter().copied()),
        )?;
        job.out = Some(out.to_path_buf());
        for rank in 0..nproc {
            let line =
                job.wait_for(&format!("[launch] rank {rank}: pid"), Duration::from_secs(20))?;
            job.pids.push(pid_in(&line)?);
        }
        Ok(job)
    }

    /// Starts `command` with its stdout and stderr lines on the channel; no rank pids known (an
    /// MPI job's ranks are mpirun's children).
    pub(crate) fn spawn(command: &mut Command) -> Result<Launched> {
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
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
        Ok(Launched { child, lines, pids: Vec::new(), seen: Vec::new(), out: None })
    }

    /// Takes one line (within `wait`), keeping track of restarted ranks' pids; `None` when no
    /// line came.
    pub(crate) fn next_line(&mut self, wait: Duration) -> Option<String> {
        let line = self.lines.recv_timeout(wait).ok()?;
        for (rank, pid) in self.pids.iter_mut().enumerate() {
            if line.starts_with(&format!("[launch] rank {rank}: pid"))
                && let Ok(p) = pid_in(&line)
            {
                *pid = p;
            }
        }
        self.seen.push(line.clone());
        Some(line)
    }

    /// The first line containing `what`, within `wait`.
    pub(crate) fn wait_for(&mut self, what: &str, wait: Duration) -> Result<String> {
        self.wait_until(&format!("a line with {what:?}"), |line| line.contains(what), wait)
    }

    /// Returns once a line with `what` has been seen, earlier or within `wait`.
    pub(crate) fn seen_or_wait_for(&mut self, what: &str, wait: Duration) -> Result<()> {
        if !self.seen.iter().any(|l| l.contains(what)) {
            self.wait_for(what, wait)?;
        }
        Ok(())
    }

    /// The first line that passes `pick` (described by `what` in the error), within `wait`.
    pub(crate) fn wait_until(
        &mut self,
        what: &str,
        pick: impl Fn(&str) -> bool,
        wait: Duration,
    ) -> Result<String> {
        let deadline = Instant::now() + wait;
        while let Some(line) = self.next_line(deadline.saturating_duration_since(Instant::now())) {
            if pick(&line) {
                return Ok(line);
            }
        }
        let tail = self.seen.iter().rev().take(80).rev().cloned().collect::<Vec<_>>();
        Err(format!("no {what} within {wait:?}; last lines:\n{}", tail.join("\n")).into())
    }

    /// Waits for the launcher to exit; its code and every line.
    pub(crate) fn finish(mut self, wait: Duration) -> Result<(Option<i32>, String)> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(status) = self.child.try_wait()? {
                while self.next_line(Duration::from_millis(500)).is_some() {}
                return Ok((status.code(), self.seen.join("\n")));
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let progress = self.out.as_deref().map(progress).unwrap_or_default();
                return Err(format!(
                    "the launcher did not exit within {wait:?}{progress}:\n{}",
                    self.seen.join("\n")
                )
                .into());
            }
            while self.next_line(Duration::ZERO).is_some() {}
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// How far the run in `dir` got, by its records (a slow job and a stalled one differ here):
/// `" (N epochs recorded; the last reduce, round R, at T s)"`.
fn progress(dir: &Path) -> String {
    let epochs = records(dir, "epoch").map_or(0, |e| e.len());
    let last = records(dir, "reduce").ok().and_then(|mut r| r.pop());
    match last {
        Some(r) => format!(
            " ({epochs} epochs recorded; the last reduce, round {}, at {:.1} s)",
            r["round"],
            r["at_ms"].as_f64().unwrap_or(f64::NAN) / 1000.0
        ),
        None => format!(" ({epochs} epochs recorded, no reduce)"),
    }
}

/// The pid at the end of a `[launch] rank R: pid P` line.
fn pid_in(line: &str) -> Result<i32> {
    Ok(line.rsplit(' ').next().ok_or("no pid")?.parse()?)
}

/// A process of a job started by hand, with the cluster's environment: it takes seat `rank` and
/// presents the key of `seat` (`controller` or `rank-R`: its own, unless a test lies), running
/// `fdl train` with `job` and `extra`.
pub(crate) fn by_hand(
    keys: &Path,
    port: u16,
    rank: usize,
    seat: &str,
    job: &[&str],
    extra: &[&str],
    out: &Path,
) -> Result<Child> {
    Ok(cluster_env(&mut Command::new(FDL), keys, port, rank, seat)
        .args(["train", "--quiet", "--join-timeout", "20", "--out"])
        .arg(out)
        .args(job)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?)
}

/// `command` in the environment of seat `rank` of a 3-rank job on loopback whose controller
/// listens on `port`, presenting the key of `seat` from `keys`.
pub(crate) fn cluster_env<'c>(
    command: &'c mut Command,
    keys: &Path,
    port: u16,
    rank: usize,
    seat: &str,
) -> &'c mut Command {
    command
        .env("FLODL_RANK", rank.to_string())
        .env("FLODL_WORLD_SIZE", "3")
        .env("FLODL_LOCAL_RANK", rank.to_string())
        .env("FLODL_CONTROLLER_ADDR", "127.0.0.1")
        .env("FLODL_CONTROLLER_PORT", port.to_string())
        .env("FLODL_TLS_CA", keys.join("ca.pem"))
        .env("FLODL_TLS_CERT", keys.join(format!("{seat}.pem")))
        .env("FLODL_TLS_KEY", keys.join(format!("{seat}.key")))
}

/// The key of seat `rank` (`controller` for rank 0's process, which hosts the controller).
pub(crate) fn own_key(rank: usize) -> String {
    if rank == 0 { "controller".to_owned() } else { format!("rank-{rank}") }
}

/// A loopback port free now.
pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `fdl cluster keys DIR --world 3`.
pub(crate) fn keys(dir: &Path) -> Result {
    let out =
        Command::new(FDL).args(["cluster", "keys"]).arg(dir).args(["--world", "3"]).output()?;
    if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).into()) }
}

//! `fdl launch --mpi --nproc N [--max-restarts R] [train flags]`: an MPI job on this host.
//!
//! The controller (coordinator, membership, ElChe, dispatch, checkpoints) runs in a process of
//! its own, `fdl train --controller N`, outside the MPI world; Open MPI's `mpirun` then starts
//! the N ranks (`fdl train` under mpirun), which form the MPI world (the data plane of the
//! collective backend) and each join the controller over mutual TLS (FLODL_CONTROLLER_ADDR,
//! FLODL_CONTROLLER_PORT and FLODL_TLS_* exported to them with `-x`).
//!
//! An MPI world cannot shrink, so a rank's death ends the MPI job (mpirun stops the other
//! ranks; the controller ends the run, keeping the bundle of the last completed reduce). With
//! `--max-restarts R` the launcher then starts the job again from that bundle, up to R times,
//! as torchelastic restarts a job; the controller's error says how much work was lost.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::args::LaunchArgs;
use crate::launch::{GRACE, JobStatus, POLL, code_of, describe, relay};

/// How long a process that is told to stop may take before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The ranks of a restarted job: the survivors, the bundle resumed onto that smaller world
/// (elastic resume: per-rank optimizer state mapped, the rest of the epoch re-sharded).
fn restart_world(world: usize, survivors: usize) -> usize {
    survivors.clamp(1, world)
}

/// `args` with the per-rank `--slowdown` factors cut to the first `world` ranks (a restart
/// on fewer ranks would refuse more factors than ranks).
fn fit_ranks(args: &[OsString], world: usize) -> Vec<OsString> {
    let cut = |list: &str| list.split(',').take(world).collect::<Vec<_>>().join(",");
    let mut out = Vec::with_capacity(args.len());
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let text = arg.to_string_lossy();
        if text == "--slowdown" {
            out.push(arg.clone());
            if let Some(list) = iter.next() {
                out.push(cut(&list.to_string_lossy()).into());
            }
        } else if let Some(list) = text.strip_prefix("--slowdown=") {
            out.push(format!("--slowdown={}", cut(list)).into());
        } else {
            out.push(arg.clone());
        }
    }
    out
}

/// How one attempt of the job ended.
#[derive(Debug)]
enum Attempt {
    /// The controller finished the run.
    Done,
    /// The run could not go on (a rank died, which ends the MPI job) and its state is saved:
    /// the controller exited with [`CannotGoOn::EXIT`](crate::resume::CannotGoOn::EXIT).
    RankLost { mpirun: ExitStatus, controller: ExitStatus },
    /// The controller failed otherwise (a configuration error, say): a restart would fail the
    /// same way.
    Failed { controller: ExitStatus },
}

/// `fdl launch --mpi`.
///
/// # Errors
/// Keys or a port that cannot be made, a process that cannot start; [`JobStatus`] when the
/// job failed and no restart is left.
pub(crate) fn run(args: &LaunchArgs) -> Result<()> {
    let (temp, keys, listener) = crate::launch::job_keys(args.nproc)?;
    let port = listener.local_addr()?.port();
    let exe = std::env::current_exe().context("cannot find this fdl binary")?;
    let mut train = crate::launch::child_args();
    // Restarts resume from the checkpoint directory: the user's, else one beside the keys
    // (given to every process: it is part of the run specification they agree on).
    let (cfg, _) = crate::config::resolve(&args.train.flags, &args.train.run)?;
    let checkpoints = match &cfg.run.checkpoint_dir {
        Some(dir) => Some(dir.clone()),
        None if args.max_restarts > 0 => {
            let dir = temp.path().join("checkpoints");
            train.extend(["--checkpoint-dir".into(), dir.as_os_str().to_owned()]);
            Some(dir)
        }
        None => None,
    };
    let mut env: Vec<(String, OsString)> = vec![
        (flodl_cluster::identity::CONTROLLER_ADDR.into(), "127.0.0.1".into()),
        (flodl_cluster::identity::CONTROLLER_PORT.into(), port.to_string().into()),
    ];
    // Every rank its own key (mpirun hands them all the same variables: each fills in its rank);
    // the controller's process gets the controller's key and the listener (run_attempt).
    let ranks_env = |files: flodl_cluster::TlsFiles| -> Vec<(String, OsString)> {
        files.vars().into_iter().map(|(k, v)| (k.to_string(), v.as_os_str().to_owned())).collect()
    };
    let controller_env = ranks_env(keys.controller());
    env.extend(ranks_env(keys.ranks()));
    let pids: Arc<Mutex<Vec<Pid>>> = Arc::default();
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("cannot catch SIGINT/SIGTERM")?;
    let handle = signals.handle();
    let forwarder = {
        let pids = pids.clone();
        std::thread::spawn(move || {
            for signal in signals.forever() {
                let Ok(signal) = Signal::try_from(signal) else { continue };
                for pid in pids.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    // A child that has ended refuses: nothing to do.
                    let _ = kill(*pid, signal);
                }
            }
        })
    };
    let watchdog = crate::launch::job_watchdog(&cfg);
    let mut world = args.nproc;
    let mut resume: Option<PathBuf> = None;
    let mut outcome = Err(JobStatus { code: 1 }.into());
    for attempt in 0..=args.max_restarts {
        let train = fit_ranks(&train, world);
        let mut controller_args = train.clone();
        controller_args.extend(["--controller".into(), world.to_string().into()]);
        if let Some(from) = &resume {
            controller_args.extend(["--resume".into(), from.as_os_str().to_owned()]);
        }
        let controller =
            ControllerCommand { args: &controller_args, env: &controller_env, listener: &listener };
        let ended = run_attempt(&exe, &controller, &train, world, &env, &pids, watchdog);
        let ended = match ended {
            Ok(ended) => ended,
            Err(e) => {
                outcome = Err(e);
                break;
            }
        };
        match ended {
            Attempt::Done => {
                outcome = Ok(());
                break;
            }
            Attempt::Failed { controller } => {
                println!("[launch] the controller {}: not restarting", describe(controller));
                outcome = Err(JobStatus { code: code_of(controller) }.into());
                break;
            }
            Attempt::RankLost { mpirun, controller } => {
                println!(
                    "[launch] the MPI job ended (mpirun {}; the controller {}): an MPI world \
                     cannot shrink",
                    describe(mpirun),
                    describe(controller)
                );
                outcome = Err(JobStatus { code: code_of(controller) }.into());
                if attempt == args.max_restarts {
                    if args.max_restarts > 0 {
                        println!("[launch] no restart left ({} used)", args.max_restarts);
                    }
                    break;
                }
                // The first death ends the world; mpirun stops the others.
                let survivors = world.saturating_sub(1).max(1);
                world = restart_world(world, survivors);
                resume = checkpoints.as_deref().and_then(bundle_of);
                let from = resume.as_ref().map_or_else(
                    || "the start (no checkpoint yet)".to_owned(),
                    |p| p.display().to_string(),
                );
                println!(
                    "[launch] restart {} of {}: {world} rank(s) ({survivors} survived) from {from}",
                    attempt + 1,
                    args.max_restarts
                );
            }
        }
    }
    handle.close();
    let _ = forwarder.join();
    drop(temp);
    outcome
}

/// The bundle a restart resumes from, with where it stands, or `None` when there is none yet.
fn bundle_of(dir: &Path) -> Option<PathBuf> {
    match flodl_ddp::checkpoint::locate(dir) {
        Ok(found) => {
            let c = &found.checkpoint;
            println!(
                "[launch] last bundle: {} (reduce {}, step {}, epoch {})",
                found.path.display(),
                c.reduce_version,
                c.global_step,
                c.epoch
            );
            Some(dir.to_path_buf())
        }
        Err(e) => {
            println!("[launch] no bundle to resume from in {}: {e}", dir.display());
            None
        }
    }
}

/// Starts a process with its output relayed under `tag`, recording its pid for signals.
fn start(
    mut cmd: Command,
    tag: &str,
    pids: &Mutex<Vec<Pid>>,
) -> Result<(Child, Vec<std::thread::JoinHandle<()>>)> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // Its own process group: a terminal's Ctrl-C reaches the launcher only, which forwards it.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().with_context(|| format!("cannot start {tag}"))?;
    println!("[launch] {tag}: pid {}", child.id());
    let mut relays = Vec::new();
    if let Some(out) = child.stdout.take() {
        relays.push(relay(out, format!("[{tag}]"), false));
    }
    if let Some(err) = child.stderr.take() {
        relays.push(relay(err, format!("[{tag}]"), true));
    }
    if let Ok(pid) = i32::try_from(child.id()) {
        pids.lock().unwrap_or_else(|p| p.into_inner()).push(Pid::from_raw(pid));
    }
    Ok((child, relays))
}

/// Open MPI's `mpirun` starting `world` ranks of `fdl train` with the job's variables
/// exported.
fn mpirun(exe: &Path, train: &[OsString], world: usize, env: &[(String, OsString)]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["-np", &world.to_string(), "--oversubscribe", "--tag-output"]);
    // Open MPI refuses root without it; the owner of /proc/self is the effective user.
    if std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0) {
        cmd.arg("--allow-run-as-root");
    }
    for (name, value) in env {
        cmd.env(name, value).args(["-x", name]);
    }
    cmd.arg(exe).args(train);
    cmd
}

/// What the controller's process is started with beyond the job's variables.
struct ControllerCommand<'a> {
    /// Its `fdl train` arguments.
    args: &'a [OsString],
    /// Its certificate variables (the controller's), over the ranks'.
    env: &'a [(String, OsString)],
    /// The listener bound for it.
    listener: &'a std::net::TcpListener,
}

/// One attempt: the controller, then mpirun's ranks; waits for both.
fn run_attempt(
    exe: &Path,
    controller_cmd: &ControllerCommand<'_>,
    train: &[OsString],
    world: usize,
    env: &[(String, OsString)],
    pids: &Mutex<Vec<Pid>>,
    watchdog: Duration,
) -> Result<Attempt> {
    pids.lock().unwrap_or_else(|p| p.into_inner()).clear();
    let mut cmd = Command::new(exe);
    cmd.args(controller_cmd.args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .envs(controller_cmd.env.iter().map(|(k, v)| (k, v)));
    crate::launch::hand_listener(&mut cmd, controller_cmd.listener);
    let (mut controller, mut relays) = start(cmd, "controller", pids)?;
    let (mut ranks, more) = match start(mpirun(exe, train, world, env), "mpi", pids) {
        Ok(started) => started,
        Err(e) => {
            stop(&mut controller, Signal::SIGTERM);
            return Err(e.context("is Open MPI installed (mpirun on the PATH)?"));
        }
    };
    relays.extend(more);
    let bound = watchdog + GRACE;
    let mut first: Option<(bool, Instant)> = None; // (the controller ended first, when)
    let (mut c_status, mut r_status) = (None, None);
    loop {
        if c_status.is_none()
            && let Ok(Some(s)) = controller.try_wait()
        {
            println!("[launch] the controller {}", describe(s));
            c_status = Some(s);
            first.get_or_insert((true, Instant::now()));
        }
        if r_status.is_none()
            && let Ok(Some(s)) = ranks.try_wait()
        {
            println!("[launch] mpirun {}", describe(s));
            r_status = Some(s);
            first.get_or_insert((false, Instant::now()));
        }
        if c_status.is_some() && r_status.is_some() {
            break;
        }
        // One side ended: the other gets the watchdog and a grace to follow; a failed
        // controller's ranks are stopped at once (their run is over).
        if let Some((controller_first, since)) = first {
            let failed = c_status.is_some_and(|s| !s.success());
            if (controller_first && failed) || since.elapsed() > bound {
                if r_status.is_none() {
                    r_status = Some(stop(&mut ranks, Signal::SIGTERM));
                }
                if c_status.is_none() {
                    println!("[launch] the controller outlived mpirun by {bound:?}: stopping it");
                    c_status = Some(stop(&mut controller, Signal::SIGTERM));
                }
                break;
            }
        }
        std::thread::sleep(POLL);
    }
    for relay in relays {
        let _ = relay.join();
    }
    let (Some(controller), Some(mpirun)) = (c_status, r_status) else {
        bail!("a process of the job was not reaped");
    };
    Ok(if controller.success() {
        Attempt::Done
    } else if controller.code() == Some(i32::from(crate::resume::CannotGoOn::EXIT)) {
        Attempt::RankLost { mpirun, controller }
    } else {
        Attempt::Failed { controller }
    })
}

/// Sends `signal` to `child`, waits [`STOP_GRACE`], then kills it; returns its status.
fn stop(child: &mut Child, signal: Signal) -> ExitStatus {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if let Ok(Some(s)) = child.try_wait() {
            return s;
        }
        std::thread::sleep(POLL);
    }
    let _ = child.kill();
    child.wait().unwrap_or_else(|_| std::os::unix::process::ExitStatusExt::from_raw(9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_rank_factors_are_cut_to_the_restarted_world() {
        let cases: [(&[&str], usize, &[&str]); 4] = [
            (
                &["train", "--slowdown", "20,20,1", "--epochs", "2"],
                2,
                &["train", "--slowdown", "20,20", "--epochs", "2"],
            ),
            (&["train", "--slowdown=1,2.5,3"], 1, &["train", "--slowdown=1"]),
            (&["train", "--slowdown", "1,2"], 3, &["train", "--slowdown", "1,2"]),
            (&["train", "--epochs", "2"], 2, &["train", "--epochs", "2"]),
        ];
        for (args, world, want) in cases {
            let args: Vec<OsString> = args.iter().map(OsString::from).collect();
            let got = fit_ranks(&args, world);
            let want: Vec<OsString> = want.iter().map(OsString::from).collect();
            assert_eq!(got, want, "{args:?} on {world}");
        }
        assert_eq!(restart_world(3, 2), 2);
        assert_eq!(restart_world(2, 0), 1);
    }
}

//! `fdl launch --nproc N [train flags]`: a cluster job on this host. A fresh job CA in a
//! private temporary directory (removed at exit), N rank processes of this same binary
//! running `fdl train` with the cluster's environment (rank, world, the controller's loopback
//! listener bound here and handed to rank 0's process, each process its own certificate: the
//! controller's to rank 0, rank r's to rank r), each output line prefixed with its rank, Ctrl-C and
//! SIGTERM forwarded to the ranks by pid, and the job's status (rank 0's, whose process hosts
//! the controller and decides the run; the standby's after a takeover, `term_notice`) returned.
//! With `--max-restarts N`, a rank process other than the current controller's host (or the
//! standby about to take over from it) that dies (exits non-zero or is killed) is started again
//! with the same rank, at most N times over the job; it joins the
//! running job at its next reduce (host backend, and NCCL across GPU processes; an MPI world
//! cannot grow, see `mpi_job`). After a takeover the old host's process is a rank like the
//! others, restarted the same way into the new term.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flodl_cluster::JobKeys;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::args::LaunchArgs;

/// How often the launcher looks at its children.
pub(crate) const POLL: Duration = Duration::from_millis(50);
/// How long the other ranks may outlive rank 0 (they exit on their own once the controller is
/// gone; this bounds a stuck one), on top of the watchdog.
pub(crate) const GRACE: Duration = Duration::from_secs(15);

/// The job's status: the controller's process's exit (rank 0's, or the standby's after a
/// takeover; 128 + the signal when it was killed).
#[derive(Debug)]
pub(crate) struct JobStatus {
    /// The exit code to return.
    pub(crate) code: u8,
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the job failed (the controller's process exited with {})", self.code)
    }
}

impl std::error::Error for JobStatus {}

/// The exit code of a status: its code, or 128 + the signal that killed it.
pub(crate) fn code_of(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(s)) => u8::try_from(128 + s).unwrap_or(1),
        (None, None) => 1,
    }
}

/// A status in words.
pub(crate) fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        (None, None) => "ended".to_owned(),
    }
}

/// The `train` arguments of the children: this process's arguments after `launch`, less the
/// launcher's own (`--nproc N`, `--mpi`, `--max-restarts N`).
pub(crate) fn child_args() -> Vec<OsString> {
    const WITH_VALUE: [&str; 2] = ["--nproc", "--max-restarts"];
    let mut args = std::env::args_os().skip_while(|a| a != "launch").skip(1);
    let mut out = vec![OsString::from("train")];
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy();
        if WITH_VALUE.contains(&text.as_ref()) {
            args.next();
        } else if text != "--mpi" && !WITH_VALUE.iter().any(|f| text.starts_with(&format!("{f}=")))
        {
            out.push(arg);
        }
    }
    out
}

/// A job's keys for `world` ranks (a fresh CA in a private temporary directory, removed when
/// dropped; the CA's key is not kept) and its controller's loopback listener, bound here and
/// handed to the controller's process ([`hand_listener`]) so no other process can take its port.
pub(crate) fn job_keys(
    world: usize,
) -> Result<(tempfile::TempDir, JobKeys, std::net::TcpListener)> {
    let temp = tempfile::Builder::new()
        .prefix("flodl-job-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir()
        .context("cannot make a private directory for the job's keys")?;
    let hosts = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let keys = JobKeys::generate(temp.path(), world, &hosts, false)
        .context("cannot make the job's keys")?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .context("cannot bind a loopback port for the controller")?;
    Ok((temp, keys, listener))
}

/// The descriptor the controller's process finds its listener at.
const LISTENER_FD: i32 = 3;

/// Makes `cmd`'s process inherit `listener` as descriptor [`LISTENER_FD`], named by
/// `FLODL_CONTROLLER_FD` (the launcher's own copy stays open: a restarted controller gets it
/// again, on the same port).
pub(crate) fn hand_listener(cmd: &mut Command, listener: &std::net::TcpListener) {
    use std::os::fd::AsRawFd;
    let fd = listener.as_raw_fd();
    cmd.env(flodl_cluster::identity::CONTROLLER_FD, LISTENER_FD.to_string());
    // SAFETY: the closure runs in the child between fork and exec and calls only fcntl and
    // dup2, which are async-signal-safe; it allocates nothing and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            if fd == LISTENER_FD {
                // dup2 onto itself would keep close-on-exec: clear it instead.
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, LISTENER_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Copies `from`'s lines to stdout or stderr, each prefixed with `tag`.
pub(crate) fn relay(
    from: impl Read + Send + 'static,
    tag: String,
    to_stderr: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            let line = line.trim_end_matches('\r');
            if to_stderr {
                let _ = writeln!(std::io::stderr().lock(), "{tag} {line}");
            } else {
                let _ = writeln!(std::io::stdout().lock(), "{tag} {line}");
            }
        }
    })
}

/// How a rank process starts: with the job, or restarted after its death (joining the
/// controller of the job's term then).
#[derive(Debug, Clone, Copy)]
enum Start {
    First,
    Restart { term: u64 },
}

/// How the launcher starts a rank process: this binary running `fdl train` with the job's
/// environment.
struct RankCommand {
    exe: std::path::PathBuf,
    train: Vec<OsString>,
    world: usize,
    listener: std::net::TcpListener,
    keys: JobKeys,
    /// The standby chain, with a standby only: which rank hosts each term, and per rank the
    /// listener of the address its process takes over at, bound here for it (each incarnation
    /// of that rank's process inherits it).
    chain: Option<(flodl_ddp::Standby, Vec<std::net::TcpListener>)>,
    /// The pipe a standby's process announces its takeover on (with a standby only).
    notices: Option<crate::term_notice::NoticeWriter>,
    /// How long a restarted rank waits for its term's controller before it follows the next
    /// term's (the job's watchdog: a standby takes over within it).
    rejoin_wait: Duration,
}

impl RankCommand {
    /// Starts rank `rank`'s process, its output relayed with the rank's tag; restarted after a
    /// takeover (a term above 0) it joins the controller of that term at its host's address.
    fn spawn(
        &self,
        rank: usize,
        start: Start,
        relays: &mut Vec<std::thread::JoinHandle<()>>,
    ) -> Result<Child> {
        let (term, restart) = match start {
            Start::First => (0, false),
            Start::Restart { term } => (term, true),
        };
        let port = match self.host_listener(term) {
            Some(listener) => listener.local_addr()?.port(),
            None => self.listener.local_addr()?.port(),
        };
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.train)
            .env("FLODL_RANK", rank.to_string())
            .env("FLODL_WORLD_SIZE", self.world.to_string())
            .env("FLODL_LOCAL_RANK", rank.to_string())
            .env("FLODL_CONTROLLER_ADDR", "127.0.0.1")
            .env("FLODL_CONTROLLER_PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a terminal's Ctrl-C reaches the launcher only, which
            // forwards it once.
            .process_group(0);
        // Rank 0's process hosts the first controller: it gets the controller's key and
        // listener; every other rank its own key only (rank 0's too, restarted after a
        // takeover: a rank then), and the listener and standby key its process takes over with.
        let files = if rank == 0 && term == 0 {
            hand_listener(&mut cmd, &self.listener);
            self.keys.controller()
        } else {
            if let Some((_, listeners)) = &self.chain {
                hand_listener(&mut cmd, &listeners[rank]);
                let files = self.keys.standby(rank);
                cmd.env(crate::takeover::STANDBY_CERT, &files.cert)
                    .env(crate::takeover::STANDBY_KEY, &files.key);
            }
            self.keys.rank(rank)
        };
        // Every rank is told where each rank's process takes over, and may announce a takeover.
        if let Some((_, listeners)) = &self.chain {
            let addrs =
                listeners.iter().map(|l| l.local_addr()).collect::<std::io::Result<Vec<_>>>()?;
            cmd.env(crate::takeover::STANDBY_ADDRS, crate::takeover::Chain::text(&addrs));
            if let Some(notices) = &self.notices {
                notices.hand(&mut cmd);
            }
            if term > 0 {
                cmd.env(crate::takeover::TERM, term.to_string());
            }
            if restart {
                cmd.env(crate::takeover::REJOIN_WAIT, self.rejoin_wait.as_secs_f64().to_string());
            }
        }
        for (name, path) in files.vars() {
            cmd.env(name, path);
        }
        let mut child = cmd.spawn().with_context(|| format!("cannot start rank {rank}"))?;
        println!("[launch] rank {rank}: pid {}", child.id());
        let tag = format!("[rank {rank}]");
        if let Some(out) = child.stdout.take() {
            relays.push(relay(out, tag.clone(), false));
        }
        if let Some(err) = child.stderr.take() {
            relays.push(relay(err, tag, true));
        }
        Ok(child)
    }
}

impl RankCommand {
    /// The rank whose process hosts the controller of `term` (rank 0 for the first).
    fn host(&self, term: u64) -> usize {
        self.chain.as_ref().and_then(|(s, _)| s.host(term, self.world)).unwrap_or(0)
    }

    /// The listener of the controller of `term` when a standby hosts it (`None` for the first).
    fn host_listener(&self, term: u64) -> Option<&std::net::TcpListener> {
        let (standby, listeners) = self.chain.as_ref().filter(|_| term > 0)?;
        listeners.get(standby.host(term, self.world)?)
    }
}

/// The children's pids, by rank, shared with the signal forwarder (a restarted rank's pid
/// replaces its predecessor's).
type Pids = std::sync::Arc<std::sync::Mutex<Vec<Pid>>>;

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).unwrap_or(0))
}

/// `fdl launch`.
///
/// # Errors
/// No rank, keys or port that cannot be made, a child that cannot start; [`JobStatus`] when
/// rank 0 did not exit 0.
pub(crate) fn run(args: &LaunchArgs) -> Result<()> {
    if args.nproc == 0 {
        bail!("--nproc must be at least 1");
    }
    if args.mpi {
        return crate::mpi_job::run(args);
    }
    let (cfg, _) = crate::config::resolve(&args.train.flags, &args.train.run)?;
    let cpu_ranks = cluster_devices(&cfg, args.nproc)?.first() == Some(&flodl_tensor::Device::Cpu);
    if cfg.run.backend == Some(flodl_ddp::Backend::Collective) && cpu_ranks {
        bail!(
            "the collective backend across CPU rank processes runs them as one MPI world: use \
             fdl launch --mpi (an fdl built with --features mpi), or --backend host"
        );
    }
    let (temp, keys, listener) = job_keys(args.nproc)?;
    let exe = std::env::current_exe().context("cannot find this fdl binary")?;
    // Where each rank's process takes over, bound now like the controller's (host backend with
    // a standby only).
    let standby = cfg.run.standby.unwrap_or_default();
    let chain = match standby.rank(args.nproc) {
        Some(first) if cfg.run.backend.unwrap_or_default() == flodl_ddp::Backend::Host => {
            let listeners = (0..args.nproc)
                .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
                .collect::<std::io::Result<Vec<_>>>()
                .context("cannot bind a loopback port per rank for the standbys")?;
            let at = |r: usize| listeners[r].local_addr().map(|a| a.to_string());
            println!(
                "[launch] standby: rank {first} takes over first (at {}), then the next rank \
                 round the world for each later term",
                at(first)?
            );
            Some((standby, listeners))
        }
        _ => None,
    };
    let (notices, writer) = match chain {
        Some(_) => {
            let (notices, writer) = crate::term_notice::pipe()?;
            (Some(notices), Some(writer))
        }
        None => (None, None),
    };
    let command = RankCommand {
        exe,
        train: child_args(),
        world: args.nproc,
        listener,
        keys,
        chain,
        notices: writer,
        rejoin_wait: job_watchdog(&cfg),
    };
    let mut children: Vec<Child> = Vec::with_capacity(args.nproc);
    let mut relays = Vec::new();
    for rank in 0..args.nproc {
        match command.spawn(rank, Start::First, &mut relays) {
            Ok(child) => children.push(child),
            Err(e) => {
                stop_all(&mut children, Signal::SIGKILL);
                return Err(e);
            }
        }
    }
    let pids: Pids =
        std::sync::Arc::new(std::sync::Mutex::new(children.iter().map(pid_of).collect()));
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("cannot catch SIGINT/SIGTERM")?;
    let handle = signals.handle();
    let forwarded = pids.clone();
    let forwarder = std::thread::spawn(move || {
        for signal in signals.forever() {
            let Ok(signal) = Signal::try_from(signal) else { continue };
            let pids = forwarded.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for pid in pids {
                // A child that has ended (or whose pid was reaped) refuses: nothing to do.
                let _ = kill(pid, signal);
            }
        }
    });
    let watchdog = job_watchdog(&cfg);
    let restarts = Restarts {
        left: args.max_restarts,
        total: args.max_restarts,
        term: 0,
        command: &command,
        pids: &pids,
    };
    let status = wait_job(&mut children, watchdog + GRACE, restarts, notices, &mut relays);
    handle.close();
    let _ = forwarder.join();
    for relay in relays {
        let _ = relay.join();
    }
    drop(temp);
    match status {
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(JobStatus { code: code_of(s) }.into()),
        None => Err(JobStatus { code: 1 }.into()),
    }
}

/// The restarts a job may still make of its dead rank processes.
struct Restarts<'a> {
    left: usize,
    total: usize,
    /// The controller's term: a rank restarted after a takeover joins that term's controller.
    term: u64,
    command: &'a RankCommand,
    pids: &'a Pids,
}

impl Restarts<'_> {
    /// Restarts `rank`, which ended with `status`, when it died (not a clean exit), does not
    /// host the controller of the job's term and restarts are left; true when it runs again.
    fn restart(
        &mut self,
        rank: usize,
        status: ExitStatus,
        children: &mut [Child],
        relays: &mut Vec<std::thread::JoinHandle<()>>,
    ) -> bool {
        // The controller's process decides the job; after a takeover it is a rank like any.
        if rank == self.command.host(self.term) || status.success() || self.left == 0 {
            return false;
        }
        let n = self.total - self.left + 1;
        println!("[launch] restarting rank {rank} (restart {n} of at most {})", self.total);
        match self.command.spawn(rank, Start::Restart { term: self.term }, relays) {
            Ok(child) => {
                self.left -= 1;
                if let Some(pid) = self.pids.lock().unwrap_or_else(|p| p.into_inner()).get_mut(rank)
                {
                    *pid = pid_of(&child);
                }
                if let Some(slot) = children.get_mut(rank) {
                    *slot = child;
                }
                true
            }
            Err(e) => {
                println!("[launch] rank {rank} could not be restarted: {e:#}");
                false
            }
        }
    }
}

/// Waits for the children, restarting dead ones while `restarts` allows and the controller's
/// process runs. The job's status is the controller's process's: rank 0's, then the process of
/// each standby once it announced its takeover on the `notices` (or once the controller's
/// process was killed by a signal with the next term's host alive: it is about to take over).
/// A takeover fences the old controller: its process, if still there (stopped, or alive but cut
/// off from its ranks), is killed, and restarted as a rank of the new term while restarts are
/// left. Once the deciding process has ended, the others get `grace` to end on their own before
/// they are killed.
fn wait_job(
    children: &mut [Child],
    grace: Duration,
    mut restarts: Restarts<'_>,
    mut notices: Option<crate::term_notice::TermNotices>,
    relays: &mut Vec<std::thread::JoinHandle<()>>,
) -> Option<ExitStatus> {
    let command = restarts.command;
    let chained = command.chain.is_some();
    let mut ended: Vec<Option<ExitStatus>> = children.iter().map(|_| None).collect();
    let mut decider = 0;
    let mut since_decider: Option<Instant> = None;
    loop {
        let announced = notices.as_mut().map_or(0, crate::term_notice::TermNotices::poll);
        if announced > restarts.term {
            let old = restarts.term;
            restarts.term = announced;
            let host = command.host(announced);
            println!(
                "[launch] rank {host} took over as the controller of term {announced}: its status \
                 is the job's; ranks restarted from now on join it"
            );
            if ended[host].is_none() {
                decider = host;
                since_decider = None;
            }
            // Fencing: an old controller still there (stopped, or cut off from its ranks) would
            // go on training for a term nobody follows; this job has one controller.
            for term in old..announced {
                let fenced = command.host(term);
                if fenced == host {
                    continue;
                }
                if ended[fenced].is_none() {
                    println!(
                        "[launch] rank {fenced}'s process (the controller of term {term}) is \
                         still there: killing it"
                    );
                    let _ = children[fenced].kill();
                    ended[fenced] = children[fenced].wait().ok();
                    // How it ended: by the fence, or (killed just before the notice came) by
                    // whatever had killed it.
                    if let Some(status) = ended[fenced] {
                        println!("[launch] rank {fenced} {}", describe(status));
                    }
                }
                // Its seat is a rank's now: restarts bring it back into the new term.
                if let Some(status) = ended[fenced]
                    && restarts.restart(fenced, status, children, relays)
                {
                    ended[fenced] = None;
                }
            }
        }
        for rank in 0..children.len() {
            if ended[rank].is_some() {
                continue;
            }
            let Ok(Some(status)) = children[rank].try_wait() else { continue };
            println!("[launch] rank {rank} {}", describe(status));
            // The deciding process is never restarted: a standby chosen to take over that ended
            // without announcing its term (nothing to take over from) ends the job, whose ranks
            // would otherwise wait for a controller that never comes.
            if since_decider.is_none()
                && rank != decider
                && restarts.restart(rank, status, children, relays)
            {
                continue;
            }
            ended[rank] = Some(status);
            if rank != decider {
                continue;
            }
            // Killed (crash-stop), not a run that failed: its ranks were told to stop.
            let killed = chained && status.signal().is_some();
            let next = command.host(restarts.term + 1);
            match Some(next).filter(|&s| killed && s != rank && ended[s].is_none()) {
                Some(s) => {
                    println!(
                        "[launch] the controller's process (rank {rank}) died: the standby \
                         (rank {s}) takes over, and its status is the job's"
                    );
                    decider = s;
                }
                None => since_decider = Some(Instant::now()),
            }
        }
        if ended.iter().all(Option::is_some) {
            return ended.get(decider).copied().flatten();
        }
        if since_decider.is_some_and(|t| t.elapsed() > grace) {
            for (rank, child) in children.iter_mut().enumerate() {
                if ended[rank].is_none() {
                    println!(
                        "[launch] rank {rank} outlived the controller's process by {grace:?}: \
                         killing it"
                    );
                    let _ = child.kill();
                    ended[rank] = child.wait().ok();
                }
            }
            return ended.get(decider).copied().flatten();
        }
        std::thread::sleep(POLL);
    }
}

/// Sends `signal` to every child and reaps them.
fn stop_all(children: &mut [Child], signal: Signal) {
    for child in children.iter_mut() {
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
        let _ = child.wait();
    }
}

/// `fdl cluster keys DIR --world N [--host H...]`: a job CA (its key kept in DIR, to issue
/// ranks later), the controller's certificate and one per rank, for a job across hosts;
/// `fdl cluster keys DIR --rank R`: rank R's certificate issued with that CA (a host that joins
/// later).
///
/// # Errors
/// Neither or both of `--world` and `--rank`; the files cannot be made or written; a directory
/// others can read.
pub(crate) fn keys(args: &crate::args::KeysArgs) -> Result<()> {
    let rank_files = |files: &flodl_cluster::TlsFiles| {
        for (name, path) in files.vars() {
            println!("{name}={}", path.display());
        }
    };
    match (args.world, args.rank) {
        (Some(world), None) => {
            let mut hosts = args.hosts.clone();
            if hosts.is_empty() {
                hosts = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
            }
            let keys = JobKeys::generate(&args.dir, world, &hosts, true)
                .context("cannot make the job's keys")?;
            println!(
                "# every process ({{seat}}: `controller` in rank 0's process when those files are \
                 on its host, else `rank-R`; a --controller N process: controller.pem/.key):"
            );
            rank_files(&keys.seats());
            let standbys = keys.standbys();
            println!(
                "# every rank process as a standby (a takeover chain also needs {}: where each \
                 rank's process takes over, host:port per rank in rank order):",
                crate::takeover::STANDBY_ADDRS
            );
            println!("{}={}", crate::takeover::STANDBY_CERT, standbys.cert.display());
            println!("{}={}", crate::takeover::STANDBY_KEY, standbys.key.display());
            println!(
                "copy to each host ca.pem and only the certificate and key of the processes it \
                 runs; keep {} on this host (it issues ranks: fdl cluster keys {} --rank R)",
                JobKeys::CA_KEY_FILE,
                args.dir.display()
            );
        }
        (None, Some(rank)) => {
            let files = JobKeys::issue(&args.dir, rank).context("cannot issue the rank's key")?;
            rank_files(&files);
            let standby = JobKeys::at(&args.dir).standby(rank);
            println!("{}={}", crate::takeover::STANDBY_CERT, standby.cert.display());
            println!("{}={}", crate::takeover::STANDBY_KEY, standby.key.display());
        }
        _ => bail!(
            "fdl cluster keys DIR needs --world N (a new job's keys) or --rank R (one more \
             rank's certificate from DIR's CA)"
        ),
    }
    Ok(())
}

/// This process's place in a cluster job its launcher started (`None` when no launcher set a
/// rank): identity from the environment, certificates from the flags or `FLODL_TLS_*`, the
/// bind address, join timeout and the frame cap of the model.
///
/// # Errors
/// Inconsistent launcher variables, missing or unusable certificates; cluster flags without
/// a launcher's environment.
pub(crate) fn place(
    flags: &crate::args::ClusterFlags,
    cfg: &crate::config::TrainConfig,
) -> Result<Option<flodl_ddp::Cluster>> {
    if let Some(world) = flags.controller {
        return controller_place(flags, world).map(Some);
    }
    let Some(identity) = flodl_cluster::Identity::from_env()? else {
        if flags.tls_ca.is_some()
            || flags.bind.is_some()
            || flags.join_timeout.is_some()
            || flags.quorum.is_some()
        {
            bail!(
                "--tls-*, --bind, --join-timeout and --quorum are for a rank of a cluster job: \
                 run under fdl launch, torchrun, srun or mpirun (no launcher's rank variable is \
                 set)"
            );
        }
        return Ok(None);
    };
    crate::log_warnings();
    let files = tls_files(flags, &format!("rank {}", identity.rank))?.for_rank(identity.rank);
    let mut cluster = flodl_ddp::Cluster::new(identity, &files)?;
    if let Some(addr) = flags.bind {
        cluster = cluster.bind(addr);
    }
    Ok(Some(finish_place(cluster, flags, cfg)))
}

/// The certificate files from the flags, else from `FLODL_TLS_*`; `who` names the process in
/// the error.
fn tls_files(flags: &crate::args::ClusterFlags, who: &str) -> Result<flodl_cluster::TlsFiles> {
    Ok(match (&flags.tls_ca, &flags.tls_cert, &flags.tls_key) {
        (Some(ca), Some(cert), Some(key)) => {
            flodl_cluster::TlsFiles { ca: ca.clone(), cert: cert.clone(), key: key.clone() }
        }
        _ => flodl_cluster::TlsFiles::from_env().with_context(|| {
            format!(
                "{who} of a cluster job needs the job's certificates: --tls-ca/--tls-cert/\
                 --tls-key or FLODL_TLS_CA/FLODL_TLS_CERT/FLODL_TLS_KEY (fdl cluster keys makes \
                 them)"
            )
        })?,
    })
}

/// The place of an MPI job's controller (`--controller N`): listening on `--bind`, else on the
/// listener its launcher handed down (FLODL_CONTROLLER_FD), else on loopback at
/// FLODL_CONTROLLER_PORT (default 29600).
fn controller_place(flags: &crate::args::ClusterFlags, world: usize) -> Result<flodl_ddp::Cluster> {
    crate::log_warnings();
    let files = tls_files(flags, "the controller")?;
    let bind = match flags.bind {
        Some(addr) => addr,
        None => {
            let port = match std::env::var(flodl_cluster::identity::CONTROLLER_PORT) {
                Ok(p) => p.trim().parse().with_context(|| {
                    format!("{}={p} is not a port", flodl_cluster::identity::CONTROLLER_PORT)
                })?,
                Err(_) => flodl_cluster::identity::DEFAULT_CONTROLLER_PORT,
            };
            std::net::SocketAddr::from(([127, 0, 0, 1], port))
        }
    };
    Ok(flodl_ddp::Cluster::controller(world, &files, bind)?)
}

/// The join timeout and the frame cap of the model applied to `cluster`.
fn finish_place(
    mut cluster: flodl_ddp::Cluster,
    flags: &crate::args::ClusterFlags,
    cfg: &crate::config::TrainConfig,
) -> flodl_ddp::Cluster {
    if let Some(secs) = flags.join_timeout {
        cluster = cluster.join_timeout(Duration::from_secs_f64(secs));
    }
    if let Some(ranks) = flags.quorum {
        cluster = cluster.quorum(ranks);
    }
    // A snapshot with a checkpoint part carries the parameters and the momentum: a bulk frame
    // is at most about four times the model's bytes.
    let mut widths = vec![flodl_data::mnist::PIXELS];
    widths.extend(cfg.hidden());
    widths.push(flodl_data::mnist::CLASSES);
    let params: usize = widths.windows(2).map(|w| w[0] * w[1] + w[1]).sum();
    cluster.bulk_cap(params * 4 * 4 + (1 << 20))
}

/// The devices of a cluster job as this process sees them: one of the job's kind per rank
/// (the CPU, or a GPU when this host has one and the flags allow it), with the per-rank flags
/// checked against the world.
///
/// # Errors
/// More slowdown factors or failing ranks than ranks.
pub(crate) fn cluster_devices(
    cfg: &crate::config::TrainConfig,
    world: usize,
) -> Result<Vec<flodl_tensor::Device>> {
    use flodl_tensor::Device;
    let gpu = match (cfg.run.ranks, &cfg.run.devices) {
        (Some(_), _) => false,
        (None, Some(list)) => list.iter().any(|d| matches!(d, Device::Cuda(_))),
        (None, None) => flodl_tensor::cuda_device_count() > 0,
    };
    if cfg.slowdown().len() > world {
        bail!("slowdown: {} factors given for {world} rank(s)", cfg.slowdown().len());
    }
    if let Some(f) = cfg.fail_rank().iter().find(|f| f.rank >= world) {
        bail!("fail-rank: {f} names rank {}, but there are {world} rank(s)", f.rank);
    }
    Ok(vec![if gpu { Device::Cuda(0) } else { Device::Cpu }; world])
}

/// `trainer` made a cluster job's: the job's kind of device, the place.
pub(crate) fn cluster_trainer(
    trainer: flodl_ddp::Trainer,
    devices: &[flodl_tensor::Device],
    cluster: flodl_ddp::Cluster,
) -> flodl_ddp::Trainer {
    let kind = if devices.iter().any(|d| matches!(d, flodl_tensor::Device::Cuda(_))) {
        flodl_ddp::Devices::AllGpus
    } else {
        flodl_ddp::Devices::Cpu(devices.len())
    };
    trainer.devices(kind).cluster(cluster)
}

/// The rank processes' watchdog, which bounds how long the launcher waits on a silent job: the
/// configured one, else the library's default (a value no `Duration` holds is refused by every
/// rank process, in its own words).
pub(crate) fn job_watchdog(cfg: &crate::config::TrainConfig) -> Duration {
    cfg.run
        .watchdog
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(Duration::from_secs(30))
}

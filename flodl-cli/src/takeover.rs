//! A cluster job's rank process, and what it does when its controller dies: the standby's
//! process takes over (a controller of the next term at the address its rank was told, resumed
//! from the last reduce its mirror holds, writing a run directory of its own), every other rank
//! follows it there. Host backend. Takeovers chain: the controller of term `t` runs on rank
//! `RunSpec::term_host(t)`'s process and mirrors its state to the next term's host, so the run
//! survives a controller death per term for as long as the next host's process is alive.
//!
//! Where each rank's process takes over is `FLODL_STANDBY_ADDRS` (`host:port` per rank, in rank
//! order, comma-separated; `fdl launch` binds a loopback port per rank and hands each process
//! its own); a process's standby certificate is `FLODL_STANDBY_CERT` and `FLODL_STANDBY_KEY`
//! (the job's CA is `FLODL_TLS_CA`; `fdl cluster keys` makes `standby-<r>.pem`/`.key` per rank,
//! naming that rank's standby: a rank joining term `t` verifies the name of term `t`'s host).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use flodl_ddp::{Cluster, FailureKind, RunSpec, Started, Trainer};
use flodl_tensor::Device;

use crate::args::{RunFlags, TrainArgs};
use crate::config::TrainConfig;
use crate::resume::ResumePoint;
use crate::train::{Controller, Data};

/// Where each rank's process takes over: `host:port` per rank, in rank order, comma-separated.
pub(crate) const STANDBY_ADDRS: &str = "FLODL_STANDBY_ADDRS";
/// This process's standby certificate (a server certificate naming its rank's standby).
pub(crate) const STANDBY_CERT: &str = "FLODL_STANDBY_CERT";
/// This process's standby key.
pub(crate) const STANDBY_KEY: &str = "FLODL_STANDBY_KEY";
/// The term of the controller a rank process started after a takeover joins (at its host's
/// address): `fdl launch` sets it for a rank it restarts once a standby announced its term.
pub(crate) const TERM: &str = "FLODL_TERM";
/// How long (seconds) a restarted rank process waits for its term's controller before it
/// follows the next term's: `fdl launch` sets the job's watchdog, within which a standby takes
/// over from a controller that died.
pub(crate) const REJOIN_WAIT: &str = "FLODL_REJOIN_WAIT";

/// How long a restarted rank process first tries one of the two controllers it may join (its
/// term's and the next's) before it tries the other; each round doubles it.
const JOIN_SLICE: std::time::Duration = std::time::Duration::from_secs(1);
/// The shortest try: a connection and a handshake on a loaded machine.
const MIN_SLICE: std::time::Duration = std::time::Duration::from_millis(250);

/// A rank process of a cluster job, with what it needs to take over or follow.
pub(crate) struct Rank<'a> {
    pub(crate) args: &'a TrainArgs,
    pub(crate) cfg: &'a TrainConfig,
    pub(crate) opts: &'a RunFlags,
    pub(crate) devices: &'a [Device],
    pub(crate) data: &'a Data,
}

impl Rank<'_> {
    /// Joins the controller with `trainer` (of `spec`), trains this rank's share and says how it
    /// ended; when the controller dies (its connection gone, or silent past the deadlines) in
    /// a job with a standby chain, takes over (the next term's host) or follows it.
    ///
    /// # Errors
    /// The rank was refused, its replica failed, the controller is gone with no standby to go
    /// on with, or the run after a takeover failed.
    pub(crate) fn run(&self, trainer: Trainer, spec: &RunSpec, cluster: &Cluster) -> Result<()> {
        let Some(rank) = cluster.rank() else {
            bail!("the controller's process has no rank to run")
        };
        // The controller's process stops the run at the first Ctrl-C; a second one ends this
        // process even when its rank is stuck inside a step.
        crate::interrupt::exit_on_second();
        let term = spec.term + 1;
        // The next term's controller: its host's rank and address.
        let next = Chain::from_env()?.and_then(|c| c.of(spec, term));
        // A rank process restarted into a job with a standby waits a bounded time for its
        // term's controller: it may have died while this process started (the ranks that were
        // running follow the next host on their own).
        let fallback = rejoin_wait()?.filter(|_| spec.standby_rank() != Some(rank)).zip(next);
        let Some((wait, (host, addr))) = fallback else {
            return match trainer.start()? {
                Started::Rank(handle) => self.serve(handle, spec, cluster, next),
                Started::Coordinator(_) => bail!("rank {rank} started a controller"),
            };
        };
        // Both controllers in turn, a slice each: the term's own (alive unless it died while
        // this process started) and the next term's, which answers once its host has taken
        // over, so a rank that started into a dying term joins the next as soon as it is up.
        // The slices double, so a controller slow to answer (a loaded machine) still gets a try
        // long enough for its handshake.
        let deadline = std::time::Instant::now() + wait;
        let next_place = cluster.clone().follow(addr, host);
        let mut slice = JOIN_SLICE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            slice = slice.min(left).max(MIN_SLICE);
            let own = self.trainer(None, cluster.clone().join_timeout(slice))?.term(spec.term);
            match own.start() {
                Ok(Started::Rank(handle)) => return self.serve(handle, spec, cluster, next),
                Ok(Started::Coordinator(_)) => bail!("rank {rank} started a controller"),
                Err(error) if unanswered(&error) => {
                    let ahead =
                        self.trainer(None, next_place.clone().join_timeout(slice))?.term(term);
                    let ahead_spec = ahead.spec().map_err(|e| anyhow!(e))?;
                    match ahead.start() {
                        Ok(Started::Rank(handle)) => {
                            println!(
                                "rank {rank}: no controller answered within {slice:?} ({error}); \
                                 joined rank {host}'s standby at {addr} (term {term})"
                            );
                            let after =
                                Chain::from_env()?.and_then(|c| c.of(&ahead_spec, term + 1));
                            return self.serve(handle, &ahead_spec, &next_place, after);
                        }
                        Ok(Started::Coordinator(_)) => bail!("rank {rank} started a controller"),
                        Err(ahead_error) if unanswered(&ahead_error) => {}
                        Err(ahead_error) => return Err(ahead_error.into()),
                    }
                    slice *= 2;
                    if std::time::Instant::now() >= deadline {
                        println!(
                            "rank {rank}: no controller answered within {wait:?} ({error}); \
                             following rank {host}'s standby at {addr} (term {term})"
                        );
                        return self.follow(cluster, addr, host, term);
                    }
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Trains this rank's share with `handle`, joined to the controller of `spec`'s term at
    /// `cluster`'s place, and says how it ended; when that controller dies in a job with a
    /// standby chain, takes over (`next` is this process) or follows `next`.
    fn serve(
        &self,
        handle: flodl_ddp::RankHandle,
        spec: &RunSpec,
        cluster: &Cluster,
        next: Option<(usize, SocketAddr)>,
    ) -> Result<()> {
        let rank = handle.rank();
        let term = spec.term + 1;
        let pid = std::process::id();
        let world = cluster.world();
        println!("rank {rank} of {world}: joined the controller (pid {pid})");
        if spec.term > 0 {
            println!("rank {rank}: the controller is of term {}", spec.term);
        }
        if spec.standby_rank() == Some(rank) {
            println!(
                "rank {rank}: the standby (it takes over as the controller of term {term} if the \
                 controller's process dies)"
            );
        }
        let mirror = handle.standby_mirror();
        let error = match handle.join() {
            Ok(()) => {
                println!("rank {rank}: finished");
                return Ok(());
            }
            Err(error) => error,
        };
        let gone = matches!(
            &error,
            flodl_ddp::Error::Rank { failure, .. }
                if matches!(failure.kind, FailureKind::PeerGone | FailureKind::Timeout)
        );
        let Some((host, addr)) = next.filter(|_| gone) else {
            return Err(error.into());
        };
        match mirror {
            Some(mirror) if host == rank => self.take_over(&mirror, cluster, addr, &error),
            None if host == rank => {
                bail!(
                    "the controller is gone ({error}) and this standby (rank {rank}) has no mirror"
                )
            }
            _ => {
                println!(
                    "rank {rank}: the controller is gone ({error}); following rank {host}'s \
                     standby at {addr} (term {term})"
                );
                self.follow(cluster, addr, host, term)
            }
        }
    }

    /// Joins the controller of `term` that rank `host`'s process started at `addr`, and runs
    /// there.
    fn follow(&self, cluster: &Cluster, addr: SocketAddr, host: usize, term: u64) -> Result<()> {
        let place = cluster.clone().follow(addr, host);
        let trainer = self.trainer(None, place.clone())?.term(term);
        let spec = trainer.spec().map_err(|e| anyhow!(e))?;
        self.run(trainer, &spec, &place)
    }

    /// The standby's takeover: the bundle of its mirror's last cut in a run directory of its
    /// own, then the controller of the next term on `addr`, waiting for the survivors.
    fn take_over(
        &self,
        mirror: &flodl_ddp::StandbyMirror,
        cluster: &Cluster,
        addr: SocketAddr,
        error: &flodl_ddp::Error,
    ) -> Result<()> {
        let rank = cluster.rank().unwrap_or(0);
        let probe = self.trainer(None, cluster.clone())?;
        let spec = probe.spec().map_err(|e| anyhow!(e))?;
        let Some(takeover) = mirror.takeover(&spec)? else {
            bail!(
                "the controller is gone ({error}) before the standby (rank {rank}) heard of a \
                 completed reduce: nothing to take over from"
            );
        };
        println!(
            "[standby] the controller is gone ({error}): rank {rank} takes over as the \
             controller of term {} at {addr}, from reduce {} (survivors: ranks {:?})",
            takeover.term, takeover.reduces, takeover.survivors
        );
        let (_, stamp) = crate::run_dir::utc_now();
        let first = crate::train::run_path(self.opts, &stamp);
        // The run directory of each term: the first's, then `-term<t>` beside it.
        let of_term = |t: u64| {
            let mut name = first.file_name().unwrap_or_default().to_os_string();
            if t > 0 {
                name.push(format!("-term{t}"));
            }
            first.with_file_name(name)
        };
        let path = of_term(takeover.term);
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create the run directory {}", path.display()))?;
        let bundle = path.join("takeover.fdlck");
        takeover.bundle.save(&bundle)?;
        let point = ResumePoint::locate(&bundle)?;
        let files = standby_files(rank)?;
        let place = cluster.clone().take_over(&files, addr, takeover.survivors.len())?;
        let trainer = self.trainer(Some(&point), place)?.term(takeover.term);
        let spec = trainer.spec().map_err(|e| anyhow!(e))?;
        crate::term_notice::announce(takeover.term);
        let earlier: String = (0..takeover.term)
            .rev()
            .map(|t| format!(" --resumed-from {}", of_term(t).display()))
            .collect();
        println!(
            "[standby] the run goes on in {} (its ledger continues the earlier terms': fdl audit \
             {}{earlier})",
            path.display(),
            path.display(),
        );
        let controller =
            Controller { args: self.args, cfg: self.cfg, opts: self.opts, data: self.data };
        controller.run(trainer, spec, Some(&point), path)
    }

    /// This job's trainer at `place`, resuming from `resume`.
    fn trainer(&self, resume: Option<&ResumePoint>, place: Cluster) -> Result<Trainer> {
        let trainer = crate::train::trainer(self.cfg, self.devices, self.data, resume)?;
        Ok(crate::launch::cluster_trainer(trainer, self.devices, place))
    }
}

/// Whether joining failed because no controller answered (nothing listening, or no reply
/// within the wait), not because one refused this rank.
fn unanswered(error: &flodl_ddp::Error) -> bool {
    matches!(
        error,
        flodl_ddp::Error::Net { source, .. }
            if !matches!(source, flodl_cluster::NetError::Refused { .. })
    )
}

/// How long a rank process `fdl launch` restarted waits for the first controller before it
/// follows the standby ([`REJOIN_WAIT`], seconds; `None` when unset).
///
/// # Errors
/// A value that is not a positive number of seconds.
fn rejoin_wait() -> Result<Option<std::time::Duration>> {
    let Ok(text) = std::env::var(REJOIN_WAIT) else { return Ok(None) };
    let secs: f64 = text
        .trim()
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s > 0.0)
        .ok_or_else(|| anyhow!("{REJOIN_WAIT}={text} is not a positive number of seconds"))?;
    Ok(Some(std::time::Duration::from_secs_f64(secs)))
}

/// The controller a rank process started after a takeover joins: the term from [`TERM`], its
/// host's rank under `standby` in a world of `world`, and that host's address (`None` without
/// [`TERM`], or at term 0: the first controller's).
///
/// # Errors
/// A term that is not a number, or one whose host has no address in [`STANDBY_ADDRS`].
pub(crate) fn joined_term(
    standby: flodl_ddp::Standby,
    world: usize,
) -> Result<Option<(u64, usize, SocketAddr)>> {
    let Ok(text) = std::env::var(TERM) else { return Ok(None) };
    let term: u64 =
        text.trim().parse().with_context(|| format!("{TERM}={text} is not a term number"))?;
    if term == 0 {
        return Ok(None);
    }
    let host = standby
        .host(term, world)
        .ok_or_else(|| anyhow!("{TERM}={term} in a job without a standby"))?;
    let addr = Chain::from_env()?
        .and_then(|c| c.addrs.get(host).copied())
        .ok_or_else(|| anyhow!("{TERM}={term} needs rank {host}'s address in {STANDBY_ADDRS}"))?;
    Ok(Some((term, host, addr)))
}

/// Where each rank's process takes over, as this process was told ([`STANDBY_ADDRS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chain {
    /// By rank.
    addrs: Vec<SocketAddr>,
}

impl Chain {
    /// The chain from [`STANDBY_ADDRS`] (`None` when unset: the job has no standby).
    ///
    /// # Errors
    /// An entry that is not `host:port`.
    pub(crate) fn from_env() -> Result<Option<Chain>> {
        match std::env::var(STANDBY_ADDRS) {
            Ok(text) => Chain::parse(&text).map(Some),
            Err(_) => Ok(None),
        }
    }

    /// The chain from its text: `host:port` per rank, comma-separated.
    fn parse(text: &str) -> Result<Chain> {
        use std::net::ToSocketAddrs;
        let addrs = text
            .split(',')
            .map(|entry| {
                entry
                    .trim()
                    .to_socket_addrs()
                    .with_context(|| format!("{STANDBY_ADDRS}: {entry:?} is not host:port"))?
                    .next()
                    .ok_or_else(|| anyhow!("{STANDBY_ADDRS}: {entry:?} names no address"))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Chain { addrs })
    }

    /// The text [`Chain::parse`] reads.
    pub(crate) fn text(addrs: &[SocketAddr]) -> String {
        addrs.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",")
    }

    /// The host and address of the controller of `term` (above 0) in a run of `spec`: `None`
    /// without a standby, or when that host has no address.
    fn of(&self, spec: &RunSpec, term: u64) -> Option<(usize, SocketAddr)> {
        spec.standby_rank()?;
        let host = spec.term_host(term)?;
        Some((host, *self.addrs.get(host)?))
    }
}

/// Rank `rank`'s standby certificate: [`STANDBY_CERT`] and [`STANDBY_KEY`] (`{rank}` in them
/// filled in), with the job's CA from `FLODL_TLS_CA`.
fn standby_files(rank: usize) -> Result<flodl_cluster::TlsFiles> {
    let var = |name: &str| {
        std::env::var_os(name).map(PathBuf::from).ok_or_else(|| {
            anyhow!(
                "the standby needs its certificate to take over: {STANDBY_CERT}, \
                 {STANDBY_KEY} and {} ({name} is not set; fdl cluster keys makes \
                 standby-<rank>.pem and standby-<rank>.key)",
                flodl_cluster::TlsFiles::CA_VAR
            )
        })
    };
    let files = flodl_cluster::TlsFiles {
        ca: var(flodl_cluster::TlsFiles::CA_VAR)?,
        cert: var(STANDBY_CERT)?,
        key: var(STANDBY_KEY)?,
    };
    Ok(files.for_rank(rank))
}

#[cfg(test)]
mod tests {
    use super::Chain;

    /// The chain's text reads back, and entries that are not addresses are refused.
    #[test]
    fn the_chain_reads_back() -> anyhow::Result<()> {
        let addrs: Vec<std::net::SocketAddr> =
            vec!["127.0.0.1:4100".parse()?, "127.0.0.1:4101".parse()?, "[::1]:7".parse()?];
        let text = Chain::text(&addrs);
        anyhow::ensure!(Chain::parse(&text)? == Chain { addrs }, "{text} does not read back");
        for bad in ["", "127.0.0.1", "127.0.0.1:1,,127.0.0.1:2", "x:y"] {
            anyhow::ensure!(Chain::parse(bad).is_err(), "{bad:?} was read");
        }
        Ok(())
    }
}

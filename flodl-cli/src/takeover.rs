//! A cluster job's rank process, and what it does when its controller dies: the standby rank's
//! process takes over (a controller of the next term at the standby's address, resumed from
//! the last reduce its mirror holds, writing a run directory of its own), every other rank
//! follows it there. Host backend; one takeover per job (the new controller has no standby).
//!
//! The standby's address is the one every process was told at launch, `FLODL_STANDBY_ADDR`
//! (`host:port`; `fdl launch` binds a loopback port for it and hands the socket to the
//! standby's process); the standby's controller certificate is `FLODL_STANDBY_CERT` and
//! `FLODL_STANDBY_KEY` (the job's CA is `FLODL_TLS_CA`; `fdl cluster keys` makes
//! `standby.pem`/`standby.key`).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use flodl_ddp::{Cluster, FailureKind, RunSpec, Started, Trainer};
use flodl_tensor::Device;

use crate::args::{RunFlags, TrainArgs};
use crate::config::TrainConfig;
use crate::resume::ResumePoint;
use crate::train::{Controller, Data};

/// The address the standby binds at a takeover and every rank follows to.
pub(crate) const STANDBY_ADDR: &str = "FLODL_STANDBY_ADDR";
/// The standby's controller certificate.
pub(crate) const STANDBY_CERT: &str = "FLODL_STANDBY_CERT";
/// The standby's controller key.
pub(crate) const STANDBY_KEY: &str = "FLODL_STANDBY_KEY";
/// The term of the controller a rank process started after a takeover joins (at the standby's
/// address): `fdl launch` sets it for a rank it restarts once the standby announced its term.
pub(crate) const TERM: &str = "FLODL_TERM";
/// How long (seconds) a rank process restarted before any takeover waits for the first
/// controller before it follows the standby: `fdl launch` sets the job's watchdog, within
/// which the standby takes over from a controller that died.
pub(crate) const REJOIN_WAIT: &str = "FLODL_REJOIN_WAIT";

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
    /// a job with a standby address, takes over (the standby) or follows the standby.
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
        let standby = standby_addr()?;
        // A rank process restarted into a job with a standby waits a bounded time for the
        // first controller: it may have died while this process started (the ranks that were
        // running follow the standby on their own).
        let fallback =
            rejoin_wait()?.filter(|_| spec.standby_rank().is_some_and(|s| s != rank)).zip(standby);
        let trainer = match fallback {
            Some((wait, _)) => self.trainer(None, cluster.clone().join_timeout(wait))?,
            None => trainer,
        };
        let handle = match trainer.start() {
            Ok(Started::Rank(handle)) => handle,
            Ok(Started::Coordinator(_)) => bail!("rank {rank} started a controller"),
            Err(error) => match fallback.filter(|_| unanswered(&error)) {
                Some((wait, addr)) => {
                    println!(
                        "rank {rank}: no controller answered within {wait:?} ({error}); \
                         following the standby at {addr} (term {})",
                        spec.term + 1
                    );
                    return self.follow(cluster, addr, spec.term + 1);
                }
                None => return Err(error.into()),
            },
        };
        let pid = std::process::id();
        let world = cluster.world();
        println!("rank {rank} of {world}: joined the controller (pid {pid})");
        if spec.term > 0 {
            println!("rank {rank}: the controller is of term {}", spec.term);
        }
        if spec.standby_rank() == Some(rank) {
            println!("rank {rank}: the standby (it takes over if the controller's process dies)");
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
        // One takeover per job: the first controller's standby, the ranks that followed it.
        let Some(addr) = standby.filter(|_| gone && spec.standby_rank().is_some()) else {
            return Err(error.into());
        };
        let term = spec.term + 1;
        match mirror {
            Some(mirror) => self.take_over(&mirror, cluster, addr, &error),
            None => {
                println!(
                    "rank {rank}: the controller is gone ({error}); following the standby at \
                     {addr} (term {term})"
                );
                self.follow(cluster, addr, term)
            }
        }
    }

    /// Joins the controller of `term` at the standby's address `addr` and runs there.
    fn follow(&self, cluster: &Cluster, addr: SocketAddr, term: u64) -> Result<()> {
        let place = cluster.clone().follow(addr);
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
        let earlier = crate::train::run_path(self.opts, &stamp);
        let mut name = earlier.file_name().unwrap_or_default().to_os_string();
        name.push(format!("-term{}", takeover.term));
        let path = earlier.with_file_name(name);
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create the run directory {}", path.display()))?;
        let bundle = path.join("takeover.fdlck");
        takeover.bundle.save(&bundle)?;
        let point = ResumePoint::locate(&bundle)?;
        let files = standby_files()?;
        let place = cluster.clone().take_over(&files, addr, takeover.survivors.len())?;
        let trainer = self.trainer(Some(&point), place)?.term(takeover.term);
        let spec = trainer.spec().map_err(|e| anyhow!(e))?;
        crate::term_notice::announce(takeover.term);
        println!(
            "[standby] the run goes on in {} (its ledger continues {}'s: fdl audit {} \
             --resumed-from {})",
            path.display(),
            earlier.display(),
            path.display(),
            earlier.display()
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

/// The controller a rank process started after a takeover joins: the term from [`TERM`] and
/// the standby's address (`None` without [`TERM`]: the first controller's).
///
/// # Errors
/// A term that is not a number, or one without a standby's address.
pub(crate) fn joined_term() -> Result<Option<(u64, SocketAddr)>> {
    let Ok(text) = std::env::var(TERM) else { return Ok(None) };
    let term: u64 =
        text.trim().parse().with_context(|| format!("{TERM}={text} is not a term number"))?;
    if term == 0 {
        return Ok(None);
    }
    let addr = standby_addr()?
        .ok_or_else(|| anyhow!("{TERM}={term} needs the standby's address in {STANDBY_ADDR}"))?;
    Ok(Some((term, addr)))
}

/// The standby's address from [`STANDBY_ADDR`] (`None` when unset: the job has none).
///
/// # Errors
/// A value that is not `host:port`.
pub(crate) fn standby_addr() -> Result<Option<SocketAddr>> {
    match std::env::var(STANDBY_ADDR) {
        Ok(text) => {
            use std::net::ToSocketAddrs;
            let addr = text
                .trim()
                .to_socket_addrs()
                .with_context(|| format!("{STANDBY_ADDR}={text} is not host:port"))?
                .next()
                .ok_or_else(|| anyhow!("{STANDBY_ADDR}={text} names no address"))?;
            Ok(Some(addr))
        }
        Err(_) => Ok(None),
    }
}

/// The standby's controller certificate: [`STANDBY_CERT`] and [`STANDBY_KEY`], with the job's
/// CA from `FLODL_TLS_CA`.
fn standby_files() -> Result<flodl_cluster::TlsFiles> {
    let var = |name: &str| {
        std::env::var_os(name).map(PathBuf::from).ok_or_else(|| {
            anyhow!(
                "the standby needs its controller certificate to take over: {STANDBY_CERT}, \
                 {STANDBY_KEY} and {} ({name} is not set; fdl cluster keys makes standby.pem \
                 and standby.key)",
                flodl_cluster::TlsFiles::CA_VAR
            )
        })
    };
    Ok(flodl_cluster::TlsFiles {
        ca: var(flodl_cluster::TlsFiles::CA_VAR)?,
        cert: var(STANDBY_CERT)?,
        key: var(STANDBY_KEY)?,
    })
}

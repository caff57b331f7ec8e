//! Cluster runs: every rank its own process, rank 0's process hosting the controller (the
//! coordinator, with rank 0's worker beside it on the in-process link) and every other
//! process running one rank over the network link. With the collective backend the ranks form
//! an MPI world and the controller runs in a process of its own outside it
//! ([`Seat::Controller`]); every rank, rank 0 included, then joins it over the network link.
//!
//! [`Cluster`] is this process's place in such a run: its seat (a rank, or the controller
//! alone), the world, its local rank and how it meets the others (a [`Rendezvous`]: mutual TLS through flodl-cluster, or
//! in-memory connections for tests). [`crate::Trainer::cluster`] makes a trainer a cluster
//! run's; [`crate::Trainer::start`] then binds the controller and waits for the others, or
//! joins it, and says which it did ([`Started`]).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use flodl_tensor::Device;

#[cfg(feature = "cluster")]
use crate::config_error::Problem;
use crate::config_error::{ConfigError, Field};
use crate::link::failure::RankFailure;
use crate::link::frames::Frames;
use crate::link::rendezvous::Rendezvous;
#[cfg(feature = "cluster")]
use crate::link::tls::{CONTROL_CAP, TlsRendezvous};
use crate::runtime::engine::outlets::panic_message;
use crate::runtime::engine::run_config::RunConfig;
use crate::runtime::handle::DdpHandle;
use crate::runtime::spec::{CollectiveEngine, Placement};
use crate::runtime::takeover::StandbyMirror;
use crate::{Error, Result};

/// How long the controller waits for every rank to join, unless told otherwise.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(300);

/// Which part of a cluster run a process plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seat {
    /// One rank (rank 0's process also hosts the controller, unless the run keeps the
    /// controller apart: see [`Cluster::hosts_controller`]).
    Rank(usize),
    /// The controller alone, outside the ranks' MPI world (the collective backend across
    /// processes).
    Controller,
}

/// This process's place in a cluster run.
#[derive(Clone)]
pub struct Cluster {
    seat: Seat,
    world: usize,
    local_rank: usize,
    join_timeout: Duration,
    /// Ranks (rank 0 included) the controller waits for before the run starts.
    quorum: usize,
    /// The rank whose process hosts the controller: 0, the standby's after a takeover, none
    /// in a process that follows a standby (the controller lives elsewhere).
    controller_rank: Option<usize>,
    rendezvous: Arc<Rendezvous>,
    /// The launcher identity it was read from.
    #[cfg(feature = "cluster")]
    identity: Option<flodl_cluster::Identity>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("seat", &self.seat)
            .field("world", &self.world)
            .field("local_rank", &self.local_rank)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A place from its parts.
    pub(crate) fn with(
        seat: Seat,
        world: usize,
        local_rank: usize,
        rendezvous: Arc<Rendezvous>,
    ) -> Result<Cluster> {
        if let Seat::Rank(rank) = seat
            && rank >= world
        {
            return Err(ConfigError::out_of_range(
                Field::Cluster,
                format!("rank {rank} of a world of {world}"),
                "a rank below the world's size",
            )
            .into());
        }
        if world == 0 {
            return Err(ConfigError::out_of_range(
                Field::Cluster,
                "a world of 0",
                "at least one rank",
            )
            .into());
        }
        Ok(Cluster {
            seat,
            world,
            local_rank,
            join_timeout: DEFAULT_JOIN_TIMEOUT,
            quorum: world,
            controller_rank: Some(0),
            rendezvous,
            #[cfg(feature = "cluster")]
            identity: None,
        })
    }

    /// `world` places joined through in-memory connections, in rank order: a cluster run
    /// within one process, for tests (every process-facing path runs but the transport).
    pub fn in_memory(world: usize) -> Result<Vec<Cluster>> {
        let rendezvous = Arc::new(Rendezvous::in_memory(world));
        (0..world)
            .map(|rank| Cluster::with(Seat::Rank(rank), world, rank, rendezvous.clone()))
            .collect()
    }

    /// This process's seat: a rank, or the controller alone.
    pub fn seat(&self) -> Seat {
        self.seat
    }

    /// This process's rank (`None` for the controller's own process).
    pub fn rank(&self) -> Option<usize> {
        match self.seat {
            Seat::Rank(rank) => Some(rank),
            Seat::Controller => None,
        }
    }

    /// Ranks in the run.
    pub fn world(&self) -> usize {
        self.world
    }

    /// This process's rank among the run's processes on its host (its GPU, when it trains
    /// on one).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Whether this process hosts the controller in a run on `backend` whose ranks train on
    /// `kind` of device: the controller's own process; rank 0's otherwise, unless the ranks
    /// form an MPI world (the collective backend across CPU rank processes), which the
    /// controller stays outside (see [`crate::RunSpec::controller_apart`]): rank 0 then joins
    /// it like every other rank.
    pub fn hosts_controller(&self, backend: crate::Backend, kind: Device) -> bool {
        match self.seat {
            Seat::Controller => true,
            Seat::Rank(rank) => {
                let devices = vec![kind; self.world];
                let engine = CollectiveEngine::choose(backend, self.placement(), &devices);
                self.controller_rank == Some(rank) && engine != Some(CollectiveEngine::Mpi)
            }
        }
    }

    /// Where the run's ranks live: processes of their own, or (in-memory connections) threads
    /// of this process.
    pub fn placement(&self) -> Placement {
        if self.rendezvous.is_in_memory() { Placement::InMemory } else { Placement::Processes }
    }

    /// How long the controller waits for every other rank to join (default 300 s), and a
    /// rank for the controller.
    pub fn join_timeout(mut self, wait: Duration) -> Cluster {
        self.join_timeout = wait;
        self
    }

    pub(crate) fn rendezvous(&self) -> &Rendezvous {
        self.rendezvous.as_ref()
    }

    pub(crate) fn join_wait(&self) -> Duration {
        self.join_timeout
    }

    /// Starts the run once `ranks` ranks (rank 0 included; default: the whole world) have
    /// joined. The ranks still missing are vacant seats: a process for one joins the running
    /// run at a reduce, as a rank process restarted after its death does (host backend). This
    /// is how a job grows: its world is its capacity, and a new process takes a rank id never
    /// used yet.
    pub fn quorum(mut self, ranks: usize) -> Cluster {
        self.quorum = ranks.clamp(1, self.world);
        self
    }

    pub(crate) fn quorum_of(&self) -> usize {
        self.quorum
    }
}

/// What [`crate::Trainer::start`] started in this process.
#[derive(Debug)]
#[must_use = "a started run ends when its handle is joined or dropped"]
pub enum Started {
    /// The whole run: every rank in this process, or this process hosts a cluster run's
    /// controller (and rank 0).
    Coordinator(DdpHandle),
    /// One rank of a cluster run whose controller is in another process.
    Rank(RankHandle),
}

/// One rank of a cluster run, in its own process: [`join`](Self::join) waits for it and says
/// how it ended.
#[derive(Debug)]
pub struct RankHandle {
    rank: usize,
    thread: Option<JoinHandle<std::result::Result<(), RankFailure>>>,
    /// The standby rank's mirror of the controller's state.
    mirror: Option<StandbyMirror>,
}

impl RankHandle {
    /// Starts rank `rank` of `cfg`'s run over `frames`, its connection to the controller.
    pub(crate) fn start(cfg: Arc<RunConfig>, rank: usize, frames: Arc<Frames>) -> Result<Self> {
        let mirror = cfg.mirror.clone().map(StandbyMirror::new);
        let thread = crate::runtime::engine::start_rank(cfg, rank, frames)?;
        Ok(RankHandle { rank, thread: Some(thread), mirror })
    }

    /// What this process mirrors of the controller's state, when its rank is the run's
    /// standby ([`crate::RunSpec::standby_rank`]): after the rank ends because the
    /// controller is gone, [`StandbyMirror::takeover`] says how to go on.
    pub fn standby_mirror(&self) -> Option<StandbyMirror> {
        self.mirror.clone()
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Whether the rank has ended; `join` then returns at once.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the rank to end: `Ok` when it trained to the end of the run and handed in
    /// its final state.
    ///
    /// # Errors
    /// [`Error::Rank`] with the rank's failure: its replica failed, the controller is gone
    /// (it ended, was killed, or was silent past the deadlines) or refused it, a deadline
    /// passed.
    pub fn join(mut self) -> Result<()> {
        let rank = self.rank;
        let outcome = match self.thread.take().map(JoinHandle::join) {
            Some(Ok(outcome)) => outcome,
            Some(Err(p)) => Err(RankFailure::panicked(panic_message(p.as_ref()))),
            None => Err(RankFailure::panicked("joined twice")),
        };
        outcome.map_err(|failure| Error::Rank { rank, failure })
    }
}

impl Drop for RankHandle {
    fn drop(&mut self) {
        // The rank ends on its own (its deadlines bound it); a dropped handle waits for it.
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The device this process's rank trains on, from the trainer's device choice: a CPU, or the
/// GPU numbered by the local rank.
pub(crate) fn own_device(kind: Device, local_rank: usize) -> Device {
    match kind {
        Device::Cpu => Device::Cpu,
        Device::Cuda(_) => Device::Cuda(local_rank),
    }
}

#[cfg(feature = "cluster")]
impl Cluster {
    /// This process's place from its launcher's environment (`FLODL_*`, then torchrun, Slurm,
    /// Open MPI: see [`flodl_cluster::identity`]) and the job's certificate files from
    /// `FLODL_TLS_CA`, `FLODL_TLS_CERT` and `FLODL_TLS_KEY`; `None` when no launcher set a rank
    /// (a plain in-process run).
    ///
    /// # Errors
    /// [`Error::Identity`] for inconsistent launcher variables; [`Error::Invalid`] when the
    /// certificate variables are missing; [`Error::Tls`] when the files do not load.
    pub fn from_env() -> Result<Option<Cluster>> {
        let Some(identity) = flodl_cluster::Identity::from_env()? else { return Ok(None) };
        let files = flodl_cluster::TlsFiles::from_env().ok_or_else(|| {
            Error::from(ConfigError {
                field: Field::Cluster,
                problem: Problem::MissingVariables {
                    vars: &[
                        flodl_cluster::TlsFiles::CA_VAR,
                        flodl_cluster::TlsFiles::CERT_VAR,
                        flodl_cluster::TlsFiles::KEY_VAR,
                    ],
                    made_by: "fdl cluster keys",
                },
            })
        })?;
        let files = files.for_rank(identity.rank);
        Cluster::new(identity, &files).map(Some)
    }

    /// This process's place as `identity` says, authenticated by the certificate files
    /// `files` (mutual TLS: every process presents a certificate of the job's CA). The
    /// controller binds loopback on the identity's port unless [`bind`](Self::bind) says
    /// otherwise.
    ///
    /// # Errors
    /// [`Error::Tls`] when the files do not load; [`Error::Invalid`] for an impossible rank.
    pub fn new(
        identity: flodl_cluster::Identity,
        files: &flodl_cluster::TlsFiles,
    ) -> Result<Cluster> {
        let tls = flodl_cluster::Tls::load(files)?;
        let bind = std::net::SocketAddr::from(([127, 0, 0, 1], identity.controller.port));
        let rendezvous = TlsRendezvous {
            tls,
            controller: identity.controller.clone(),
            bind,
            inherited: inherited()?,
            bulk_cap: DEFAULT_BULK_CAP,
            serving: flodl_cluster::Role::Controller,
        };
        let mut cluster = Cluster::with(
            Seat::Rank(identity.rank),
            identity.world,
            identity.local_rank,
            Arc::new(Rendezvous::tls(rendezvous)),
        )?;
        cluster.identity = Some(identity);
        Ok(cluster)
    }

    /// The controller's own process of a run of `world` ranks that keeps it apart (the
    /// collective backend across processes: the ranks form an MPI world, started by `mpirun`,
    /// and each joins this process over mutual TLS), listening on `bind`, authenticated by
    /// `files`.
    ///
    /// # Errors
    /// [`Error::Tls`] when the files do not load; [`Error::Invalid`] for a world of none.
    pub fn controller(
        world: usize,
        files: &flodl_cluster::TlsFiles,
        bind: std::net::SocketAddr,
    ) -> Result<Cluster> {
        let tls = flodl_cluster::Tls::load(files)?;
        let controller =
            flodl_cluster::ControllerAddr { host: bind.ip().to_string(), port: bind.port() };
        let rendezvous = TlsRendezvous {
            tls,
            controller,
            bind,
            inherited: inherited()?,
            bulk_cap: DEFAULT_BULK_CAP,
            serving: flodl_cluster::Role::Controller,
        };
        Cluster::with(Seat::Controller, world, 0, Arc::new(Rendezvous::tls(rendezvous)))
    }

    /// Rebuilds the TLS rendezvous with `f` applied (a place made otherwise is unchanged).
    fn retls(mut self, f: impl FnOnce(&mut TlsRendezvous)) -> Cluster {
        if let Some(r) = self.rendezvous.as_tls() {
            let mut r = TlsRendezvous {
                tls: r.tls.clone(),
                controller: r.controller.clone(),
                bind: r.bind,
                inherited: r.inherited.clone(),
                bulk_cap: r.bulk_cap,
                serving: r.serving,
            };
            f(&mut r);
            self.rendezvous = Arc::new(Rendezvous::tls(r));
        }
        self
    }

    /// This place as the standby's after a takeover: its process hosts the controller (beside
    /// its own rank), presenting the standby's controller certificate `files` (a server
    /// certificate of the job's CA of its own: the dead controller's key never left its
    /// process) and listening at `addr`, the address every rank was told at launch (or on the
    /// listener the launcher handed down, `FLODL_CONTROLLER_FD`), for `quorum` ranks, its own
    /// included.
    ///
    /// # Errors
    /// [`Error::Tls`] when the files do not load; [`Error::Invalid`] for a place with no rank
    /// or one not made over TLS.
    pub fn take_over(
        self,
        files: &flodl_cluster::TlsFiles,
        addr: std::net::SocketAddr,
        quorum: usize,
    ) -> Result<Cluster> {
        let Seat::Rank(rank) = self.seat else {
            return Err(ConfigError::unsupported(Field::Cluster, "a standby is a rank").into());
        };
        if self.rendezvous.as_tls().is_none() {
            return Err(ConfigError::unsupported(
                Field::Cluster,
                "a standby takes over over TLS only",
            )
            .into());
        }
        let tls = flodl_cluster::Tls::load(files)?;
        let controller =
            flodl_cluster::ControllerAddr { host: addr.ip().to_string(), port: addr.port() };
        let mut cluster = self.retls(|r| {
            r.tls = tls;
            r.controller = controller;
            r.bind = addr;
            r.serving = flodl_cluster::Role::Standby(rank);
        });
        cluster.controller_rank = Some(rank);
        Ok(cluster.quorum(quorum))
    }

    /// This place as a rank following a standby that took over: it joins the controller that
    /// rank `host`'s process started at `addr` (the address that process takes over at, told
    /// at launch), verifying that standby's certificate, from now on.
    pub fn follow(self, addr: std::net::SocketAddr, host: usize) -> Cluster {
        let controller =
            flodl_cluster::ControllerAddr { host: addr.ip().to_string(), port: addr.port() };
        let mut cluster = self.retls(|r| {
            r.controller = controller;
            r.serving = flodl_cluster::Role::Standby(host);
        });
        // Whatever its rank (rank 0's process restarted after a takeover too), a follower
        // hosts no controller.
        cluster.controller_rank = None;
        cluster
    }

    /// Where rank 0's process listens for the other ranks (default: loopback on the
    /// controller port). Give a routable address for a job across hosts.
    pub fn bind(self, addr: std::net::SocketAddr) -> Cluster {
        self.retls(|r| {
            r.bind = addr;
            r.inherited = Arc::default();
        })
    }

    /// The largest model-state frame accepted (default 1 GiB; about four times the model's
    /// bytes is enough: a snapshot with a checkpoint part carries the parameters and the
    /// optimizer state).
    pub fn bulk_cap(self, bytes: usize) -> Cluster {
        self.retls(|r| r.bulk_cap = bytes.max(CONTROL_CAP))
    }

    /// The launcher identity this place was read from, when it came from one.
    pub fn identity(&self) -> Option<&flodl_cluster::Identity> {
        self.identity.as_ref()
    }
}

/// The controller's listening socket when the launcher handed one down
/// ([`flodl_cluster::identity::CONTROLLER_FD`]), shared by the place's copies and taken once.
#[cfg(feature = "cluster")]
fn inherited() -> Result<Arc<std::sync::Mutex<Option<std::net::TcpListener>>>> {
    Ok(Arc::new(std::sync::Mutex::new(flodl_cluster::identity::inherited_listener()?)))
}

/// The default cap of a model-state frame.
#[cfg(feature = "cluster")]
pub const DEFAULT_BULK_CAP: usize = 1 << 30;

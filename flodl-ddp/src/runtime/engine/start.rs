//! Where the engine starts: the face's one way in. [`start`] starts a whole run (the lone rank
//! of a world of one, or the coordinator with the ranks of this process) and [`start_rank`] one
//! rank of a cluster run whose controller is in another process.

use std::sync::Arc;
use std::thread::JoinHandle;

use crate::link::RankLink;
use crate::link::failure::RankFailure;
use crate::link::frames::{Admitted, Frames};
use crate::link::wire::Window;
use crate::runtime::engine::comm::CommPlan;
use crate::runtime::engine::coordinator::{self, Spawned};
use crate::runtime::engine::outlets::Outlets;
use crate::runtime::engine::rank::rank_loop::run_rank;
use crate::runtime::engine::run_config::RunConfig;
use crate::runtime::engine::solo;
use crate::runtime::spec::{CollectiveEngine, Placement};
use crate::{Error, Result};

/// Starts `config`'s run in this process, writing into `outlets`: a lone rank on its own
/// thread when the world is one rank in this process with nothing to checkpoint or resume
/// (no coordinator), the coordinator and this process's ranks otherwise. `remote` holds the
/// connections of the ranks in other processes (a cluster run's controller), by rank.
pub(crate) fn start(config: Arc<RunConfig>, outlets: Outlets, remote: Admitted) -> Result<Spawned> {
    // A lone rank checkpoints through the coordinator (a world of one).
    // A cluster run always has its controller (its first group forms through it).
    let solo = config.world() == 1
        && config.spec.placement == Placement::Threads
        && config.checkpoints.is_none()
        && config.resume.is_none()
        && remote.0.is_empty();
    if solo {
        Ok((solo::spawn(config, outlets)?, Vec::new()))
    } else {
        coordinator::spawn(config, outlets, remote)
    }
}

/// Starts rank `rank` of `cfg`'s run on a thread of its own, over `frames`, its connection to
/// the controller; the thread returns the rank's failure, if any.
pub(crate) fn start_rank(
    cfg: Arc<RunConfig>,
    rank: usize,
    frames: Arc<Frames>,
) -> Result<JoinHandle<std::result::Result<(), RankFailure>>> {
    let link = RankLink::over(frames, cfg.spec.wire_cut())?;
    // Only rank 0 trains before `Init`, which names a later rank's first window.
    let first = Window { round: 1, target: 1, limit: 1, wall: None };
    std::thread::Builder::new()
        .name(format!("flodl-rank-{rank}"))
        .spawn(move || {
            let comm = comm_across(&cfg);
            let outcome = run_rank(rank, cfg, comm, &link, first);
            // The link closes last, after the rank's last word.
            drop(link);
            outcome
        })
        .map_err(|source| Error::Spawn { what: "a rank's thread", source })
}

/// How a rank in its own process joins the collective backend: the MPI world it was started
/// in (the spec refuses the collective backend across CPU processes without the `mpi`
/// feature); NCCL and in-memory ranks join each group when the controller relays its id.
fn comm_across(cfg: &RunConfig) -> Option<CommPlan> {
    if cfg.spec.collective_engine() != Some(CollectiveEngine::Mpi) {
        return None;
    }
    #[cfg(feature = "mpi")]
    {
        Some(CommPlan::Mpi { world: cfg.world() })
    }
    #[cfg(not(feature = "mpi"))]
    {
        None
    }
}

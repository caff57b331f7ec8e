//! The launchers a cluster process may have been started by, and the variables each one sets.

use std::fmt;

/// A program that starts the processes of a job and tells each its rank through the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// `fdl launch`.
    Fdl,
    /// `torchrun --no-python`.
    Torchrun,
    /// Slurm's `srun`.
    Slurm,
    /// Open MPI's `mpirun`.
    OpenMpi,
}

/// Where one launcher puts the controller's host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostSource {
    /// A plain variable holding a host (or host:port).
    Variable(&'static str),
    /// Slurm's compressed node lists, step list first: the controller is on the first node.
    SlurmNodeList,
}

/// The environment variables of one launcher.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Variables {
    pub(crate) rank: &'static str,
    pub(crate) world: &'static str,
    pub(crate) local_rank: &'static str,
    pub(crate) host: HostSource,
}

/// The variable that names the controller's host under every launcher, when set.
pub const CONTROLLER_ADDR: &str = "FLODL_CONTROLLER_ADDR";
/// The variable that gives the controller's port.
pub const CONTROLLER_PORT: &str = "FLODL_CONTROLLER_PORT";
/// Slurm's node list of the current step, then of the job.
pub(crate) const SLURM_NODE_LISTS: [&str; 2] = ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"];

impl Launcher {
    /// Every launcher, in the order identity is looked up.
    pub const ORDER: [Launcher; 4] =
        [Launcher::Fdl, Launcher::Torchrun, Launcher::Slurm, Launcher::OpenMpi];

    /// The variables this launcher sets.
    pub(crate) fn variables(self) -> Variables {
        match self {
            Launcher::Fdl => Variables {
                rank: "FLODL_RANK",
                world: "FLODL_WORLD_SIZE",
                local_rank: "FLODL_LOCAL_RANK",
                host: HostSource::Variable(CONTROLLER_ADDR),
            },
            Launcher::Torchrun => Variables {
                rank: "RANK",
                world: "WORLD_SIZE",
                local_rank: "LOCAL_RANK",
                host: HostSource::Variable("MASTER_ADDR"),
            },
            Launcher::Slurm => Variables {
                rank: "SLURM_PROCID",
                world: "SLURM_NTASKS",
                local_rank: "SLURM_LOCALID",
                host: HostSource::SlurmNodeList,
            },
            Launcher::OpenMpi => Variables {
                rank: "OMPI_COMM_WORLD_RANK",
                world: "OMPI_COMM_WORLD_SIZE",
                local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
                host: HostSource::Variable("MASTER_ADDR"),
            },
        }
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Fdl => "fdl launch",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "Slurm",
            Launcher::OpenMpi => "Open MPI",
        })
    }
}

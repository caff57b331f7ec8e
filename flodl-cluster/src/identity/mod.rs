//! Who this process is in a cluster job: its rank, the world size and where the controller listens,
//! read from the environment a launcher left behind.
//!
//! The launchers are tried in a fixed order, and the first whose rank variable is set decides:
//!
//! | order | launcher | rank | world | local rank | controller host |
//! |---|---|---|---|---|---|
//! | 1 | `fdl launch` | `FLODL_RANK` | `FLODL_WORLD_SIZE` | `FLODL_LOCAL_RANK` | `FLODL_CONTROLLER_ADDR` |
//! | 2 | `torchrun --no-python` | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `MASTER_ADDR` |
//! | 3 | Slurm `srun` | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` | first host of `SLURM_STEP_NODELIST`, else `SLURM_JOB_NODELIST` |
//! | 4 | Open MPI `mpirun` | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `MASTER_ADDR` |
//!
//! `FLODL_CONTROLLER_ADDR`, when set, names the controller's host under every launcher (it may
//! carry a `:port`). The port is `FLODL_CONTROLLER_PORT`, else [`DEFAULT_CONTROLLER_PORT`];
//! never `MASTER_PORT`, which torchrun's own store may already hold.

mod address;
mod environment;
mod error;
mod hostlist;
mod inherited;
mod launcher;

pub use address::{ControllerAddr, DEFAULT_CONTROLLER_PORT};
pub use environment::Identity;
pub use error::IdentityError;
pub use hostlist::first_host;
pub use inherited::{CONTROLLER_FD, inherited_listener};
pub use launcher::{CONTROLLER_ADDR, CONTROLLER_PORT, Launcher};

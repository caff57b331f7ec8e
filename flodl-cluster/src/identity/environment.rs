//! A process's place in a cluster job, read from its launcher's environment.

use super::address::{self, ControllerAddr, DEFAULT_CONTROLLER_PORT};
use super::error::IdentityError;
use super::hostlist::first_host;
use super::launcher::{CONTROLLER_ADDR, CONTROLLER_PORT, HostSource, Launcher, SLURM_NODE_LISTS};

/// This process's rank, the job's size and where the controller listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// The number of rank processes in the job.
    pub world: usize,
    /// This process's index among the job's processes on its host.
    pub local_rank: usize,
    /// Where the controller listens (rank 0's process hosts it).
    pub controller: ControllerAddr,
    /// The launcher whose variables gave this identity.
    pub launcher: Launcher,
}

impl Identity {
    /// Reads the identity from this process's environment; `None` when no launcher's rank
    /// variable is set (the process was not launched as part of a cluster).
    pub fn from_env() -> Result<Option<Identity>, IdentityError> {
        Identity::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the identity through `get`, which returns a variable's value; the order and rules are
    /// those of the [module](crate::identity) documentation.
    pub fn from_vars(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Identity>, IdentityError> {
        let get = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let Some(launcher) =
            Launcher::ORDER.into_iter().find(|l| get(l.variables().rank).is_some())
        else {
            return Ok(None);
        };
        let vars = launcher.variables();
        let required = |name: &'static str| {
            get(name).ok_or(IdentityError::Missing { launcher, present: vars.rank, missing: name })
        };
        let number = |name: &'static str| -> Result<usize, IdentityError> {
            let value = required(name)?;
            value
                .trim()
                .parse::<usize>()
                .map_err(|_| IdentityError::NotANumber { var: name, value })
        };
        let rank = number(vars.rank)?;
        let world = number(vars.world)?;
        if world == 0 {
            return Err(IdentityError::EmptyWorld { var: vars.world });
        }
        let local_rank = number(vars.local_rank)?;
        for (var, value) in [(vars.rank, rank), (vars.local_rank, local_rank)] {
            if value >= world {
                return Err(IdentityError::OutOfRange { var, value, world_var: vars.world, world });
            }
        }
        let controller = controller(&get, launcher, vars.rank, vars.host)?;
        Ok(Some(Identity { rank, world, local_rank, controller, launcher }))
    }
}

/// The controller's address: `FLODL_CONTROLLER_ADDR` first, then the launcher's own source; the
/// port from `FLODL_CONTROLLER_PORT`, the address's own `:port`, or the default.
fn controller(
    get: &impl Fn(&str) -> Option<String>,
    launcher: Launcher,
    present: &'static str,
    source: HostSource,
) -> Result<ControllerAddr, IdentityError> {
    let (host, in_addr) = match get(CONTROLLER_ADDR) {
        Some(value) => split(CONTROLLER_ADDR, value)?,
        None => match source {
            HostSource::Variable(var) => match get(var) {
                // Only FLODL_CONTROLLER_ADDR may carry the controller's port: a port on another
                // launcher's variable belongs to that launcher.
                Some(value) => (split(var, value)?.0, None),
                None => {
                    let missing = if launcher == Launcher::OpenMpi {
                        "FLODL_CONTROLLER_ADDR or MASTER_ADDR"
                    } else {
                        var
                    };
                    return Err(IdentityError::Missing { launcher, present, missing });
                }
            },
            HostSource::SlurmNodeList => {
                let Some((var, value)) =
                    SLURM_NODE_LISTS.iter().find_map(|v| get(v).map(|value| (*v, value)))
                else {
                    return Err(IdentityError::Missing {
                        launcher,
                        present,
                        missing: "SLURM_STEP_NODELIST or SLURM_JOB_NODELIST",
                    });
                };
                let host = first_host(&value).map_err(|reason| IdentityError::HostList {
                    var,
                    value,
                    reason,
                })?;
                (host, None)
            }
        },
    };
    let in_port = match get(CONTROLLER_PORT) {
        Some(value) => {
            Some(address::port(&value).ok_or(IdentityError::Port { var: CONTROLLER_PORT, value })?)
        }
        None => None,
    };
    let port = match (in_addr, in_port) {
        (Some(a), Some(p)) if a != p => {
            return Err(IdentityError::PortConflict { in_addr: a, in_port: p });
        }
        (a, p) => p.or(a).unwrap_or(DEFAULT_CONTROLLER_PORT),
    };
    Ok(ControllerAddr { host, port })
}

/// `host` or `host:port` from one variable.
fn split(var: &'static str, value: String) -> Result<(String, Option<u16>), IdentityError> {
    ControllerAddr::parse(&value).ok_or(IdentityError::Address { var, value })
}

//! What can be wrong with a launcher's environment.

use thiserror::Error;

use super::Launcher;

/// A launcher's variables that are missing, malformed or inconsistent; each names the variable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdentityError {
    /// The launcher's rank variable is set but another variable it needs is not.
    #[error("{launcher}: {present} is set but {missing} is not")]
    Missing { launcher: Launcher, present: &'static str, missing: &'static str },
    /// A variable that must hold a number does not.
    #[error("{var}={value:?} is not a non-negative whole number")]
    NotANumber { var: &'static str, value: String },
    /// The world size is zero.
    #[error("{var}=0: a job needs at least one rank")]
    EmptyWorld { var: &'static str },
    /// A rank (or local rank) at or beyond the world size.
    #[error("{var}={value} is out of range: {world_var}={world}")]
    OutOfRange { var: &'static str, value: usize, world_var: &'static str, world: usize },
    /// A Slurm node list that cannot be read.
    #[error("{var}={value:?} is not a Slurm host list: {reason}")]
    HostList { var: &'static str, value: String, reason: &'static str },
    /// A controller address that is not `host` or `host:port`.
    #[error("{var}={value:?} is not a host or host:port")]
    Address { var: &'static str, value: String },
    /// The listening socket a launcher says it handed down is not one.
    #[error("{var}={value:?}: {reason}")]
    ListenerFd { var: &'static str, value: String, reason: String },
    /// A port that is not a number from 1 to 65535.
    #[error("{var}={value:?} is not a port from 1 to 65535")]
    Port { var: &'static str, value: String },
    /// `FLODL_CONTROLLER_ADDR` carries a port that `FLODL_CONTROLLER_PORT` contradicts.
    #[error("FLODL_CONTROLLER_ADDR names port {in_addr} but FLODL_CONTROLLER_PORT={in_port}")]
    PortConflict { in_addr: u16, in_port: u16 },
}

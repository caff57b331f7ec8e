//! The ways starting the dashboard can fail.

use std::io;
use std::net::SocketAddr;

/// Why the dashboard could not start (or its address could not be read).
#[derive(Debug, thiserror::Error)]
pub(crate) enum DashboardError {
    /// `--dashboard` was given something that is not an address.
    #[error("dashboard address '{text}': {why}")]
    BadAddress {
        /// What was given.
        text: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The address cannot be bound (in use, not local, not permitted).
    #[error("cannot serve the dashboard on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The system's reason.
        #[source]
        source: io::Error,
    },
    /// A token given with `--dashboard-token` that cannot travel in a URL as it is.
    #[error("dashboard token: {0}")]
    BadToken(&'static str),
    /// The server's runtime or thread could not be started.
    #[error("cannot start the dashboard server: {0}")]
    Start(#[source] io::Error),
}

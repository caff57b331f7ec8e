//! What can go wrong on the network side of a job.

use std::time::Duration;

use thiserror::Error;

use crate::keys::TlsError;
use crate::session::Lane;

/// A failure of a session, a join or the controller.
#[derive(Debug, Error)]
pub enum NetError {
    /// The session has ended (closed, reset, silent or misbehaving peer); every frame received
    /// before the end was delivered first.
    #[error("the session has ended")]
    Gone,
    /// Nothing happened within the wait.
    #[error("nothing within {0:?}")]
    Timeout(Duration),
    /// The lane's send queue is full (only from `try_send`).
    #[error("the send queue is full")]
    Full,
    /// A frame above the lane's cap.
    #[error("a frame of {len} bytes is above the {lane} lane's cap of {cap} bytes")]
    TooLarge { lane: Lane, len: usize, cap: usize },
    /// The controller refused to let this process join; the line says why.
    #[error("refused by the controller: {reason}")]
    Refused { reason: String },
    /// The controller refused this process because another live process holds its rank (a
    /// rank's seat is free again once that process's session has ended); the line says so.
    #[error("refused by the controller: {reason}")]
    RankTaken { rank: usize, reason: String },
    /// The connection to the controller failed at the socket level.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The job's TLS material cannot be used.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// This process's certificate is for another part of the job than the one it tried to play
    /// (a rank's key serving as the controller, the controller's joining as a rank, or rank 2's
    /// joining as rank 1).
    #[error(
        "this process holds {holds}'s certificate, not {wants}'s: hand each process its own key"
    )]
    WrongKey { holds: crate::keys::Role, wants: crate::keys::Role },
    /// The TLS handshake or the hello exchange failed (a certificate from elsewhere, a peer that
    /// speaks something else).
    #[error("handshake with the controller failed: {0}")]
    Handshake(String),
    /// The controller's address does not resolve.
    #[error("cannot resolve the controller's address {addr}: {reason}")]
    Resolve { addr: String, reason: String },
    /// A configuration that cannot work (e.g. a silence not longer than the heartbeat).
    #[error("invalid session configuration: {0}")]
    Config(String),
    /// No tokio runtime could be started or found.
    #[error("no async runtime: {0}")]
    Runtime(String),
}

//! Why the controller dropped a connection during its handshake without a refusal line.

use thiserror::Error;

/// A connection dropped before the controller could read a hello from it: nothing is written
/// back (there is no authenticated peer to write to, or no frame to answer).
#[derive(Debug, Error)]
pub(crate) enum Dropped {
    /// TLS did not come up: not TLS at all, no client certificate, or one the job's CA did not
    /// sign.
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
    /// The peer closed the connection before its first frame.
    #[error("closed before its hello")]
    Closed,
    /// The first frame could not be read (a length above the handshake cap, a reset).
    #[error("reading its hello: {0}")]
    Read(std::io::Error),
}

//! Why a link operation did not go through.

use std::time::Duration;

/// Why a link operation did not go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LinkError {
    /// The other end is gone: its thread or process ended, or its connection closed.
    #[error("the peer is gone")]
    Gone,
    /// Nothing arrived, or there was no room, within the deadline.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// No room right now (from `try_send`).
    #[error("the queue is full")]
    Full,
}

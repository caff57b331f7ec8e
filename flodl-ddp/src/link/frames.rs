//! A connection as the network link sees it: opaque frames on two lanes ([`Frames`]), the
//! connections a rendezvous admitted, and those of ranks that join a running job.

use std::sync::Arc;
use std::time::Duration;

use super::frame::Lane;
use super::link_error::LinkError;

/// A connection carrying opaque frames, in send order, on two lanes: what the network link
/// needs of a session. Both ends may be used from two threads at once.
pub(crate) trait Frames: Send + Sync + 'static {
    /// Sends `frame` on `lane`, waiting at most `wait` for room.
    ///
    /// # Errors
    /// [`LinkError::Gone`] when the connection is closed, [`LinkError::Timeout`] when there was
    /// no room in time.
    fn send(
        &self,
        lane: Lane,
        frame: Vec<u8>,
        wait: Duration,
    ) -> std::result::Result<(), LinkError>;

    /// Sends `frame` on `lane` only if there is room now.
    ///
    /// # Errors
    /// [`LinkError::Gone`] or [`LinkError::Full`].
    fn try_send(&self, lane: Lane, frame: Vec<u8>) -> std::result::Result<(), LinkError>;

    /// The next frame, waiting at most `wait`.
    ///
    /// # Errors
    /// [`LinkError::Timeout`] when none came, [`LinkError::Gone`] when the connection ended.
    fn recv(&self, wait: Duration) -> std::result::Result<Vec<u8>, LinkError>;

    /// Ends the connection (the peer sees it gone).
    fn close(&self);
}

/// The connections of a cluster run: by rank, each to the controller.
pub(crate) type Connections = Vec<(usize, Arc<dyn Frames>)>;

/// What the controller's rendezvous admitted: every other rank's connection, and where the
/// connections of ranks joining again during the run come from.
pub(crate) type Admitted = (Connections, Option<Box<dyn Arrivals>>);

/// Connections of ranks that join a running job (a rank process restarted after its death),
/// as they are admitted: authenticated and checked like the first ones.
pub(crate) trait Arrivals: Send + 'static {
    /// The next admitted rank and its connection, waiting at most `wait`.
    fn next(&self, wait: Duration) -> Option<(usize, Arc<dyn Frames>)>;
}

/// A rank's connection as handed to the coordinator when the rank joins again.
#[derive(Clone)]
pub(crate) struct Attached(pub(crate) Arc<dyn Frames>);

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Attached(..)")
    }
}

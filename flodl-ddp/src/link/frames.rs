//! A connection as the network link sees it: opaque frames on two lanes ([`Frames`]), the
//! connections a rendezvous admitted, and those of ranks that join a running job. Each is one
//! of a closed set of flavors: in-memory ([`super::memory`]) or mutual TLS ([`super::tls`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::frame::Lane;
use super::link_error::LinkError;
use super::memory::{self, MemFrames};
#[cfg(feature = "cluster")]
use super::tls::{self, SessionFrames};

/// A connection carrying opaque frames, in send order, on two lanes: what the network link
/// needs of a session. Both ends may be used from two threads at once.
pub(crate) struct Frames {
    flavor: FramesFlavor,
}

/// The flavors of a connection.
enum FramesFlavor {
    /// Frame queues within one process.
    Memory(MemFrames),
    /// A mutual TLS session.
    #[cfg(feature = "cluster")]
    Session(SessionFrames),
}

impl From<MemFrames> for Frames {
    fn from(frames: MemFrames) -> Frames {
        Frames { flavor: FramesFlavor::Memory(frames) }
    }
}

#[cfg(feature = "cluster")]
impl From<SessionFrames> for Frames {
    fn from(frames: SessionFrames) -> Frames {
        Frames { flavor: FramesFlavor::Session(frames) }
    }
}

impl std::fmt::Debug for Frames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.flavor {
            FramesFlavor::Memory(_) => f.write_str("Frames(memory)"),
            #[cfg(feature = "cluster")]
            FramesFlavor::Session(_) => f.write_str("Frames(session)"),
        }
    }
}

impl Frames {
    /// Sends `frame` on `lane`, waiting at most `wait` for room.
    ///
    /// # Errors
    /// [`LinkError::Gone`] when the connection is closed, [`LinkError::Timeout`] when there was
    /// no room in time.
    pub(crate) fn send(&self, lane: Lane, frame: Vec<u8>, wait: Duration) -> Result<(), LinkError> {
        match &self.flavor {
            FramesFlavor::Memory(m) => m.send(lane, frame, wait),
            #[cfg(feature = "cluster")]
            FramesFlavor::Session(s) => s.send(lane, frame, wait),
        }
    }

    /// Sends `frame` on `lane` only if there is room now.
    ///
    /// # Errors
    /// [`LinkError::Gone`] or [`LinkError::Full`].
    pub(crate) fn try_send(&self, lane: Lane, frame: Vec<u8>) -> Result<(), LinkError> {
        match &self.flavor {
            FramesFlavor::Memory(m) => m.try_send(lane, frame),
            #[cfg(feature = "cluster")]
            FramesFlavor::Session(s) => s.try_send(lane, frame),
        }
    }

    /// The next frame, waiting at most `wait`. A connection's frame is its reader's own buffer:
    /// drop it before the next large frame arrives and the reader receives that one into the
    /// same pages.
    ///
    /// # Errors
    /// [`LinkError::Timeout`] when none came, [`LinkError::Gone`] when the connection ended.
    pub(crate) fn recv(&self, wait: Duration) -> Result<Bytes, LinkError> {
        match &self.flavor {
            FramesFlavor::Memory(m) => m.recv(wait).map(Bytes::from),
            #[cfg(feature = "cluster")]
            FramesFlavor::Session(s) => s.recv(wait),
        }
    }

    /// When bytes of a frame not yet whole last came from the peer (`None`: never, or a
    /// connection within this process, where frames arrive whole): its sign of life while a
    /// large frame crosses a slow link.
    pub(crate) fn arriving(&self) -> Option<Instant> {
        match &self.flavor {
            FramesFlavor::Memory(_) => None,
            #[cfg(feature = "cluster")]
            FramesFlavor::Session(s) => s.arriving(),
        }
    }

    /// Ends the connection (the peer sees it gone).
    pub(crate) fn close(&self) {
        match &self.flavor {
            FramesFlavor::Memory(m) => m.close(),
            #[cfg(feature = "cluster")]
            FramesFlavor::Session(s) => s.close(),
        }
    }
}

/// Two connected in-memory ends.
#[cfg(test)]
pub(crate) fn pair() -> (Arc<Frames>, Arc<Frames>) {
    let (a, b) = memory::pair();
    (Arc::new(a.into()), Arc::new(b.into()))
}

/// The connections of a cluster run: by rank, each to the controller.
pub(crate) type Connections = Vec<(usize, Arc<Frames>)>;

/// What the controller's rendezvous admitted: every other rank's connection, and where the
/// connections of ranks joining again during the run come from.
pub(crate) type Admitted = (Connections, Option<Arrivals>);

/// Connections of ranks that join a running job (a rank process restarted after its death),
/// as they are admitted: authenticated and checked like the first ones.
pub(crate) struct Arrivals {
    flavor: ArrivalsFlavor,
}

/// The flavors of arrivals.
enum ArrivalsFlavor {
    /// Ends posted to an in-memory meeting place.
    Memory(memory::Later),
    /// The TLS controller, still admitting.
    #[cfg(feature = "cluster")]
    Tls(tls::Later),
}

impl From<memory::Later> for Arrivals {
    fn from(later: memory::Later) -> Arrivals {
        Arrivals { flavor: ArrivalsFlavor::Memory(later) }
    }
}

#[cfg(feature = "cluster")]
impl From<tls::Later> for Arrivals {
    fn from(later: tls::Later) -> Arrivals {
        Arrivals { flavor: ArrivalsFlavor::Tls(later) }
    }
}

impl Arrivals {
    /// The next admitted rank and its connection, waiting at most `wait`.
    pub(crate) fn next(&self, wait: Duration) -> Option<(usize, Arc<Frames>)> {
        match &self.flavor {
            ArrivalsFlavor::Memory(m) => m.next(wait).map(|(r, f)| (r, Arc::new(f.into()))),
            #[cfg(feature = "cluster")]
            ArrivalsFlavor::Tls(t) => t.next(wait).map(|(r, f)| (r, Arc::new(f.into()))),
        }
    }
}

/// The connections `now` and the `later` ones, as one flavor's rendezvous admitted them.
pub(crate) fn admitted<F: Into<Frames>, L: Into<Arrivals>>(
    (now, later): (Vec<(usize, F)>, L),
) -> Admitted {
    let now = now.into_iter().map(|(rank, f)| (rank, Arc::new(f.into()))).collect();
    (now, Some(later.into()))
}

/// A rank's connection as handed to the coordinator when the rank joins again.
#[derive(Clone)]
pub(crate) struct Attached(pub(crate) Arc<Frames>);

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Attached(..)")
    }
}

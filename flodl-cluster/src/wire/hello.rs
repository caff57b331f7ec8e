//! What a joining process says first on each lane.

use crate::session::Lane;

/// The protocol version this build speaks; a joiner with another is refused.
///
/// 2: the hello carries the application's protocol ([`LaneHello::app`]).
pub const PROTOCOL: u32 = 2;

/// A joining rank's credentials beyond its certificate: what it speaks, which run it belongs to
/// and its place in the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hello {
    /// The protocol version ([`PROTOCOL`] for this build).
    pub protocol: u32,
    /// The hash of the run specification; every rank of a job must agree with the controller.
    pub run: [u8; 32],
    /// The joiner's rank.
    pub rank: usize,
    /// The world size the joiner was launched with.
    pub world: usize,
}

impl Hello {
    /// A hello of this build's protocol.
    pub fn new(run: [u8; 32], rank: usize, world: usize) -> Hello {
        Hello { protocol: PROTOCOL, run, rank, world }
    }
}

/// A hello as sent on one lane: which lane it opens and the token that pairs a joiner's two lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaneHello {
    /// The joiner's hello.
    pub hello: Hello,
    /// The version of the messages the application sends over the session
    /// ([`crate::SessionConfig::app`] of the joiner); flodl-cluster compares it with the
    /// controller's and never reads the messages.
    pub app: u32,
    /// The lane this connection is.
    pub lane: Lane,
    /// A random number, the same on both lanes of one join, different between joins.
    pub token: u64,
}

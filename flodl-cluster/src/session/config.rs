//! The limits and timings of a session.

use std::time::Duration;

use crate::error::NetError;
use crate::keys::{Role, Tls};
use crate::session::Lane;
use crate::wire::DATA_HEADER;

/// The largest frame each lane carries, in bytes; a larger frame is refused on send, and a peer
/// that sends one anyway ends the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// The cap of the control lane (small messages).
    pub control: usize,
    /// The cap of the bulk lane (e.g. twice a model's bytes).
    pub bulk: usize,
}

impl Caps {
    /// The cap of one lane.
    pub fn of(&self, lane: Lane) -> usize {
        match lane {
            Lane::Control => self.control,
            Lane::Bulk => self.bulk,
        }
    }
}

/// How a session tells a live peer from a dead one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// A lane that has sent nothing for this long sends a heartbeat.
    pub heartbeat: Duration,
    /// A lane that has received nothing for this long (no bytes; on the control lane, no whole
    /// message) ends the session. Must be longer than `heartbeat`; a few heartbeats is usual.
    pub silence: Duration,
}

/// Everything a controller or a joiner needs to run sessions.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The job's mutual-TLS configurations.
    pub tls: Tls,
    /// The frame caps per lane.
    pub caps: Caps,
    /// The heartbeat period of a quiet lane.
    pub heartbeat: Duration,
    /// How long a lane may stay silent before the session ends.
    pub silence: Duration,
    /// The deadline for TCP connect, TLS handshake and hello of one connection.
    pub handshake: Duration,
    /// The controller a rank joins, whose name it verifies on the controller's certificate:
    /// [`Role::Controller`] (the first one, the default), or [`Role::Standby`] of the rank whose
    /// process took over.
    pub serving: Role,
    /// The version of the messages the application exchanges over its sessions (0 unless it
    /// sets one): a joiner sends its own in the hello and a controller refuses another, so two
    /// builds whose messages differ are turned away at the door instead of misreading frames.
    pub app: u32,
}

impl SessionConfig {
    /// The default heartbeat period.
    pub const HEARTBEAT: Duration = Duration::from_secs(1);
    /// The default silence that ends a session.
    pub const SILENCE: Duration = Duration::from_secs(5);
    /// The default handshake deadline.
    pub const HANDSHAKE: Duration = Duration::from_secs(10);

    /// A configuration with the default timings.
    pub fn new(tls: Tls, caps: Caps) -> SessionConfig {
        SessionConfig {
            tls,
            caps,
            heartbeat: Self::HEARTBEAT,
            silence: Self::SILENCE,
            handshake: Self::HANDSHAKE,
            serving: Role::Controller,
            app: 0,
        }
    }

    /// The liveness part.
    pub fn liveness(&self) -> Liveness {
        Liveness { heartbeat: self.heartbeat, silence: self.silence }
    }

    /// Refuses configurations that cannot work.
    pub fn check(&self) -> Result<(), NetError> {
        check(self.caps, self.liveness())?;
        if !self.serving.serves() {
            return Err(NetError::Config(format!("{} serves no controller", self.serving)));
        }
        if self.handshake.is_zero() {
            return Err(NetError::Config("the handshake deadline is zero".into()));
        }
        Ok(())
    }
}

/// Refuses caps that do not fit the wire's 4-byte length and timings that cannot tell a live
/// peer from a dead one.
pub(crate) fn check(caps: Caps, liveness: Liveness) -> Result<(), NetError> {
    let max = u32::MAX as usize - DATA_HEADER;
    for lane in Lane::BOTH {
        let cap = caps.of(lane);
        if cap == 0 || cap > max {
            return Err(NetError::Config(format!(
                "the {lane} cap of {cap} bytes is not within 1..={max}"
            )));
        }
    }
    if liveness.heartbeat.is_zero() || liveness.silence <= liveness.heartbeat {
        return Err(NetError::Config(format!(
            "silence ({:?}) must be longer than the heartbeat ({:?}), which must not be zero",
            liveness.silence, liveness.heartbeat
        )));
    }
    Ok(())
}

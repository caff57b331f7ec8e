//! The two connections a session runs on.

use std::fmt;

/// One of a session's two connections: small messages and large ones travel apart, so a
/// 100 MB snapshot never holds up a heartbeat or a control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Small, frequent messages.
    Control,
    /// Large messages (model snapshots and updates).
    Bulk,
}

impl Lane {
    /// Both lanes, in index order.
    pub const BOTH: [Lane; 2] = [Lane::Control, Lane::Bulk];

    /// 0 for control, 1 for bulk: the lane's slot in per-lane arrays and its wire byte.
    pub fn index(self) -> usize {
        match self {
            Lane::Control => 0,
            Lane::Bulk => 1,
        }
    }

    /// The lane whose wire byte is `byte`.
    pub fn from_byte(byte: u8) -> Option<Lane> {
        match byte {
            0 => Some(Lane::Control),
            1 => Some(Lane::Bulk),
            _ => None,
        }
    }
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Lane::Control => "control",
            Lane::Bulk => "bulk",
        })
    }
}

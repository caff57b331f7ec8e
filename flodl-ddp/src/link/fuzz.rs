//! The network link's frame decoders and an encoded frame of every wire message, exposed for
//! the fuzz test (`tests/fuzz.rs`); not part of the API.

use super::frame::{self, WireFormat};
use super::samples::messages;
use super::wire::{ToCoordinator, ToWorker};

/// Which way a frame travels, which says what it must decode to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Coordinator → rank (a rank decodes it).
    ToRank,
    /// Rank → coordinator (the coordinator decodes it).
    ToCoordinator,
}

/// Every sample message of both directions, encoded in both wire formats.
pub fn seeds() -> Vec<(Direction, Vec<u8>)> {
    let (to_rank, to_coordinator) = messages();
    let mut out = Vec::new();
    for format in [WireFormat::F32, WireFormat::Bf16] {
        for msg in &to_rank {
            if let Ok((_, bytes)) = frame::encode(msg.clone(), format) {
                out.push((Direction::ToRank, bytes));
            }
        }
        for msg in &to_coordinator {
            if let Ok((_, bytes)) = frame::encode(msg.clone(), format) {
                out.push((Direction::ToCoordinator, bytes));
            }
        }
    }
    out
}

/// Decodes `bytes` as one frame travelling `direction`, as the link's reader does: `Ok` when it
/// is a message, the decoder's typed error (as its line) when not.
pub fn decode(direction: Direction, bytes: &[u8]) -> Result<(), String> {
    match direction {
        Direction::ToRank => frame::decode::<ToWorker>(bytes).map(drop),
        Direction::ToCoordinator => frame::decode::<ToCoordinator>(bytes).map(drop),
    }
    .map_err(|e| e.to_string())
}

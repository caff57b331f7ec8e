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

/// Every text the sample messages carry, each in a frame of its own whose length prefix for
/// that text announces 2^60 bytes: `(direction, the text, the hostile frame)`.
///
/// The texts are found without naming the fields: every string of a message's JSON form
/// (values and keys) that its frame holds as bincode writes a string (a one-byte length, then
/// the bytes) is one; names of fields and variants never appear so in a frame (bincode writes
/// neither). So a text field added to a message, and filled in `samples.rs`, is covered here
/// whatever its type: a plain `String` would try to reserve the announced 2^60 bytes.
pub fn hostile_texts() -> Vec<(Direction, String, Vec<u8>)> {
    let (to_rank, to_coordinator) = messages();
    let mut out = Vec::new();
    for msg in &to_rank {
        hostile(Direction::ToRank, msg, &mut out);
    }
    for msg in &to_coordinator {
        hostile(Direction::ToCoordinator, msg, &mut out);
    }
    out
}

/// Adds the hostile frames of `msg`'s texts to `out`.
fn hostile<M: frame::Framed + Clone>(
    direction: Direction,
    msg: &M,
    out: &mut Vec<(Direction, String, Vec<u8>)>,
) {
    let (Ok(json), Ok((_, bytes))) =
        (serde_json::to_value(msg), frame::encode(msg.clone(), WireFormat::F32))
    else {
        return;
    };
    let mut texts = Vec::new();
    strings(&json, &mut texts);
    texts.sort();
    texts.dedup();
    for text in texts {
        let Ok(len) = u8::try_from(text.len()) else { continue };
        if len == 0 || len > 250 {
            continue;
        }
        let written: Vec<u8> = std::iter::once(len).chain(text.bytes()).collect();
        let Some(at) = bytes.windows(written.len()).position(|w| w == written.as_slice()) else {
            continue;
        };
        let mut prefix = vec![0xfd];
        prefix.extend_from_slice(&(1u64 << 60).to_le_bytes());
        let mut frame = bytes.clone();
        frame.splice(at..at + 1, prefix);
        out.push((direction, text, frame));
    }
}

/// Every string of `value`, its object keys included.
fn strings(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                out.push(key.clone());
                strings(v, out);
            }
        }
        _ => {}
    }
}

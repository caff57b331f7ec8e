//! The bytes on a lane: length-prefixed messages (tokio-util's length-delimited framing, a 4-byte
//! big-endian length) whose first byte says what they are.
//!
//! | kind | body after the kind byte |
//! |---|---|
//! | 1 hello | protocol u32, application protocol u32, run hash (32 bytes), rank u64, world u64, lane u8, join token u64 (big-endian) |
//! | 2 welcome | nothing |
//! | 3 refused | one UTF-8 line, at most [`MAX_REASON`] bytes |
//! | 4 data | sequence number u64, then the frame |
//! | 5 heartbeat | nothing |
//!
//! A connection opens with the joiner's hello and the controller's welcome or refusal; data and
//! heartbeats follow. Everything is decoded without trusting the peer: bad bytes are an error,
//! never a panic.

mod codec;
mod hello;
mod message;

pub use codec::{
    DATA_HEADER, FIRST_ROOM, FrameDecoder, FrameError, HANDSHAKE_MAX, codec, data_header,
};
pub use hello::{Hello, LaneHello, PROTOCOL};
pub(crate) use message::kind;
pub use message::{MAX_REASON, Message, WireError};

//! One message on a lane, and its decoding from untrusted bytes.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

use super::hello::{Hello, LaneHello, PROTOCOL};
use crate::session::Lane;

/// The longest refusal line sent; longer reasons are cut at a character boundary.
pub const MAX_REASON: usize = 512;

/// The kind bytes.
pub(crate) mod kind {
    pub(crate) const HELLO: u8 = 1;
    pub(crate) const WELCOME: u8 = 2;
    pub(crate) const REFUSED: u8 = 3;
    pub(crate) const DATA: u8 = 4;
    pub(crate) const HEARTBEAT: u8 = 5;
}

/// The body length of a hello after its kind byte.
const HELLO_BODY: usize = 4 + 4 + 32 + 8 + 8 + 1 + 8;

/// One message on a lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A joiner opens a lane.
    Hello(LaneHello),
    /// The controller accepts the lane.
    Welcome,
    /// The controller refuses the lane; the line says why.
    Refused(String),
    /// A user frame and its sequence number (shared by both lanes of a session).
    Data { seq: u64, frame: Bytes },
    /// "Still here": sent when a lane has been quiet for the heartbeat period.
    Heartbeat,
}

/// Bytes that are not a message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// A message of no bytes.
    #[error("an empty message")]
    Empty,
    /// An unknown kind byte.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// A message whose body has the wrong length for its kind.
    #[error("a {kind} message of {len} bytes")]
    Length { kind: &'static str, len: usize },
    /// A hello naming a lane that does not exist.
    #[error("a hello for lane {0}, which does not exist")]
    Lane(u8),
    /// A rank or world size that does not fit this machine's `usize`.
    #[error("a rank or world size too large for this machine")]
    Range,
    /// A refusal whose reason is not UTF-8.
    #[error("a refusal that is not UTF-8")]
    Utf8,
    /// A hello of another protocol version than this build's (its layout may differ, so the
    /// rest is not read).
    #[error("a hello of protocol version {0}")]
    Protocol(u32),
}

impl Message {
    /// Decodes one message (the bytes inside a length prefix).
    pub fn decode(mut bytes: BytesMut) -> Result<Message, WireError> {
        if bytes.is_empty() {
            return Err(WireError::Empty);
        }
        let kind = bytes.get_u8();
        let body = bytes.len();
        let exact = |kind_name: &'static str, want: usize| {
            if body == want {
                Ok(())
            } else {
                Err(WireError::Length { kind: kind_name, len: body })
            }
        };
        match kind {
            kind::HELLO => {
                // The version comes first in every protocol's hello: another one is named
                // whatever its length, so the controller can say which.
                if body >= 4 {
                    let protocol = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                    if protocol != PROTOCOL {
                        return Err(WireError::Protocol(protocol));
                    }
                }
                exact("hello", HELLO_BODY)?;
                let protocol = bytes.get_u32();
                let app = bytes.get_u32();
                let mut run = [0u8; 32];
                bytes.copy_to_slice(&mut run);
                let rank = usize::try_from(bytes.get_u64()).map_err(|_| WireError::Range)?;
                let world = usize::try_from(bytes.get_u64()).map_err(|_| WireError::Range)?;
                let lane_byte = bytes.get_u8();
                let lane = Lane::from_byte(lane_byte).ok_or(WireError::Lane(lane_byte))?;
                let token = bytes.get_u64();
                Ok(Message::Hello(LaneHello {
                    hello: Hello { protocol, run, rank, world },
                    app,
                    lane,
                    token,
                }))
            }
            kind::WELCOME => exact("welcome", 0).map(|_| Message::Welcome),
            kind::HEARTBEAT => exact("heartbeat", 0).map(|_| Message::Heartbeat),
            kind::REFUSED => {
                if body > MAX_REASON {
                    return Err(WireError::Length { kind: "refusal", len: body });
                }
                String::from_utf8(bytes.to_vec()).map(Message::Refused).map_err(|_| WireError::Utf8)
            }
            kind::DATA => {
                if body < 8 {
                    return Err(WireError::Length { kind: "data", len: body });
                }
                let seq = bytes.get_u64();
                Ok(Message::Data { seq, frame: bytes.freeze() })
            }
            other => Err(WireError::UnknownKind(other)),
        }
    }

    /// Encodes a handshake or heartbeat message (data frames are written as
    /// [`data_header`](super::data_header) and the frame, without this copy).
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        match self {
            Message::Hello(LaneHello { hello, app, lane, token }) => {
                out.put_u8(kind::HELLO);
                out.put_u32(hello.protocol);
                out.put_u32(*app);
                out.put_slice(&hello.run);
                out.put_u64(hello.rank as u64);
                out.put_u64(hello.world as u64);
                out.put_u8(lane.index() as u8);
                out.put_u64(*token);
            }
            Message::Welcome => out.put_u8(kind::WELCOME),
            Message::Heartbeat => out.put_u8(kind::HEARTBEAT),
            Message::Refused(reason) => {
                out.put_u8(kind::REFUSED);
                let mut end = reason.len().min(MAX_REASON);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                out.put_slice(&reason.as_bytes()[..end]);
            }
            Message::Data { seq, frame } => {
                out.put_u8(kind::DATA);
                out.put_u64(*seq);
                out.put_slice(frame);
            }
        }
        out.freeze()
    }
}

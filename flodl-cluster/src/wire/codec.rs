//! The length-delimited framing every lane uses, and the data header written in front of a frame.

use bytes::BytesMut;
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

use super::message::Message;

/// The bytes a data message adds to its frame inside the length prefix: the kind and the sequence
/// number.
pub const DATA_HEADER: usize = 1 + 8;

/// The largest message of the handshake (a hello, a welcome or a refusal).
pub const HANDSHAKE_MAX: usize = 1024;

/// The framing of one lane: a 4-byte big-endian length, then that many bytes, at most `max_body`
/// (a longer prefix is an error before anything is allocated).
pub fn codec(max_body: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(4)
        .big_endian()
        .max_frame_length(max_body)
        .new_codec()
}

/// The bytes a reader makes room for when a frame's first bytes arrive; after that its buffer at
/// most doubles with the bytes that have arrived.
pub const FIRST_ROOM: usize = 64 * 1024;

/// Why a lane's bytes could not be read as a message.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Reading failed, or the bytes are not a length-prefixed message.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A message longer than the reader's cap. `seq` is its sequence number where it is a data
    /// message: every frame the peer sent before it has a smaller one.
    #[error("a message of {body} bytes, above the cap of {max} bytes")]
    TooLarge { body: usize, max: usize, seq: Option<u64> },
}

/// [`codec`]'s framing for reading from a peer not yet trusted: the same bytes, but the buffer
/// grows as the frame's bytes arrive instead of being reserved whole when its length prefix
/// does, so a prefix announcing the cap costs [`FIRST_ROOM`] until the peer has sent (and the
/// TLS layer has authenticated) as many bytes as it asks the reader to hold. Growth doubles, so
/// a large frame is moved at most a logarithmic number of times (and a large buffer's growth is a
/// `realloc`, which remaps pages instead of copying them). A prefix above the cap is refused once
/// the kind and sequence number behind it have arrived ([`FrameError::TooLarge`]).
#[derive(Debug)]
pub struct FrameDecoder {
    inner: LengthDelimitedCodec,
    max_body: usize,
}

impl FrameDecoder {
    /// A decoder of messages of at most `max_body` bytes (a longer prefix is an error).
    pub fn new(max_body: usize) -> FrameDecoder {
        FrameDecoder { inner: codec(max_body), max_body }
    }
}

impl Decoder for FrameDecoder {
    type Item = BytesMut;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        if let Some(&[a, b, c, d]) = src.get(..4) {
            let body = u32::from_be_bytes([a, b, c, d]) as usize;
            let whole = body.saturating_add(4);
            if body > self.max_body {
                // Refused, but only once the kind and sequence number behind the prefix are
                // here (a few bytes more), so the session can still deliver the frames sent
                // before this one.
                let Some(head) = src.get(4..4 + DATA_HEADER) else { return Ok(None) };
                let seq = match Message::decode(BytesMut::from(head)) {
                    Ok(Message::Data { seq, .. }) => Some(seq),
                    _ => None,
                };
                return Err(FrameError::TooLarge { body, max: self.max_body, seq });
            }
            // An incomplete message of an allowed size: make room for what is on its way, at
            // most as much as has already arrived.
            if src.len() < whole {
                let want = (whole - src.len()).min(src.len().max(FIRST_ROOM));
                if src.capacity() - src.len() < want {
                    src.reserve(want);
                }
                return Ok(None);
            }
        }
        // A whole message (or a head still incomplete): the inner codec never needs to reserve
        // here.
        Ok(self.inner.decode(src)?)
    }
}

/// The bytes in front of a data frame of `len` bytes: the length prefix of [`codec`], the data kind
/// and `seq`. Written before the frame itself so a large frame is not copied into a buffer first;
/// `None` when the message would not fit the 4-byte prefix.
pub fn data_header(seq: u64, len: usize) -> Option<[u8; 4 + DATA_HEADER]> {
    let body = u32::try_from(len.checked_add(DATA_HEADER)?).ok()?;
    let mut header = [0u8; 4 + DATA_HEADER];
    header[..4].copy_from_slice(&body.to_be_bytes());
    header[4] = super::message::kind::DATA;
    header[5..].copy_from_slice(&seq.to_be_bytes());
    Some(header)
}

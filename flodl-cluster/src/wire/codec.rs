//! The length-delimited framing every lane uses, and the data header written in front of a frame.

use tokio_util::codec::LengthDelimitedCodec;

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

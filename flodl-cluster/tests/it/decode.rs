//! The decoders take arbitrary bytes without panicking, and read back what was encoded.

use bytes::{Bytes, BytesMut};
use flodl_cluster::Lane;
use flodl_cluster::wire::{
    DATA_HEADER, FrameDecoder, FrameError, HANDSHAKE_MAX, Hello, LaneHello, Message, PROTOCOL,
    WireError, codec, data_header,
};
use proptest::prelude::*;
use tokio_util::codec::Decoder;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes_decode_to_a_message_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        // Never a panic; a hello always decodes to something it encodes back to.
        if let Ok(message @ Message::Hello(_)) = Message::decode(BytesMut::from(&bytes[..])) {
            prop_assert_eq!(message.encode(), Bytes::from(bytes));
        }
    }

    #[test]
    fn any_bytes_through_the_framing_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut codec = codec(HANDSHAKE_MAX);
        let mut buf = BytesMut::from(&bytes[..]);
        // Each frame the codec yields is at most the cap; a bad prefix is an error.
        for _ in 0..64 {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => {
                    prop_assert!(frame.len() <= HANDSHAKE_MAX);
                    let _ = Message::decode(frame);
                }
                Ok(None) | Err(_) => break,
            }
        }
    }

    #[test]
    fn hellos_round_trip(app in any::<u32>(), run in any::<[u8; 32]>(), rank in any::<u32>(), world in any::<u32>(), bulk in any::<bool>(), token in any::<u64>()) {
        let lane = if bulk { Lane::Bulk } else { Lane::Control };
        let hello = LaneHello { hello: Hello { protocol: PROTOCOL, run, rank: rank as usize, world: world as usize }, app, lane, token };
        let decoded = Message::decode(BytesMut::from(&Message::Hello(hello).encode()[..]));
        prop_assert_eq!(decoded, Ok(Message::Hello(hello)));
    }

    /// A hello of another protocol is named by its version, whatever its length (an older
    /// build's hello is shorter), so the controller can say which version the joiner speaks.
    #[test]
    fn a_hello_of_another_protocol_is_named_by_its_version(protocol in any::<u32>(), tail in proptest::collection::vec(any::<u8>(), 0..80)) {
        prop_assume!(protocol != PROTOCOL);
        let mut bytes = BytesMut::from(&[1u8][..]);
        bytes.extend_from_slice(&protocol.to_be_bytes());
        bytes.extend_from_slice(&tail);
        prop_assert_eq!(Message::decode(bytes), Err(WireError::Protocol(protocol)));
    }

    #[test]
    fn data_headers_frame_what_the_codec_reads(seq in any::<u64>(), frame in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let header = data_header(seq, frame.len()).ok_or_else(|| TestCaseError::fail("no header"))?;
        let mut wire = BytesMut::from(&header[..]);
        wire.extend_from_slice(&frame);
        let body = codec(frame.len() + DATA_HEADER).decode(&mut wire).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let body = body.ok_or_else(|| TestCaseError::fail("no frame"))?;
        prop_assert_eq!(Message::decode(body), Ok(Message::Data { seq, frame: Bytes::from(frame) }));
        prop_assert!(wire.is_empty());
    }

    #[test]
    fn a_message_above_the_cap_is_refused_by_its_sequence_number_once_it_is_known(seq in any::<u64>(), max in 0usize..4096, over in 1usize..4096, kind in prop_oneof![Just(4u8), any::<u8>()], tail in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut message = u32::try_from(max + over).map_err(|e| TestCaseError::fail(e.to_string()))?.to_be_bytes().to_vec();
        message.push(kind);
        message.extend_from_slice(&seq.to_be_bytes());
        message.extend_from_slice(&tail);
        let mut decoder = FrameDecoder::new(max);
        let mut wire = BytesMut::new();
        // Byte by byte: nothing until the kind and sequence number are in, then the refusal.
        for (i, byte) in message.iter().enumerate() {
            wire.extend_from_slice(&[*byte]);
            match decoder.decode(&mut wire) {
                Ok(None) if i + 1 < 4 + DATA_HEADER => {}
                Err(FrameError::TooLarge { body, max: m, seq: got }) if i + 1 == 4 + DATA_HEADER => {
                    prop_assert_eq!((body, m), (max + over, max));
                    prop_assert_eq!(got, (kind == 4).then_some(seq));
                    break;
                }
                other => return Err(TestCaseError::fail(format!("after {} bytes: {other:?}", i + 1))),
            }
        }
    }

    #[test]
    fn any_bytes_through_the_lane_decoder_never_panic(max in 0usize..512, bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut decoder = FrameDecoder::new(max);
        let mut wire = BytesMut::from(&bytes[..]);
        while let Ok(Some(body)) = decoder.decode(&mut wire) {
            prop_assert!(body.len() <= max);
        }
    }
}

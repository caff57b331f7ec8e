//! When bytes of a data frame still on its way last came from the peer: its sign of life while
//! one large frame crosses a slow link, long before the frame is whole.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::BytesMut;
use tokio_util::codec::Decoder;

use crate::wire::kind;

/// When bytes of a data frame not yet whole last came from a session's peer (heartbeats never
/// count), shared by the session's lane readers and whoever holds its handle.
#[derive(Debug)]
pub struct Arrival {
    base: Instant,
    /// Nanoseconds after `base`, plus one (0: never).
    at: AtomicU64,
}

impl Arrival {
    pub(crate) fn new() -> Arc<Arrival> {
        Arc::new(Arrival { base: Instant::now(), at: AtomicU64::new(0) })
    }

    /// Bytes of an incomplete data frame arrived now.
    fn stamp(&self) {
        let nanos = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        self.at.fetch_max(nanos.saturating_add(1), Ordering::Relaxed);
    }

    /// The latest moment bytes of a data frame not yet whole came (`None`: no data frame has
    /// been partly received yet).
    pub fn last(&self) -> Option<Instant> {
        match self.at.load(Ordering::Relaxed) {
            0 => None,
            n => self.base.checked_add(std::time::Duration::from_nanos(n - 1)),
        }
    }
}

/// The bytes of a frame on its way that make one stamp: a peer that trickles a frame (an
/// insider holding a reduce) must send this much per deadline to be heard, so it can hold one
/// for at most the lane's cap over this many bytes per deadline.
pub(crate) const STEP: usize = 64 * 1024;

/// A lane's decoder that stamps [`Arrival`] whenever a data frame it cannot complete yet has
/// grown by [`STEP`] bytes. A heartbeat or a handshake message never counts: a peer whose
/// session tasks run while its program is stuck shows no progress.
#[derive(Debug)]
pub(crate) struct Watched<D> {
    inner: D,
    arrival: Arc<Arrival>,
    /// The buffered length of the frame on its way at its last stamp (0: none yet).
    stamped: usize,
}

impl<D> Watched<D> {
    pub(crate) fn new(inner: D, arrival: Arc<Arrival>) -> Watched<D> {
        Watched { inner, arrival, stamped: 0 }
    }
}

impl<D: Decoder<Item = BytesMut>> Decoder for Watched<D> {
    type Item = BytesMut;
    type Error = D::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, D::Error> {
        let decoded = self.inner.decode(src)?;
        if decoded.is_some() {
            // What is left starts the next message.
            self.stamped = 0;
        } else if src.get(4) == Some(&kind::DATA) && src.len() >= self.stamped + STEP {
            // The head of a data frame still on its way (length prefix, then kind), grown by
            // a step since the last stamp.
            self.stamped = src.len();
            self.arrival.stamp();
        }
        Ok(decoded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FrameDecoder, Message, codec, data_header};
    use tokio_util::codec::Encoder;

    /// Only a data frame's incomplete bytes stamp, once per step of growth: a whole frame, a
    /// heartbeat in pieces, a prefix alone or less than a step of a frame do not.
    #[test]
    fn only_a_data_frame_on_its_way_is_progress() -> Result<(), String> {
        let mut beat = BytesMut::new();
        codec(1).encode(Message::Heartbeat.encode(), &mut beat).map_err(|e| e.to_string())?;
        let len = 3 * STEP;
        let header = data_header(7, len).ok_or("no header")?;
        let mut data = header.to_vec();
        data.extend(std::iter::repeat_n(1u8, len));
        let head = header.len();
        /// A case: its name, what arrives piece by piece, the stamps made after each piece.
        type Case = (&'static str, Vec<Vec<u8>>, Vec<usize>);
        let cases: Vec<Case> = vec![
            ("a prefix alone", vec![data[..4].to_vec()], vec![0]),
            ("a heartbeat in part", vec![beat[..beat.len() - 1].to_vec()], vec![0]),
            ("a whole heartbeat", vec![beat.to_vec()], vec![0]),
            ("a whole data frame", vec![data.clone()], vec![0]),
            ("a data frame's head", vec![data[..head + 10].to_vec()], vec![0]),
            (
                "a data frame in steps",
                vec![
                    data[..STEP].to_vec(),
                    data[STEP..STEP + 10].to_vec(),
                    data[STEP + 10..2 * STEP + 5].to_vec(),
                    data[2 * STEP + 5..].to_vec(),
                ],
                vec![1, 1, 2, 2],
            ),
        ];
        for (name, pieces, want) in cases {
            let arrival = Arrival::new();
            let mut d = Watched::new(FrameDecoder::new(len + 64), arrival.clone());
            let mut src = BytesMut::new();
            let mut last = None;
            let mut stamps = 0;
            for (i, piece) in pieces.iter().enumerate() {
                src.extend_from_slice(piece);
                d.decode(&mut src).map_err(|e| format!("{name}: {e}"))?;
                if arrival.last() != last {
                    stamps += 1;
                    last = arrival.last();
                }
                if stamps != want[i] {
                    return Err(format!(
                        "{name}, piece {i}: {stamps} stamps, {} expected",
                        want[i]
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        Ok(())
    }

    /// Stamps only move forward, and read back as the moment they were made.
    #[test]
    fn stamps_read_back_in_order() -> Result<(), String> {
        let arrival = Arrival::new();
        let before = Instant::now();
        arrival.stamp();
        let first = arrival.last().ok_or("no stamp")?;
        std::thread::sleep(std::time::Duration::from_millis(2));
        arrival.stamp();
        let second = arrival.last().ok_or("no stamp")?;
        if first < before || second <= first || second > Instant::now() {
            return Err(format!("{before:?} {first:?} {second:?}"));
        }
        Ok(())
    }
}

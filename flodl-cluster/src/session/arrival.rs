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

/// A lane's decoder that stamps [`Arrival`] whenever it is handed bytes of a data frame it
/// cannot complete yet. A heartbeat or a handshake message never counts: a peer whose session
/// tasks run while its program is stuck shows no progress.
#[derive(Debug)]
pub(crate) struct Watched<D> {
    inner: D,
    arrival: Arc<Arrival>,
}

impl<D> Watched<D> {
    pub(crate) fn new(inner: D, arrival: Arc<Arrival>) -> Watched<D> {
        Watched { inner, arrival }
    }
}

impl<D: Decoder<Item = BytesMut>> Decoder for Watched<D> {
    type Item = BytesMut;
    type Error = D::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, D::Error> {
        let decoded = self.inner.decode(src)?;
        // What is left is the head of a message still on its way: length prefix, then kind.
        if decoded.is_none() && src.get(4) == Some(&kind::DATA) {
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

    /// Only a data frame's incomplete bytes stamp: a whole frame, a heartbeat in pieces, or
    /// a prefix alone do not.
    #[test]
    fn only_a_data_frame_on_its_way_is_progress() -> Result<(), String> {
        let mut beat = BytesMut::new();
        codec(1).encode(Message::Heartbeat.encode(), &mut beat).map_err(|e| e.to_string())?;
        let header = data_header(7, 100).ok_or("no header")?;
        let mut data = header.to_vec();
        data.extend_from_slice(&[1u8; 100]);
        // (what arrives, whether it stamps)
        let cases: Vec<(&str, Vec<u8>, bool)> = vec![
            ("a prefix alone", data[..4].to_vec(), false),
            ("a heartbeat in part", beat[..beat.len() - 1].to_vec(), false),
            ("a whole heartbeat", beat.to_vec(), false),
            ("a whole data frame", data.clone(), false),
            ("a data frame's head", data[..5].to_vec(), true),
            ("a data frame but its last byte", data[..data.len() - 1].to_vec(), true),
        ];
        for (name, bytes, stamps) in cases {
            let arrival = Arrival::new();
            let mut d = Watched::new(FrameDecoder::new(1 << 10), arrival.clone());
            let mut src = BytesMut::from(&bytes[..]);
            d.decode(&mut src).map_err(|e| format!("{name}: {e}"))?;
            if arrival.last().is_some() != stamps {
                return Err(format!("{name}: stamped {:?}", arrival.last()));
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

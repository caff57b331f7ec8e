//! A run of values a frame carries as one byte string: bincode writes it with one copy and
//! reads it straight from the frame, where a plain `Vec` travels value by value (a 20 MB f32
//! state took 22 ms to encode and 23 ms to decode that way on the 2-core machine).
//!
//! [`F32Run`] is a vector of f32 values as little-endian bytes; [`bytes`] is the same for a
//! `Vec<u8>` field (`#[serde(with = "raw_run::bytes")]`). Reading borrows the frame's bytes,
//! so a length a frame announces is never allocated before the frame is known to hold it.

use serde::de::Visitor;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The f32 values of one state vector, travelling as their little-endian bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct F32Run(pub(crate) Vec<f32>);

impl Serialize for F32Run {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if cfg!(target_endian = "little") {
            serializer.serialize_bytes(bytemuck::cast_slice(&self.0))
        } else {
            let bytes: Vec<u8> = self.0.iter().flat_map(|v| v.to_le_bytes()).collect();
            serializer.serialize_bytes(&bytes)
        }
    }
}

impl<'de> Deserialize<'de> for F32Run {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<F32Run, D::Error> {
        struct Values;
        impl Visitor<'_> for Values {
            type Value = F32Run;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("f32 values as little-endian bytes")
            }

            fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<F32Run, E> {
                if !bytes.len().is_multiple_of(4) {
                    return Err(E::custom(format!("{} bytes of f32 values", bytes.len())));
                }
                let values = bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                Ok(F32Run(values))
            }
        }
        deserializer.deserialize_bytes(Values)
    }
}

/// A `Vec<u8>` field travelling as one byte string.
pub(crate) mod bytes {
    use super::*;

    /// Writes `bytes` as one byte string.
    pub(crate) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    /// Reads one byte string.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl Visitor<'_> for Bytes {
            type Value = Vec<u8>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }

            fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
                Ok(bytes.to_vec())
            }
        }
        deserializer.deserialize_bytes(Bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Carrier {
        head: u32,
        runs: Vec<F32Run>,
        #[serde(with = "bytes")]
        codes: Vec<u8>,
    }

    fn config() -> bincode::config::Configuration {
        bincode::config::standard()
    }

    /// Random runs (empty ones, every special value among them) and byte strings come back bit
    /// for bit, and each run costs its bytes and a length only; a frame cut short anywhere,
    /// or announcing more bytes than it holds, is an error, never an allocation of what it
    /// announces.
    #[test]
    fn runs_travel_bit_for_bit_and_refuse_short_frames() -> Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
        let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::MIN_POSITIVE / 2.0];
        for case in 0..200 {
            let runs: Vec<F32Run> = (0..rng.random_range(0..5))
                .map(|_| {
                    let n = [0, 1, 3, 64, 1000][rng.random_range(0..5)];
                    F32Run(
                        (0..n)
                            .map(|_| match rng.random_range(0..8) {
                                0 => special[rng.random_range(0..special.len())],
                                _ => f32::from_bits(rng.random::<u32>()),
                            })
                            .collect(),
                    )
                })
                .collect();
            let codes: Vec<u8> = (0..rng.random_range(0..300)).map(|_| rng.random()).collect();
            let sent = Carrier { head: case, runs, codes };
            let bytes =
                bincode::serde::encode_to_vec(&sent, config()).map_err(|e| e.to_string())?;
            let values: usize = sent.runs.iter().map(|r| r.0.len()).sum();
            let most = 1 + 5 + 4 * values + 5 * (sent.runs.len() + 2) + sent.codes.len();
            if bytes.len() > most {
                return Err(format!("case {case}: {} bytes for {values} values", bytes.len()));
            }
            let (got, read): (Carrier, usize) =
                bincode::serde::decode_from_slice(&bytes, config()).map_err(|e| e.to_string())?;
            let bits = |c: &Carrier| -> Vec<Vec<u32>> {
                c.runs.iter().map(|r| r.0.iter().map(|v| v.to_bits()).collect()).collect()
            };
            if read != bytes.len() || bits(&got) != bits(&sent) || got.codes != sent.codes {
                return Err(format!("case {case}: not the runs sent"));
            }
            let cut = rng.random_range(0..bytes.len());
            if bincode::serde::decode_from_slice::<Carrier, _>(&bytes[..cut], config()).is_ok() {
                return Err(format!("case {case}: decoded from {cut} of {} bytes", bytes.len()));
            }
        }
        // A run of a length that is no whole number of values, and one announcing 2^40 bytes.
        let odd = bincode::serde::encode_to_vec((1u32, vec![vec![0u8; 7]]), config());
        let mut huge = bincode::serde::encode_to_vec((1u32, vec![F32Run(vec![1.0])]), config())
            .map_err(|e| e.to_string())?;
        huge.truncate(2);
        huge.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 1, 0, 0]);
        for (what, bytes) in [("odd", odd.map_err(|e| e.to_string())?), ("huge", huge)] {
            if bincode::serde::decode_from_slice::<(u32, Vec<F32Run>), _>(&bytes, config()).is_ok()
            {
                return Err(format!("a {what} run decoded"));
            }
        }
        Ok(())
    }
}

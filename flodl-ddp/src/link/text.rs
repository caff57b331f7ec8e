//! Text fields of wire messages, decoded without trusting their length prefix.
//!
//! bincode decodes a `String` by allocating the length its prefix announces and then reading,
//! so a hostile peer's frame of a few bytes could make a reader allocate gigabytes. These
//! decoders read a string as a sequence of bytes instead: the buffer grows only as bytes
//! arrive (serde starts it at most 4 KiB here), so a string costs no more memory than the
//! frame that carries it. The encoding is unchanged (bincode writes a string as its length and
//! its bytes, the same as a sequence of `u8`); human-readable formats (JSON) read strings as
//! usual. Use with `#[serde(deserialize_with = ...)]`.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// The most bytes reserved for a string before any of it is read.
const FIRST_RESERVE: usize = 4096;

/// A string read as it arrives.
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Text, D::Error> {
        if deserializer.is_human_readable() {
            return String::deserialize(deserializer).map(Text);
        }
        deserializer.deserialize_seq(TextVisitor).map(Text)
    }
}

/// Collects a string's bytes one by one and checks they are UTF-8.
struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a UTF-8 string")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<String, A::Error> {
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(FIRST_RESERVE));
        while let Some(byte) = seq.next_element::<u8>()? {
            bytes.push(byte);
        }
        String::from_utf8(bytes).map_err(|e| serde::de::Error::custom(e.utf8_error()))
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<String, E> {
        Ok(s.to_owned())
    }

    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<String, E> {
        Ok(s)
    }
}

/// Decodes a `String` field.
pub(crate) fn string<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    Text::deserialize(deserializer).map(|t| t.0)
}

/// Decodes a map keyed by strings.
pub(crate) fn keyed<'de, D, V>(deserializer: D) -> Result<BTreeMap<String, V>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    /// Collects the entries.
    struct Entries<V>(std::marker::PhantomData<V>);

    impl<'de, V: Deserialize<'de>> Visitor<'de> for Entries<V> {
        type Value = BTreeMap<String, V>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map keyed by strings")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((Text(key), value)) = map.next_entry::<Text, V>()? {
                out.insert(key, value);
            }
            Ok(out)
        }
    }

    deserializer.deserialize_map(Entries(std::marker::PhantomData))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Fields {
        #[serde(deserialize_with = "string")]
        text: String,
        #[serde(deserialize_with = "keyed")]
        map: BTreeMap<String, (f64, usize)>,
    }

    fn sample() -> Fields {
        let mut map = BTreeMap::new();
        map.insert("grad_norm".to_string(), (1.5, 2));
        map.insert("ünïcode".to_string(), (-0.25, 9));
        Fields { text: "a failure: ≠ ascii".into(), map }
    }

    /// Both formats read back what they wrote, and bincode's bytes are those of plain strings.
    #[test]
    fn text_fields_round_trip_in_bincode_and_json() -> Result<(), String> {
        let config = bincode::config::standard();
        let value = sample();
        let bytes = bincode::serde::encode_to_vec(&value, config).map_err(|e| e.to_string())?;
        let (back, read): (Fields, usize) =
            bincode::serde::decode_from_slice(&bytes, config).map_err(|e| e.to_string())?;
        if back != value || read != bytes.len() {
            return Err(format!("bincode gave {back:?} from {read} of {} bytes", bytes.len()));
        }
        let plain =
            bincode::serde::encode_to_vec(&value.text, config).map_err(|e| e.to_string())?;
        if !bytes.starts_with(&plain) {
            return Err("the text is not encoded as a plain string".into());
        }
        let json = serde_json::to_string(&value).map_err(|e| e.to_string())?;
        let back: Fields = serde_json::from_str(&json).map_err(|e| e.to_string())?;
        if back != value {
            return Err(format!("json gave {back:?}"));
        }
        Ok(())
    }

    /// A prefix announcing 2^60 bytes, or bytes that are not UTF-8, are errors (and nothing of
    /// the announced size is allocated: the fuzz test counts allocations).
    #[test]
    fn hostile_text_is_an_error() -> Result<(), String> {
        let config = bincode::config::standard();
        // 0xfd: a u64 length follows (little-endian).
        let mut huge = vec![0xfd];
        huge.extend_from_slice(&(1u64 << 60).to_le_bytes());
        huge.extend_from_slice(b"abc");
        let invalid = vec![2, 0xff, 0xfe];
        for bytes in [huge, invalid] {
            let got: Result<(Text, usize), _> = bincode::serde::decode_from_slice(&bytes, config);
            if let Ok((Text(t), _)) = got {
                return Err(format!("{bytes:?} decoded to {t:?}"));
            }
        }
        Ok(())
    }
}

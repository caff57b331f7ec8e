//! [`WireText`], the one string type of the wire: every text a message carries is one, so the
//! defence against untrusted length prefixes comes with the type, not with an attribute a new
//! field could forget.
//!
//! bincode decodes a `String` by allocating the length its prefix announces and then reading,
//! so a hostile peer's frame of a few bytes could make a reader allocate gigabytes. A
//! `WireText` decodes as a sequence of bytes instead: the buffer grows only as bytes arrive
//! (it starts at most 4 KiB), so a text costs no more memory than the frame that carries it,
//! and a text longer than [`WireText::MAX`] is refused. The encoding is unchanged (bincode
//! writes a string as its length and its bytes, the same as a sequence of `u8`); human-readable
//! formats (JSON) read and write a plain string.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};
use serde::{Serialize, Serializer};

/// The most bytes reserved for a text before any of it is read.
const FIRST_RESERVE: usize = 4096;

/// A text that crosses the wire (a failure's message, a user scalar's name): UTF-8 of at most
/// [`WireText::MAX`] bytes, decoded as its bytes arrive. Reads as a `&str`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WireText(String);

impl WireText {
    /// The longest text, in bytes: longer texts are cut (at a character boundary, ending in
    /// `…`) when made, and refused when decoded.
    pub const MAX: usize = 64 * 1024;

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text as an owned `String`.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl From<String> for WireText {
    fn from(mut text: String) -> WireText {
        if text.len() > WireText::MAX {
            let ellipsis = '…';
            let mut cut = WireText::MAX - ellipsis.len_utf8();
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push(ellipsis);
        }
        WireText(text)
    }
}

impl From<&str> for WireText {
    fn from(text: &str) -> WireText {
        WireText::from(text.to_owned())
    }
}

impl From<WireText> for String {
    fn from(text: WireText) -> String {
        text.0
    }
}

impl Deref for WireText {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for WireText {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for WireText {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WireText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for WireText {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for WireText {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl Serialize for WireText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for WireText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<WireText, D::Error> {
        if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            return WireText::checked(text);
        }
        deserializer.deserialize_seq(TextVisitor)
    }
}

impl WireText {
    /// `text`, or the decoder's error when it is longer than [`WireText::MAX`].
    fn checked<E: serde::de::Error>(text: String) -> Result<WireText, E> {
        if text.len() > WireText::MAX {
            return Err(E::custom(format_args!(
                "a text of {} bytes, over the {} allowed",
                text.len(),
                WireText::MAX
            )));
        }
        Ok(WireText(text))
    }
}

/// Collects a text's bytes one by one, at most [`WireText::MAX`], and checks they are UTF-8.
struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = WireText;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a UTF-8 string of at most {} bytes", WireText::MAX)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<WireText, A::Error> {
        let announced = seq.size_hint().unwrap_or(0);
        if announced > WireText::MAX {
            return Err(serde::de::Error::invalid_length(announced, &self));
        }
        let mut bytes = Vec::with_capacity(announced.min(FIRST_RESERVE));
        while let Some(byte) = seq.next_element::<u8>()? {
            if bytes.len() == WireText::MAX {
                return Err(serde::de::Error::invalid_length(bytes.len() + 1, &self));
            }
            bytes.push(byte);
        }
        String::from_utf8(bytes).map(WireText).map_err(|e| serde::de::Error::custom(e.utf8_error()))
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<WireText, E> {
        WireText::checked(s.to_owned())
    }

    fn visit_string<E: serde::de::Error>(self, s: String) -> Result<WireText, E> {
        WireText::checked(s)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Fields {
        text: WireText,
        map: BTreeMap<WireText, (f64, usize)>,
    }

    fn sample() -> Fields {
        let mut map = BTreeMap::new();
        map.insert("grad_norm".into(), (1.5, 2));
        map.insert("ünïcode".into(), (-0.25, 9));
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
        let plain = bincode::serde::encode_to_vec(value.text.as_str(), config)
            .map_err(|e| e.to_string())?;
        if !bytes.starts_with(&plain) {
            return Err("the text is not encoded as a plain string".into());
        }
        let json = serde_json::to_string(&value).map_err(|e| e.to_string())?;
        if !json.contains("\"a failure: ≠ ascii\"") {
            return Err(format!("json wrote {json}"));
        }
        let back: Fields = serde_json::from_str(&json).map_err(|e| e.to_string())?;
        if back != value {
            return Err(format!("json gave {back:?}"));
        }
        Ok(())
    }

    /// A prefix announcing 2^60 bytes, bytes that are not UTF-8, and a text one byte over the
    /// most are errors (and nothing of the announced size is allocated: the fuzz test counts
    /// allocations); a text of exactly the most decodes.
    #[test]
    fn hostile_text_is_an_error() -> Result<(), String> {
        let config = bincode::config::standard();
        // 0xfd: a u64 length follows (little-endian).
        let mut huge = vec![0xfd];
        huge.extend_from_slice(&(1u64 << 60).to_le_bytes());
        huge.extend_from_slice(b"abc");
        let invalid = vec![2, 0xff, 0xfe];
        let encode = |s: &str| bincode::serde::encode_to_vec(s, config).map_err(|e| e.to_string());
        let over = encode(&"x".repeat(WireText::MAX + 1))?;
        for bytes in [huge, invalid, over] {
            let got: Result<(WireText, usize), _> =
                bincode::serde::decode_from_slice(&bytes, config);
            if let Ok((t, _)) = got {
                return Err(format!("{} bytes decoded to {} bytes of text", bytes.len(), t.len()));
            }
        }
        let most = encode(&"y".repeat(WireText::MAX))?;
        let (t, _): (WireText, usize) =
            bincode::serde::decode_from_slice(&most, config).map_err(|e| e.to_string())?;
        if t.len() != WireText::MAX {
            return Err(format!("the longest text came back as {} bytes", t.len()));
        }
        let json_over = format!("\"{}\"", "z".repeat(WireText::MAX + 1));
        if serde_json::from_str::<WireText>(&json_over).is_ok() {
            return Err("json read a text over the most".into());
        }
        Ok(())
    }

    /// A text made longer than the most is cut at a character boundary and still decodes.
    #[test]
    fn long_texts_are_cut_when_made() -> Result<(), String> {
        for long in ["é".repeat(WireText::MAX), "a".repeat(WireText::MAX + 7)] {
            let t = WireText::from(long.as_str());
            if t.len() > WireText::MAX
                || !t.ends_with('…')
                || !long.starts_with(t.trim_end_matches('…'))
            {
                return Err(format!("cut to {} bytes ending {:?}", t.len(), t.chars().last()));
            }
        }
        let short = WireText::from("short");
        if short != "short" {
            return Err(format!("a short text changed: {short}"));
        }
        Ok(())
    }
}

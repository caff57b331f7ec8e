//! Values that a command line spells as text, read and written by serde the same way: in a
//! settings file a value may be the flag's text (`"1,2.5"`, `"auto"`) or the native value
//! (`[1.0, 2.5]`, `2`), and either goes through the type's `FromStr`, the parser a flag uses;
//! it is written back as its `Display` text, so a value round-trips through TOML and JSON.

use std::fmt::{self, Display};
use std::marker::PhantomData;
use std::str::FromStr;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Serialize, Serializer};

/// One scalar as text: a string, a boolean or a number written out.
struct Text;

impl Visitor<'_> for Text {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string or a number")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }
}

/// An element of a list, as text.
struct TextItem(String);

impl<'de> de::Deserialize<'de> for TextItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Text).map(TextItem)
    }
}

fn parsed<T: FromStr, E: de::Error>(text: &str) -> Result<T, E>
where
    T::Err: Display,
{
    text.trim().parse().map_err(|e| E::custom(format!("'{}': {e}", text.trim())))
}

/// A list: an array, or the comma-separated text the flag takes.
struct List<T>(PhantomData<T>);

impl<'de, T: FromStr> Visitor<'de> for List<T>
where
    T::Err: Display,
{
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array or a comma-separated string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<T>, E> {
        v.split(',').filter(|s| !s.trim().is_empty()).map(parsed).collect()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::new();
        while let Some(TextItem(item)) = seq.next_element()? {
            out.push(parsed(&item)?);
        }
        Ok(out)
    }
}

/// A value stored as its text (`Display` out, `FromStr` in).
pub mod one {
    use super::*;

    /// Writes `v` as its text.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    /// Reads a string or a number through `T`'s `FromStr`.
    ///
    /// # Errors
    /// A value of another type, or text `T` does not parse (quoted in the message).
    pub fn deserialize<'de, D: Deserializer<'de>, T: FromStr>(d: D) -> Result<T, D::Error>
    where
        T::Err: Display,
    {
        parsed(&d.deserialize_any(Text)?)
    }
}

/// A list stored as its elements' text.
pub mod seq {
    use super::*;

    /// Writes `v` as an array of its elements' text.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<T: Display, S: Serializer>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
        let texts: Vec<String> = v.iter().map(ToString::to_string).collect();
        texts.serialize(s)
    }

    /// Reads an array, or the comma-separated text, each element through `T`'s `FromStr`.
    ///
    /// # Errors
    /// As [`one::deserialize`], per element.
    pub fn deserialize<'de, D: Deserializer<'de>, T: FromStr>(d: D) -> Result<Vec<T>, D::Error>
    where
        T::Err: Display,
    {
        d.deserialize_any(List(PhantomData))
    }
}

/// An optional value stored as its text ([`one`] when set).
pub mod optional {
    use super::*;

    /// Writes the value's text, or nothing.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<T: Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    /// As [`one::deserialize`], the value set.
    ///
    /// # Errors
    /// As [`one::deserialize`].
    pub fn deserialize<'de, D: Deserializer<'de>, T: FromStr>(d: D) -> Result<Option<T>, D::Error>
    where
        T::Err: Display,
    {
        one::deserialize(d).map(Some)
    }
}

/// An optional list stored as its elements' text ([`seq`] when set).
pub mod list {
    use super::*;

    /// Writes the elements' text, or nothing.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<T: Display, S: Serializer>(
        v: &Option<Vec<T>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => seq::serialize(v, s),
            None => s.serialize_none(),
        }
    }

    /// As [`seq::deserialize`], the list set.
    ///
    /// # Errors
    /// As [`seq::deserialize`].
    pub fn deserialize<'de, D: Deserializer<'de>, T: FromStr>(
        d: D,
    ) -> Result<Option<Vec<T>>, D::Error>
    where
        T::Err: Display,
    {
        seq::deserialize(d).map(Some)
    }
}

//! A strict reader of the Prometheus text exposition format (0.0.4), for tests: every sample's
//! family declared by a `# TYPE` line before it, families contiguous, names, labels, escapes and
//! values well formed, no series twice, a final newline.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

/// Every series (`name{labels as written}`) with its value, or what is wrong, with the line.
pub(crate) fn parse(text: &str) -> Result<BTreeMap<String, f64>, String> {
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the text does not end with a newline".into());
    }
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut helped: BTreeSet<String> = BTreeSet::new();
    let mut closed: BTreeSet<String> = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut series = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let at = |why: String| format!("line {}: {why}: {line:?}", i + 1);
        if line.is_empty() {
            continue;
        }
        let mut enter = |name: &str, current: &mut Option<String>| -> Result<(), String> {
            if current.as_deref() != Some(name) {
                if closed.contains(name) {
                    return Err(format!("family {name} continues after another one"));
                }
                if let Some(prev) = current.take() {
                    closed.insert(prev);
                }
                *current = Some(name.to_owned());
            }
            Ok(())
        };
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, _help) = rest.split_once(' ').unwrap_or((rest, ""));
            check_name(name).map_err(at)?;
            if !helped.insert(name.to_owned()) {
                return Err(at("HELP given twice".into()));
            }
            enter(name, &mut current).map_err(at)?;
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) =
                rest.split_once(' ').ok_or_else(|| at("TYPE without a type".into()))?;
            check_name(name).map_err(at)?;
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(at(format!("unknown type {kind}")));
            }
            if types.insert(name.to_owned(), kind.to_owned()).is_some() {
                return Err(at("TYPE given twice".into()));
            }
            if series.keys().any(|k: &String| family_of(k, &types) == name) {
                return Err(at("TYPE after samples of the family".into()));
            }
            enter(name, &mut current).map_err(at)?;
        } else if line.starts_with('#') {
            continue;
        } else {
            let (key, value) = sample(line).map_err(at)?;
            let family = family_of(&key, &types);
            if !types.contains_key(&family) {
                return Err(at(format!("no TYPE for {family}")));
            }
            if current.as_deref() != Some(family.as_str()) {
                return Err(at(format!("sample of {family} outside its family")));
            }
            if series.insert(key, value).is_some() {
                return Err(at("series given twice".into()));
            }
        }
    }
    Ok(series)
}

/// The family a series belongs to (`_bucket`, `_sum`, `_count` of histograms and summaries).
fn family_of(key: &str, types: &BTreeMap<String, String>) -> String {
    let name = key.split('{').next().unwrap_or(key);
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && types.get(base).is_some_and(|t| t == "histogram" || t == "summary")
        {
            return base.to_owned();
        }
    }
    name.to_owned()
}

fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        Ok(())
    } else {
        Err(format!("bad metric name {name:?}"))
    }
}

/// `name{labels} value [timestamp]` to (`name{labels}`, value).
fn sample(line: &str) -> Result<(String, f64), String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    check_name(name)?;
    let mut rest = &line[name_end..];
    let mut key = name.to_owned();
    if rest.starts_with('{') {
        let end = labels_end(rest)?;
        key.push_str(&rest[..end]);
        rest = &rest[end..];
    }
    let rest = rest.strip_prefix(' ').ok_or("no space before the value")?;
    let mut parts = rest.split(' ');
    let value = parts.next().ok_or("no value")?;
    let value = match value {
        "NaN" => f64::NAN,
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse::<f64>().ok().filter(|x| x.is_finite()).ok_or(format!("bad value {v:?}"))?,
    };
    if let Some(ts) = parts.next() {
        ts.parse::<i64>().map_err(|_| format!("bad timestamp {ts:?}"))?;
    }
    if parts.next().is_some() {
        return Err("text after the timestamp".into());
    }
    Ok((key, value))
}

/// The length of `{a="x",b="y"}` at the start of `text`, checking names and escapes.
fn labels_end(text: &str) -> Result<usize, String> {
    let bytes = text.as_bytes();
    let mut i = 1;
    let mut names = BTreeSet::new();
    if bytes.get(i) == Some(&b'}') {
        return Ok(i + 1);
    }
    loop {
        let start = i;
        while bytes.get(i).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_') {
            i += 1;
        }
        let label = &text[start..i];
        if label.is_empty() || label.as_bytes()[0].is_ascii_digit() {
            return Err(format!("bad label name {label:?}"));
        }
        if !names.insert(label) {
            return Err(format!("label {label} given twice"));
        }
        if bytes.get(i) != Some(&b'=') || bytes.get(i + 1) != Some(&b'"') {
            return Err(format!("label {label} without =\"value\""));
        }
        i += 2;
        loop {
            match bytes.get(i) {
                None => return Err("unterminated label value".into()),
                Some(b'"') => break,
                Some(b'\\') => match bytes.get(i + 1) {
                    Some(b'\\' | b'"' | b'n') => i += 2,
                    _ => return Err("bad escape in a label value".into()),
                },
                Some(b'\n') => return Err("newline in a label value".into()),
                Some(_) => i += 1,
            }
        }
        i += 1;
        match bytes.get(i) {
            Some(b',') if bytes.get(i + 1) == Some(&b'}') => return Ok(i + 2),
            Some(b',') => i += 1,
            Some(b'}') => return Ok(i + 1),
            _ => return Err("label set not closed".into()),
        }
    }
}

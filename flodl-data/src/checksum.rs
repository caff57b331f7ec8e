//! Sha256 checks of files against a `SHA256SUMS` listing (`<hex digest>  <file name>` lines).

use std::path::Path;

use crate::error::{Error, Result};

/// The digest `sums` lists for `file` (lowercased).
///
/// # Errors
/// [`Error::Io`] when `sums` cannot be read, [`Error::MissingChecksum`] when it lists no digest
/// for `file`.
pub(crate) fn listed_sha256(sums: &Path, file: &str) -> Result<String> {
    let text = std::fs::read_to_string(sums)
        .map_err(|source| Error::Io { path: sums.to_owned(), source })?;
    text.lines()
        .filter_map(|line| {
            let (digest, name) = line.trim().split_once(char::is_whitespace)?;
            // `sha256sum` marks binary mode with a leading '*'.
            let name = name.trim_start().trim_start_matches('*');
            (name == file).then(|| digest.to_ascii_lowercase())
        })
        .next()
        .ok_or_else(|| Error::MissingChecksum { sums: sums.to_owned(), file: file.to_owned() })
}

/// Checks `found`, the sha256 of the file at `path` (lowercase hex), against the digest `sums`
/// lists for its file name.
///
/// # Errors
/// As [`listed_sha256`], plus [`Error::Checksum`] when the digests differ.
pub(crate) fn verify(found: &str, path: &Path, sums: &Path) -> Result<()> {
    let file = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let expected = listed_sha256(sums, &file)?;
    if found != expected {
        return Err(Error::Checksum { path: path.to_owned(), expected, found: found.to_owned() });
    }
    Ok(())
}

//! The idx file format (MNIST's): a big-endian header of magic and dimensions, then raw u8 data.

use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;

use crate::error::{Error, Result};

/// Magic of an idx file of u8 values with three dimensions (images).
pub(crate) const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic of an idx file of u8 values with one dimension (labels).
pub(crate) const LABELS_MAGIC: u32 = 0x0000_0801;

/// Side of an MNIST image in pixels.
pub(crate) const IMAGE_SIDE: u32 = 28;

const CHUNK: usize = 1 << 16;

/// A reader over the decompressed bytes of a file held in memory (gzip detected by its magic).
fn open(bytes: &[u8]) -> Box<dyn Read + '_> {
    if bytes.starts_with(&[0x1f, 0x8b]) { Box::new(GzDecoder::new(bytes)) } else { Box::new(bytes) }
}

/// Uncompressed size hint: the gzip trailer's ISIZE (size mod 2^32), or the length of raw data.
fn size_hint(bytes: &[u8]) -> usize {
    if bytes.starts_with(&[0x1f, 0x8b]) && bytes.len() >= 4 {
        let t = &bytes[bytes.len() - 4..];
        u32::from_le_bytes([t[0], t[1], t[2], t[3]]) as usize
    } else {
        bytes.len()
    }
}

/// Reads as many bytes as `buf` holds or until the end; returns the count.
fn fill(r: &mut dyn Read, buf: &mut [u8], path: &Path) -> Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(Error::Decompress { path: path.to_owned(), source });
            }
        }
    }
    Ok(n)
}

/// Reads the header (magic and `ndims` dimensions) and checks the magic.
fn header(r: &mut dyn Read, path: &Path, magic: u32) -> Result<Vec<u32>> {
    let ndims = (magic & 0xff) as usize;
    let mut head = vec![0u8; 4 + 4 * ndims];
    let got = fill(r, &mut head, path)?;
    if got < 4 {
        return Err(Error::WrongLength {
            path: path.to_owned(),
            expected: head.len() as u64,
            found: got as u64,
        });
    }
    let found = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    if found != magic {
        return Err(Error::BadMagic { path: path.to_owned(), found, expected: magic });
    }
    if got < head.len() {
        return Err(Error::WrongLength {
            path: path.to_owned(),
            expected: head.len() as u64,
            found: got as u64,
        });
    }
    Ok(head[4..].chunks_exact(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Streams exactly `expected` data bytes through `sink` in chunks, then checks nothing follows.
fn stream_data(
    r: &mut dyn Read,
    path: &Path,
    expected: u64,
    mut sink: impl FnMut(&[u8]),
) -> Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    while total < expected {
        let want = (expected - total).min(CHUNK as u64) as usize;
        let n = fill(r, &mut buf[..want], path)?;
        sink(&buf[..n]);
        total += n as u64;
        if n < want {
            return Err(Error::WrongLength { path: path.to_owned(), expected, found: total });
        }
    }
    if fill(r, &mut buf[..1], path)? != 0 {
        return Err(Error::WrongLength { path: path.to_owned(), expected, found: expected + 1 });
    }
    Ok(())
}

/// Decodes an idx image file (`bytes`, gzipped or raw) of `[n, 28, 28]` u8 pixels into f32
/// values in `[0, 1]` (pixel / 255), converting while decompressing. Returns `n` and the values.
///
/// # Errors
/// [`Error::Decompress`], [`Error::BadMagic`], [`Error::BadDims`] or [`Error::WrongLength`],
/// each naming `path`.
pub(crate) fn read_images(bytes: &[u8], path: &Path) -> Result<(usize, Vec<f32>)> {
    let side = IMAGE_SIDE;
    let mut r = open(bytes);
    let dims = header(&mut *r, path, IMAGES_MAGIC)?;
    if dims[1] != side || dims[2] != side {
        return Err(Error::BadDims { path: path.to_owned(), found: dims, expected: "[n, 28, 28]" });
    }
    let n = dims[0] as usize;
    let expected = u64::from(dims[0]) * u64::from(side) * u64::from(side);
    // Never trust the header for the allocation: a forged count would ask for terabytes.
    let capacity = (expected as usize).min(size_hint(bytes));
    let mut values: Vec<f32> = Vec::with_capacity(capacity);
    stream_data(&mut *r, path, expected, |chunk| {
        values.extend(chunk.iter().map(|&b| f32::from(b) / 255.0));
    })?;
    Ok((n, values))
}

/// Decodes an idx label file (`bytes`, gzipped or raw) of `[n]` u8 labels, each below `classes`.
///
/// # Errors
/// [`Error::Decompress`], [`Error::BadMagic`], [`Error::WrongLength`] or [`Error::BadLabel`],
/// each naming `path`.
pub(crate) fn read_labels(bytes: &[u8], path: &Path, classes: u8) -> Result<Vec<i32>> {
    let mut r = open(bytes);
    let dims = header(&mut *r, path, LABELS_MAGIC)?;
    let expected = u64::from(dims[0]);
    let mut raw: Vec<u8> = Vec::with_capacity((expected as usize).min(size_hint(bytes)));
    stream_data(&mut *r, path, expected, |chunk| raw.extend_from_slice(chunk))?;
    if let Some((index, &label)) = raw.iter().enumerate().find(|(_, l)| **l >= classes) {
        return Err(Error::BadLabel { path: path.to_owned(), index, label, classes });
    }
    Ok(raw.into_iter().map(i32::from).collect())
}

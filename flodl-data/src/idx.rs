//! The idx file format (MNIST's): a big-endian header of magic and dimensions, then raw u8 data.
//!
//! Files are read as a stream (never whole into memory), gzip detected by its magic. Nothing a
//! file declares is trusted for an allocation before it is checked: the header's data size must
//! be one the file can honestly hold (its exact remainder for a raw file; at most the deflate
//! format's largest expansion of its length for a gzipped one) and at most [`MAX_DATA_BYTES`];
//! the gzip trailer's size is never read for a size (the decoder checks it at the end). So a
//! lying header or trailer, or a gzip bomb, is a typed error naming the file, and the memory
//! asked for grows with the bytes that really arrive.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use flate2::bufread::GzDecoder;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Magic of an idx file of u8 values with three dimensions (images).
pub(crate) const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic of an idx file of u8 values with one dimension (labels).
pub(crate) const LABELS_MAGIC: u32 = 0x0000_0801;

/// Side of an MNIST image in pixels.
pub(crate) const IMAGE_SIDE: u32 = 28;

/// The most data bytes an idx file may declare: 1 GiB, about 1.37 million 28 × 28 images
/// (MNIST's training set is 47 MB).
pub const MAX_DATA_BYTES: u64 = 1 << 30;

/// The most a deflate stream can expand its input (a 258-byte match per 2 bits at best, so
/// just under 1032:1); a gzipped file declaring more data than this times its length lies.
const MAX_DEFLATE_RATIO: u64 = 1032;

/// Bytes moved per read.
const CHUNK: usize = 1 << 16;

/// The data of one idx file: its dimensions and its u8 values.
#[derive(Debug)]
pub(crate) struct IdxData {
    /// The header's dimensions.
    pub(crate) dims: Vec<u32>,
    /// The values, as many as the dimensions' product.
    pub(crate) values: Vec<u8>,
}

/// What reading an idx file gave: its data or why not, and the sha256 of all its bytes when it
/// was asked for and the file could be read to its end (always when `data` is `Ok`; a checksum that fails explains a
/// decoding error best, so the caller looks at it first).
#[derive(Debug)]
pub(crate) struct Reading {
    /// The data, or the first error.
    pub(crate) data: Result<IdxData>,
    /// Lowercase hex sha256 of the file.
    pub(crate) sha256: Option<String>,
}

/// A reader that feeds every byte it passes through a hash (when there is one).
struct Hashing<R> {
    inner: R,
    /// The file's length in bytes.
    len: u64,
    hash: Option<Sha256>,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(h) = &mut self.hash {
            h.update(&buf[..n]);
        }
        Ok(n)
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

/// Checks that `declared` data bytes are ones the file (`file_len` bytes, header `head` bytes,
/// gzipped or not) can honestly hold, and at most [`MAX_DATA_BYTES`].
fn check_declared(path: &Path, declared: u64, file_len: u64, head: u64, gzip: bool) -> Result<()> {
    if declared > MAX_DATA_BYTES {
        return Err(Error::DeclaredTooLarge {
            path: path.to_owned(),
            declared,
            most: MAX_DATA_BYTES,
            reason: "the most an idx file may hold",
        });
    }
    if gzip {
        let most = file_len.saturating_mul(MAX_DEFLATE_RATIO);
        if declared.saturating_add(head) > most {
            return Err(Error::DeclaredTooLarge {
                path: path.to_owned(),
                declared,
                most,
                reason: "the most deflate can expand a file of this length",
            });
        }
    } else if file_len.checked_sub(head) != Some(declared) {
        return Err(Error::WrongLength {
            path: path.to_owned(),
            expected: declared,
            found: file_len.saturating_sub(head),
        });
    }
    Ok(())
}

/// Reads the idx file at `path` whose magic must be `magic`, with `check_dims` vetting the
/// dimensions before any data is read; `hash` asks for the file's sha256 too.
///
/// The data's errors: [`Error::Io`], [`Error::Decompress`], [`Error::BadMagic`],
/// [`Error::BadDims`], [`Error::DeclaredTooLarge`] or [`Error::WrongLength`], each naming `path`.
pub(crate) fn read(
    path: &Path,
    magic: u32,
    check_dims: impl FnOnce(&[u32]) -> Result<()>,
    hash: bool,
) -> Reading {
    let io = |source| Error::Io { path: path.to_owned(), source };
    let opened = File::open(path).and_then(|f| Ok((f.metadata()?.len(), f)));
    let (len, file) = match opened {
        Ok(opened) => opened,
        Err(e) => return Reading { data: Err(io(e)), sha256: None },
    };
    let mut raw = BufReader::new(Hashing { inner: file, len, hash: hash.then(Sha256::new) });
    let data = decode(&mut raw, path, magic, check_dims);
    // What the decoder left unread (nothing for a sound file) still counts for the checksum.
    match std::io::copy(&mut raw, &mut std::io::sink()) {
        Ok(_) => {
            let hash = raw.into_inner().hash;
            let sha256 = hash.map(|h| h.finalize().iter().map(|b| format!("{b:02x}")).collect());
            Reading { data, sha256 }
        }
        Err(e) => Reading { data: data.and(Err(io(e))), sha256: None },
    }
}

/// Decodes the idx stream `raw` (the file at `path`, gzipped or not).
fn decode<R: Read>(
    raw: &mut BufReader<Hashing<R>>,
    path: &Path,
    magic: u32,
    check_dims: impl FnOnce(&[u32]) -> Result<()>,
) -> Result<IdxData> {
    let io = |source| Error::Io { path: path.to_owned(), source };
    let file_len = raw.get_ref().len;
    let gzip = raw.fill_buf().map_err(io)?.starts_with(&[0x1f, 0x8b]);
    let mut data: Box<dyn Read + '_> =
        if gzip { Box::new(GzDecoder::new(&mut *raw)) } else { Box::new(&mut *raw) };
    let dims = header(&mut *data, path, magic)?;
    check_dims(&dims)?;
    let declared =
        dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(u64::from(d))).unwrap_or(u64::MAX);
    let head = 4 + 4 * dims.len() as u64;
    check_declared(path, declared, file_len, head, gzip)?;
    // Grown as data arrives: the first reservation is bounded by the file's own length.
    let mut values: Vec<u8> = Vec::with_capacity(declared.min(file_len.saturating_mul(8)) as usize);
    let mut buf = vec![0u8; CHUNK];
    while (values.len() as u64) < declared {
        let want = (declared - values.len() as u64).min(CHUNK as u64) as usize;
        let n = fill(&mut *data, &mut buf[..want], path)?;
        values.extend_from_slice(&buf[..n]);
        if n < want {
            let found = values.len() as u64;
            return Err(Error::WrongLength { path: path.to_owned(), expected: declared, found });
        }
    }
    if fill(&mut *data, &mut buf[..1], path)? != 0 {
        return Err(Error::WrongLength {
            path: path.to_owned(),
            expected: declared,
            found: declared + 1,
        });
    }
    Ok(IdxData { dims, values })
}

/// Reads an idx image file of `[n, 28, 28]` u8 pixels.
///
/// The data's errors are [`read`]'s; [`Error::BadDims`] for other image sides.
pub(crate) fn read_images(path: &Path, hash: bool) -> Reading {
    let side = IMAGE_SIDE;
    read(
        path,
        IMAGES_MAGIC,
        |dims| {
            if dims[1] != side || dims[2] != side {
                return Err(Error::BadDims {
                    path: path.to_owned(),
                    found: dims.to_vec(),
                    expected: "[n, 28, 28]",
                });
            }
            Ok(())
        },
        hash,
    )
}

/// Reads an idx label file of `[n]` u8 labels, each below `classes`.
///
/// The data's errors are [`read`]'s; [`Error::BadLabel`] for a label not below `classes`.
pub(crate) fn read_labels(path: &Path, classes: u8, hash: bool) -> Reading {
    let mut reading = read(path, LABELS_MAGIC, |_| Ok(()), hash);
    if let Ok(data) = &reading.data
        && let Some((index, &label)) = data.values.iter().enumerate().find(|(_, l)| **l >= classes)
    {
        reading.data = Err(Error::BadLabel { path: path.to_owned(), index, label, classes });
    }
    reading
}

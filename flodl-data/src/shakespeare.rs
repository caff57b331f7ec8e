//! Shakespeare's plays as bytes: the text corpus vendored with flodl, split by play.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flate2::read::GzDecoder;

use crate::byte_windows::ByteWindows;
use crate::checksum;
use crate::error::{Error, Result};
use crate::mnist::Verify;

/// Which part of the corpus to load; the split is fixed by play (see `data/shakespeare/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TextSplit {
    /// The 36 training plays (`train.txt[.gz]`, 5,025,998 bytes).
    Train,
    /// The 2 held-out plays, The Tempest and Hamlet (`valid.txt[.gz]`, 292,860 bytes).
    Valid,
}

impl TextSplit {
    fn stem(self) -> &'static str {
        match self {
            TextSplit::Train => "train.txt",
            TextSplit::Valid => "valid.txt",
        }
    }
}

/// The environment variable that overrides [`Shakespeare::vendored_dir`].
pub const SHAKESPEARE_DIR_ENV: &str = "FLODL_SHAKESPEARE_DIR";

/// The bytes of one split of the Shakespeare corpus, in host memory.
#[derive(Debug, Clone)]
pub struct Shakespeare {
    bytes: Arc<[u8]>,
    split: TextSplit,
}

impl Shakespeare {
    /// The directory of the corpus vendored with flodl (`data/shakespeare/` at the workspace
    /// root), or the value of `FLODL_SHAKESPEARE_DIR` when it is set and not empty.
    pub fn vendored_dir() -> PathBuf {
        match std::env::var_os(SHAKESPEARE_DIR_ENV) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/shakespeare"),
        }
    }

    /// Loads `split` from `dir`, which holds `train.txt[.gz]` / `valid.txt[.gz]` (the `.gz` file
    /// is used when both exist) and, for [`Verify::Sha256`], `SHA256SUMS`. The file is checked
    /// before it is decompressed.
    ///
    /// # Errors
    /// [`Error::Io`] for a missing or unreadable file; [`Error::Checksum`] or
    /// [`Error::MissingChecksum`] under [`Verify::Sha256`]; [`Error::Decompress`] for a corrupt
    /// gzip stream. Every error names the file.
    pub fn load(dir: impl AsRef<Path>, split: TextSplit, verify: Verify) -> Result<Self> {
        let dir = dir.as_ref();
        let gz = dir.join(format!("{}.gz", split.stem()));
        let path = if gz.is_file() { gz } else { dir.join(split.stem()) };
        let raw =
            std::fs::read(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
        if verify == Verify::Sha256 {
            checksum::verify(&raw, &path, &dir.join("SHA256SUMS"))?;
        }
        let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
            let mut out = Vec::with_capacity(raw.len() * 3);
            GzDecoder::new(&raw[..])
                .read_to_end(&mut out)
                .map_err(|source| Error::Decompress { path: path.clone(), source })?;
            out
        } else {
            raw
        };
        Ok(Self { bytes: bytes.into(), split })
    }

    /// Loads `split` from the vendored directory with its checksums verified.
    ///
    /// # Errors
    /// As [`Shakespeare::load`].
    pub fn vendored(split: TextSplit) -> Result<Self> {
        Self::load(Self::vendored_dir(), split, Verify::Sha256)
    }

    /// The split loaded.
    pub fn split(&self) -> TextSplit {
        self.split
    }

    /// The text, byte for byte.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The text as a dataset of token windows of `context + 1` bytes (see [`ByteWindows`]).
    ///
    /// # Errors
    /// As [`ByteWindows::new`].
    pub fn windows(&self, context: usize) -> Result<ByteWindows> {
        ByteWindows::new(Arc::clone(&self.bytes), context)
    }
}

//! The binary bundle format: header, bincode metadata, raw tensor data, sha256 checksum.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::bundle::{Checkpoint, MAX_META_BYTES, OpaqueState, RngStream, SaveReason};
use super::config_hash::ConfigHash;
use super::coverage::EpochCoverage;
use super::dtype::StoredDType;
use super::error::{CheckpointError, Result};
use super::record::{TensorRecord, TensorSet, byte_len};

/// The eight bytes every bundle starts with.
pub const MAGIC: [u8; 8] = [0x89, b'F', b'D', b'L', b'C', b'K', b'\r', b'\n'];
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Size of the fixed header in bytes.
pub const HEADER_LEN: usize = 64;

/// Bytes of the header covered by the checksum (everything before the checksum field).
const HASHED_HEADER_LEN: usize = 32;

/// Ceilings a reader applies to declared lengths before allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// Largest whole bundle accepted, in bytes.
    pub max_bundle_bytes: u64,
}

impl Default for ReadLimits {
    /// 256 GiB.
    fn default() -> Self {
        ReadLimits { max_bundle_bytes: 256 << 30 }
    }
}

/// A tensor's entry in the metadata; its bytes live in the data section.
#[derive(Debug, Serialize, Deserialize)]
struct TensorDesc {
    name: String,
    dtype: StoredDType,
    shape: Vec<usize>,
}

/// The metadata section as serialised.
#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    reason: SaveReason,
    global_step: u64,
    epoch: u64,
    reduce_version: u64,
    world_size: usize,
    config_hash: ConfigHash,
    params: Vec<TensorDesc>,
    buffers: Vec<TensorDesc>,
    optimizer: Vec<Vec<TensorDesc>>,
    outer: Vec<TensorDesc>,
    elche: Option<OpaqueState>,
    coverage: Vec<EpochCoverage>,
    rng: Vec<RngStream>,
    extras: BTreeMap<String, OpaqueState>,
}

fn descs(set: &TensorSet) -> Vec<TensorDesc> {
    set.records()
        .iter()
        .map(|r| TensorDesc {
            name: r.name().to_string(),
            dtype: r.dtype(),
            shape: r.shape().to_vec(),
        })
        .collect()
}

/// A checkpoint laid out for writing: the header, the metadata bytes and the tensor slices.
#[derive(Debug)]
pub(crate) struct Encoded<'a> {
    header: [u8; HEADER_LEN],
    meta: Vec<u8>,
    data: Vec<&'a [u8]>,
}

impl<'a> Encoded<'a> {
    /// Lays out `ckpt` (validated first) and computes its checksum.
    pub(crate) fn new(ckpt: &'a Checkpoint) -> Result<Self> {
        ckpt.validate()?;
        let meta = Meta {
            reason: ckpt.reason.clone(),
            global_step: ckpt.global_step,
            epoch: ckpt.epoch,
            reduce_version: ckpt.reduce_version,
            world_size: ckpt.world_size,
            config_hash: ckpt.config_hash,
            params: descs(&ckpt.params),
            buffers: descs(&ckpt.buffers),
            optimizer: ckpt.optimizer.iter().map(descs).collect(),
            outer: descs(&ckpt.outer),
            elche: ckpt.elche.clone(),
            coverage: ckpt.coverage.clone(),
            rng: ckpt.rng.clone(),
            extras: ckpt.extras.clone(),
        };
        let meta = bincode::serde::encode_to_vec(&meta, bincode::config::standard())
            .map_err(|source| CheckpointError::Encode { what: "metadata", source })?;
        if meta.len() as u64 > MAX_META_BYTES {
            return Err(CheckpointError::TooLarge {
                what: "metadata",
                declared: meta.len() as u64,
                limit: MAX_META_BYTES,
            });
        }
        let data: Vec<&[u8]> = std::iter::once(&ckpt.params)
            .chain(std::iter::once(&ckpt.buffers))
            .chain(&ckpt.optimizer)
            .chain(std::iter::once(&ckpt.outer))
            .flat_map(|set| set.records().iter().map(TensorRecord::data))
            .collect();
        let data_len: u64 = data.iter().map(|d| d.len() as u64).sum();

        let mut header = [0u8; HEADER_LEN];
        header[0..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        // 12..16 reserved, zero.
        header[16..24].copy_from_slice(&(meta.len() as u64).to_le_bytes());
        header[24..32].copy_from_slice(&data_len.to_le_bytes());
        let mut hasher = Sha256::new();
        hasher.update(&header[..HASHED_HEADER_LEN]);
        hasher.update(&meta);
        data.iter().for_each(|d| hasher.update(d));
        let digest: [u8; 32] = hasher.finalize().into();
        header[32..64].copy_from_slice(&digest);
        Ok(Encoded { header, meta, data })
    }

    /// Total bundle length in bytes.
    pub(crate) fn len(&self) -> usize {
        HEADER_LEN + self.meta.len() + self.data.iter().map(|d| d.len()).sum::<usize>()
    }

    /// Writes the header and the metadata.
    pub(crate) fn write_head(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.header)?;
        w.write_all(&self.meta)
    }

    /// Writes the tensor data.
    pub(crate) fn write_data(&self, w: &mut impl Write) -> std::io::Result<()> {
        self.data.iter().try_for_each(|d| w.write_all(d))
    }

    /// The whole bundle as one buffer.
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        out.extend_from_slice(&self.header);
        out.extend_from_slice(&self.meta);
        self.data.iter().for_each(|d| out.extend_from_slice(d));
        out
    }
}

/// The header fields after the fixed checks.
#[derive(Debug, Clone, Copy)]
struct Header {
    meta_len: u64,
    data_len: u64,
    checksum: [u8; 32],
}

impl Header {
    fn total(&self) -> u64 {
        HEADER_LEN as u64 + self.meta_len + self.data_len
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Checks magic, version and declared lengths of a bundle of `actual` bytes.
fn parse_header(head: &[u8; HEADER_LEN], actual: u64, limits: ReadLimits) -> Result<Header> {
    let mut magic = [0u8; 8];
    magic.copy_from_slice(&head[0..8]);
    if magic != MAGIC {
        return Err(CheckpointError::BadMagic { found: magic });
    }
    let version = u32_at(head, 8);
    if version != FORMAT_VERSION {
        return Err(CheckpointError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let meta_len = u64_at(head, 16);
    let data_len = u64_at(head, 24);
    if meta_len > MAX_META_BYTES {
        return Err(CheckpointError::TooLarge {
            what: "metadata",
            declared: meta_len,
            limit: MAX_META_BYTES,
        });
    }
    let total = data_len
        .checked_add(meta_len + HEADER_LEN as u64)
        .filter(|&t| t <= limits.max_bundle_bytes)
        .ok_or(CheckpointError::TooLarge {
            what: "bundle",
            declared: data_len.saturating_add(meta_len + HEADER_LEN as u64),
            limit: limits.max_bundle_bytes,
        })?;
    if actual < total {
        return Err(CheckpointError::Truncated { expected: total, actual });
    }
    if actual > total {
        return Err(CheckpointError::TrailingBytes { expected: total, actual });
    }
    let mut checksum = [0u8; 32];
    checksum.copy_from_slice(&head[32..64]);
    Ok(Header { meta_len, data_len, checksum })
}

fn header_of(bytes: &[u8]) -> Result<[u8; HEADER_LEN]> {
    let too_short =
        || CheckpointError::Truncated { expected: HEADER_LEN as u64, actual: bytes.len() as u64 };
    bytes.get(..HEADER_LEN).ok_or_else(too_short)?.try_into().map_err(|_| too_short())
}

/// Verifies the checksum and rebuilds the checkpoint from `payload` (metadata then data).
fn decode_payload(head: &[u8; HEADER_LEN], header: Header, payload: &[u8]) -> Result<Checkpoint> {
    let mut hasher = Sha256::new();
    hasher.update(&head[..HASHED_HEADER_LEN]);
    hasher.update(payload);
    let digest: [u8; 32] = hasher.finalize().into();
    if digest != header.checksum {
        return Err(CheckpointError::ChecksumMismatch);
    }
    if u32_at(head, 12) != 0 {
        return Err(CheckpointError::malformed("reserved header field is not zero"));
    }
    // The lengths were checked against the buffer size, which fits in memory.
    let meta_len = header.meta_len as usize;
    let (meta_bytes, data) = payload.split_at(meta_len);
    let (meta, used): (Meta, usize) = bincode::serde::decode_from_slice(
        meta_bytes,
        bincode::config::standard().with_limit::<{ MAX_META_BYTES as usize }>(),
    )
    .map_err(|source| CheckpointError::Decode { what: "metadata", source })?;
    if used != meta_len {
        return Err(CheckpointError::malformed(format!(
            "metadata uses {used} of its {meta_len} bytes"
        )));
    }
    let mut cursor = 0usize;
    let mut take_set = |descs: Vec<TensorDesc>| -> Result<TensorSet> {
        let mut set = TensorSet::new();
        for d in descs {
            let n = byte_len(&d.shape, d.dtype).filter(|&n| n <= data.len() - cursor).ok_or_else(
                || {
                    CheckpointError::malformed(format!(
                        "tensor {} ({} {:?}) overruns the data section",
                        d.name, d.dtype, d.shape
                    ))
                },
            )?;
            let bytes = data[cursor..cursor + n].to_vec();
            cursor += n;
            set.push(TensorRecord::from_le_bytes(d.name, d.dtype, d.shape, bytes)?)?;
        }
        Ok(set)
    };
    let params = take_set(meta.params)?;
    let buffers = take_set(meta.buffers)?;
    let optimizer = meta.optimizer.into_iter().map(&mut take_set).collect::<Result<Vec<_>>>()?;
    let outer = take_set(meta.outer)?;
    if cursor as u64 != header.data_len {
        return Err(CheckpointError::malformed(format!(
            "tensors use {cursor} of the {} data bytes",
            header.data_len
        )));
    }
    let ckpt = Checkpoint {
        reason: meta.reason,
        global_step: meta.global_step,
        epoch: meta.epoch,
        reduce_version: meta.reduce_version,
        world_size: meta.world_size,
        config_hash: meta.config_hash,
        params,
        buffers,
        optimizer,
        outer,
        elche: meta.elche,
        coverage: meta.coverage,
        rng: meta.rng,
        extras: meta.extras,
    };
    ckpt.validate()?;
    Ok(ckpt)
}

impl Checkpoint {
    /// Serialises the bundle (see the [module docs](super) for the layout).
    ///
    /// # Errors
    /// [`CheckpointError::Malformed`] / [`CheckpointError::RangeOutOfBounds`] when the value
    /// breaks an invariant, [`CheckpointError::TooLarge`] when the metadata exceeds
    /// [`MAX_META_BYTES`], [`CheckpointError::Encode`] when serialisation fails.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        Ok(Encoded::new(self)?.to_vec())
    }

    /// Deserialises and fully validates a bundle, with default [`ReadLimits`].
    ///
    /// # Errors
    /// Every integrity error of [`CheckpointError`]; nothing is returned unless the whole bundle
    /// is intact.
    pub fn from_bytes(bytes: &[u8]) -> Result<Checkpoint> {
        Self::from_bytes_with_limits(bytes, ReadLimits::default())
    }

    /// Deserialises and fully validates a bundle under `limits`.
    ///
    /// # Errors
    /// As [`Checkpoint::from_bytes`].
    pub fn from_bytes_with_limits(bytes: &[u8], limits: ReadLimits) -> Result<Checkpoint> {
        let head = header_of(bytes)?;
        let header = parse_header(&head, bytes.len() as u64, limits)?;
        decode_payload(&head, header, &bytes[HEADER_LEN..])
    }

    /// Reads and fully validates a bundle from `reader`, the contents of the file at `path`,
    /// which holds `actual_len` bytes. Declared lengths are checked against `limits` and
    /// `actual_len` before the payload buffer is allocated.
    pub(crate) fn read_from(
        reader: &mut impl Read,
        actual_len: u64,
        limits: ReadLimits,
        path: &Path,
    ) -> Result<Checkpoint> {
        let io_err = |e| CheckpointError::io(path, e);
        if actual_len < HEADER_LEN as u64 {
            return Err(CheckpointError::Truncated {
                expected: HEADER_LEN as u64,
                actual: actual_len,
            });
        }
        let mut head = [0u8; HEADER_LEN];
        reader.read_exact(&mut head).map_err(io_err)?;
        let header = parse_header(&head, actual_len, limits)?;
        let payload_len = usize::try_from(header.total() - HEADER_LEN as u64).map_err(|_| {
            CheckpointError::TooLarge {
                what: "bundle",
                declared: header.total(),
                limit: usize::MAX as u64,
            }
        })?;
        let mut payload = Vec::with_capacity(payload_len);
        reader.take(payload_len as u64).read_to_end(&mut payload).map_err(io_err)?;
        if payload.len() != payload_len {
            // The file shrank while being read.
            return Err(CheckpointError::Truncated {
                expected: header.total(),
                actual: (HEADER_LEN + payload.len()) as u64,
            });
        }
        decode_payload(&head, header, &payload)
    }
}

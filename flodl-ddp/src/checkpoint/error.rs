//! The checkpoint error type.

use std::path::PathBuf;

use super::config_hash::ConfigHash;
use super::dtype::StoredDType;

/// Everything that can go wrong while building, writing, reading or applying a checkpoint.
///
/// Integrity failures (`BadMagic`, `UnsupportedVersion`, `Truncated`, `TrailingBytes`,
/// `TooLarge`, `ChecksumMismatch`, `Decode`, `Malformed`) and compatibility failures
/// (`SignatureMismatch`, `WorldSizeMismatch`, `ConfigMismatch`) are reported before anything is
/// returned, so a failed load never yields a partial checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A filesystem operation failed (or a fault-injection hook stopped a save).
    #[error("checkpoint i/o on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the checkpoint magic number.
    #[error("not a flodl checkpoint (magic {found:02x?})")]
    BadMagic {
        /// The first eight bytes found.
        found: [u8; 8],
    },
    /// The format version is not one this build reads.
    #[error("unsupported checkpoint format version {found} (this build reads {supported})")]
    UnsupportedVersion {
        /// Version in the header.
        found: u32,
        /// Version this build reads and writes.
        supported: u32,
    },
    /// The bundle is shorter than its header says.
    #[error("truncated checkpoint: {expected} bytes expected, {actual} present")]
    Truncated {
        /// Bytes the header (or the fixed header size) requires.
        expected: u64,
        /// Bytes present.
        actual: u64,
    },
    /// The bundle is longer than its header says.
    #[error("checkpoint has {actual} bytes but its header declares {expected}")]
    TrailingBytes {
        /// Bytes the header declares.
        expected: u64,
        /// Bytes present.
        actual: u64,
    },
    /// A declared length exceeds the reader's ceiling (checked before allocating).
    #[error("checkpoint {what} declares {declared} bytes, over the limit of {limit}")]
    TooLarge {
        /// Which length (`"metadata"`, `"bundle"`).
        what: &'static str,
        /// Declared size in bytes.
        declared: u64,
        /// The ceiling in bytes.
        limit: u64,
    },
    /// The sha256 over header and payload does not match: the bundle is corrupt.
    #[error("checkpoint checksum mismatch: the bundle is corrupt")]
    ChecksumMismatch,
    /// A serialised section did not decode.
    #[error("checkpoint {what} does not decode: {source}")]
    Decode {
        /// Which part (`"metadata"`, `"opaque state"`).
        what: &'static str,
        /// The decoder's error.
        #[source]
        source: bincode::error::DecodeError,
    },
    /// Serialising a value failed.
    #[error("checkpoint {what} does not encode: {source}")]
    Encode {
        /// Which part.
        what: &'static str,
        /// The encoder's error.
        #[source]
        source: bincode::error::EncodeError,
    },
    /// The bundle decoded but is internally inconsistent, or a value given to build one is.
    #[error("malformed checkpoint: {reason}")]
    Malformed {
        /// What is inconsistent.
        reason: String,
    },
    /// The bundle was written for another model (parameter names, shapes or dtypes differ).
    #[error("checkpoint is for another model: {detail}")]
    SignatureMismatch {
        /// The first difference found.
        detail: String,
    },
    /// The bundle was written by a run with another world size.
    #[error("checkpoint world size {found} differs from this run's {expected}")]
    WorldSizeMismatch {
        /// This run's world size.
        expected: usize,
        /// The bundle's world size.
        found: usize,
    },
    /// The bundle was written by a run with another configuration.
    #[error("checkpoint configuration hash {found} differs from this run's {expected}")]
    ConfigMismatch {
        /// This run's configuration hash.
        expected: ConfigHash,
        /// The bundle's configuration hash.
        found: ConfigHash,
    },
    /// The bundle was written by a run with another setting that changes the maths of
    /// training (one of [`crate::ResumeTerms`]'s fields: model data, batch size, seed,
    /// schedule, policy, ...).
    #[error("checkpoint was saved with another {field}: {found}, this run has {expected}")]
    TermMismatch {
        /// The field of [`crate::ResumeTerms`] that differs (`"seed"`, `"batch_size"`, ...).
        field: &'static str,
        /// This run's value.
        expected: String,
        /// The bundle's value.
        found: String,
    },
    /// A restore target list does not have as many tensors as the stored set.
    #[error("{set}: {found} target tensors for {expected} stored")]
    CountMismatch {
        /// Which set (`"params"`, `"buffers"`, ...).
        set: String,
        /// Stored tensors.
        expected: usize,
        /// Target tensors given.
        found: usize,
    },
    /// A restore target has another shape or dtype than the stored tensor.
    #[error(
        "tensor {name}: stored {stored_dtype} {stored_shape:?}, target {target_dtype} {target_shape:?}"
    )]
    TensorMismatch {
        /// The stored tensor's name.
        name: String,
        /// Stored shape.
        stored_shape: Vec<usize>,
        /// Stored dtype.
        stored_dtype: StoredDType,
        /// Target shape.
        target_shape: Vec<usize>,
        /// Target dtype.
        target_dtype: StoredDType,
    },
    /// A sample range lies outside `0..total` (or its end overflows).
    #[error("sample range {offset}+{size} outside 0..{total}")]
    RangeOutOfBounds {
        /// Range start.
        offset: usize,
        /// Range length.
        size: usize,
        /// The epoch's sample count.
        total: usize,
    },
    /// No checkpoint exists in a directory.
    #[error("no checkpoint in {dir}")]
    NotFound {
        /// The directory searched.
        dir: PathBuf,
    },
    /// A checkpoint name is unusable as a file name.
    #[error("invalid checkpoint name {name:?}")]
    InvalidName {
        /// The rejected name.
        name: String,
    },
    /// A tensor operation (device copy) failed.
    #[error(transparent)]
    Tensor(#[from] flodl_tensor::Error),
}

/// Result alias for checkpoint operations.
pub type Result<T> = std::result::Result<T, CheckpointError>;

impl CheckpointError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CheckpointError::Io { path: path.into(), source }
    }

    pub(crate) fn malformed(reason: impl Into<String>) -> Self {
        CheckpointError::Malformed { reason: reason.into() }
    }
}

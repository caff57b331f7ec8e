//! The error type of flodl-data.

use std::path::PathBuf;

use flodl_tensor::DType;

/// Everything that can go wrong in the data plane.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // === Files ===
    /// A file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying failure.
        source: std::io::Error,
    },
    /// A gzip stream is corrupt or ends early.
    #[error("{path}: corrupt gzip stream: {source}")]
    Decompress {
        /// The file.
        path: PathBuf,
        /// The decoder's failure.
        source: std::io::Error,
    },
    /// An idx file starts with an unexpected magic number.
    #[error("{path}: bad idx magic {found:#010x}, expected {expected:#010x}")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The magic read from the file.
        found: u32,
        /// The magic the file kind requires.
        expected: u32,
    },
    /// An idx file declares dimensions that do not fit what it should hold.
    #[error("{path}: idx dimensions {found:?}, expected {expected}")]
    BadDims {
        /// The file.
        path: PathBuf,
        /// The dimensions read from the header.
        found: Vec<u32>,
        /// What the file kind requires, in words.
        expected: &'static str,
    },
    /// An idx file holds fewer or more data bytes than its header declares.
    #[error("{path}: header declares {expected} data bytes, file holds {found}")]
    WrongLength {
        /// The file.
        path: PathBuf,
        /// Data bytes the header declares.
        expected: u64,
        /// Data bytes actually present (counted up to one byte past `expected`).
        found: u64,
    },
    /// An image file and its label file disagree on the number of samples.
    #[error("{images} holds {image_count} images but {labels} holds {label_count} labels")]
    CountMismatch {
        /// The image file.
        images: PathBuf,
        /// Images it holds.
        image_count: usize,
        /// The label file.
        labels: PathBuf,
        /// Labels it holds.
        label_count: usize,
    },
    /// A label lies outside the classes of the dataset.
    #[error("{path}: label {label} at index {index} is outside 0..{classes}")]
    BadLabel {
        /// The label file.
        path: PathBuf,
        /// Sample index of the label.
        index: usize,
        /// The label value.
        label: u8,
        /// Number of classes.
        classes: u8,
    },
    /// A file's sha256 differs from the one listed for it.
    #[error("{path}: sha256 {found} does not match the listed {expected}")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Digest listed in the checksum file (lowercase hex).
        expected: String,
        /// Digest of the file (lowercase hex).
        found: String,
    },
    /// A record of a record file fails its checksum: the file is corrupt there.
    #[error("{path}: record {index} at byte offset {offset} fails its checksum")]
    CorruptRecord {
        /// The file.
        path: PathBuf,
        /// The record's index.
        index: usize,
        /// The record's byte offset in the file.
        offset: u64,
    },
    /// A file is not a record file this version reads (bad magic, version, header checksum or
    /// size).
    #[error("{path}: not a readable record file: {reason}")]
    BadRecordFile {
        /// The file.
        path: PathBuf,
        /// What is wrong, in words.
        reason: String,
    },
    /// The checksum file lists no digest for a file.
    #[error("{sums}: no sha256 listed for {file}")]
    MissingChecksum {
        /// The checksum file.
        sums: PathBuf,
        /// The file name looked up.
        file: String,
    },

    /// A text holds fewer bytes than one token window.
    #[error("a text of {bytes} bytes holds no window of {window} bytes")]
    TextTooShort {
        /// Bytes in the text.
        bytes: usize,
        /// Bytes per window (context + 1).
        window: usize,
    },

    // === Layouts and batches ===
    /// A sample layout is empty, repeats a field name or uses an unsupported dtype.
    #[error("invalid sample layout: {reason}")]
    InvalidLayout {
        /// What is wrong, in words.
        reason: String,
    },
    /// A batch buffer was made for another layout than the dataset's.
    #[error("batch layout does not match the dataset layout")]
    LayoutMismatch,
    /// A field was read as a dtype it does not have.
    #[error("field {field} holds {found:?}, not {requested:?}")]
    FieldType {
        /// Field index in the layout.
        field: usize,
        /// The field's dtype.
        found: DType,
        /// The dtype asked for.
        requested: DType,
    },
    /// A field index is past the layout's fields.
    #[error("field {field} out of range for a layout of {fields} fields")]
    NoSuchField {
        /// Field index asked for.
        field: usize,
        /// Fields in the layout.
        fields: usize,
    },
    /// Field data does not hold a whole number of samples, or fields disagree on the sample count.
    #[error("field {field} holds {len} values, expected {expected}")]
    FieldLength {
        /// Field index.
        field: usize,
        /// Values provided.
        len: usize,
        /// Values expected.
        expected: usize,
    },
    /// A sample index is past the end of the dataset.
    #[error("sample index {index} out of range for a dataset of {len} samples")]
    IndexOutOfRange {
        /// Index asked for.
        index: usize,
        /// Dataset length.
        len: usize,
    },

    // === Sharding ===
    /// A sharding parameter is out of its domain (zero batch size, bad ratios, plan past the end).
    #[error("invalid sharding: {reason}")]
    InvalidSharding {
        /// What is wrong, in words.
        reason: String,
    },

    // === Pipelines ===
    /// A background data thread could not be started.
    #[error("cannot start the {role} thread: {source}")]
    Spawn {
        /// Which thread: "prefetch" or "staging".
        role: &'static str,
        /// The operating system's refusal.
        source: std::io::Error,
    },
    /// A background data thread ended without delivering what it owed (it panicked, or its owner
    /// was dropped while a consumer still waited).
    #[error("the {role} thread ended before delivering everything it owed")]
    WorkerLost {
        /// Which thread: "prefetch" or "staging".
        role: &'static str,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] flodl_tensor::Error),
}

/// The result type of flodl-data.
pub type Result<T> = std::result::Result<T, Error>;

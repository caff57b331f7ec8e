//! The crate's error type.

use crate::{DType, Device};

/// Everything that can go wrong in flodl-tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // === shape errors ===
    /// Two tensors (or a tensor and a host slice) that must match in shape do not.
    #[error("{op}: shape mismatch, expected {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// The operation that checked.
        op: &'static str,
        /// The shape the operation needed.
        expected: Vec<usize>,
        /// The shape it was given.
        got: Vec<usize>,
    },
    /// A tensor does not have the number of dimensions an operation needs.
    #[error("{op}: expected a {expected}-d tensor, got shape {got:?}")]
    RankMismatch {
        /// The operation that checked.
        op: &'static str,
        /// The number of dimensions needed.
        expected: usize,
        /// The shape it was given.
        got: Vec<usize>,
    },
    /// A host slice or a list has the wrong length.
    #[error("{op}: length mismatch, expected {expected}, got {got}")]
    LengthMismatch {
        /// The operation that checked.
        op: &'static str,
        /// The length needed.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// The product of a shape's dimensions overflows `usize`.
    #[error("shape {shape:?} has more elements than usize can count")]
    ShapeOverflow {
        /// The offending shape.
        shape: Vec<usize>,
    },

    // === dtype errors ===
    /// A tensor has another dtype than the operation needs.
    #[error("{op}: dtype mismatch, expected {expected}, got {got}")]
    DTypeMismatch {
        /// The operation that checked.
        op: &'static str,
        /// The dtype needed.
        expected: DType,
        /// The dtype given.
        got: DType,
    },
    /// The operation has no kernel for this dtype.
    #[error("{op}: dtype {dtype} is not supported")]
    UnsupportedDType {
        /// The operation that checked.
        op: &'static str,
        /// The dtype given.
        dtype: DType,
    },

    // === device errors ===
    /// A tensor, event or buffer lives on another device than the stream the operation runs on.
    #[error("{op}: device mismatch, expected {expected}, got {got}")]
    DeviceMismatch {
        /// The operation that checked.
        op: &'static str,
        /// The stream's device.
        expected: Device,
        /// The device of the offending argument.
        got: Device,
    },
    /// A zero-copy host view was asked of a tensor that is not in host memory.
    #[error("{op}: needs a cpu tensor, got one on {device}")]
    NotOnCpu {
        /// The operation that checked.
        op: &'static str,
        /// Where the tensor lives.
        device: Device,
    },
    /// A device address was asked of a tensor that is not in CUDA memory.
    #[error("{op}: needs a cuda tensor, got one on {device}")]
    NotOnCuda {
        /// The operation that checked.
        op: &'static str,
        /// Where the tensor lives.
        device: Device,
    },
    /// A device string did not parse (`cpu`, `cuda`, `cuda:N`).
    #[error("cannot parse {0:?} as a device (expected cpu, cuda or cuda:N)")]
    ParseDevice(String),

    // === argument errors ===
    /// A class label is negative or not below the number of classes.
    #[error("{op}: label {label} at row {row} is out of range for {classes} classes")]
    LabelOutOfRange {
        /// The operation that checked.
        op: &'static str,
        /// The batch row.
        row: usize,
        /// The label found.
        label: i32,
        /// The number of classes (columns of the logits).
        classes: usize,
    },
    /// A value that must be finite is NaN or infinite (a delta to quantize, a received scale).
    #[error("{op}: the value at index {index} is not finite")]
    NonFinite {
        /// The operation that checked.
        op: &'static str,
        /// The position of the first such value.
        index: usize,
    },
    /// A scalar argument is out of its domain (for example a zero thread count or step).
    #[error("{op}: invalid argument: {what}")]
    InvalidArgument {
        /// The operation that checked.
        op: &'static str,
        /// What is wrong.
        what: &'static str,
    },
    /// Elapsed time was asked of an event made without timing ([`crate::Event::new`]; use
    /// [`crate::Event::timed`]).
    #[error("{op}: the event was made without timing (use Event::timed)")]
    EventNotTimed {
        /// The operation that checked.
        op: &'static str,
    },
    /// An event was queried before it was ever recorded.
    #[error("{op}: the event was never recorded")]
    EventNotRecorded {
        /// The operation that checked.
        op: &'static str,
    },

    // === memory and CUDA errors ===
    /// An allocation failed.
    #[error("out of memory allocating {bytes} bytes on {device}")]
    OutOfMemory {
        /// The device the allocation was for.
        device: Device,
        /// The number of bytes asked for.
        bytes: usize,
    },
    /// The crate was built without the `cuda` feature.
    #[error("cuda support is not compiled in (the `cuda` feature is off)")]
    CudaNotCompiled,
    /// CUDA is compiled in but cannot be used here (no library, no driver, no device).
    #[error("cuda is unavailable: {reason}")]
    CudaUnavailable {
        /// Why, in words.
        reason: String,
    },
    /// A CUDA ordinal beyond the devices present.
    #[error("cuda:{ordinal} does not exist ({count} cuda devices present)")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices there are.
        count: usize,
    },
    /// A CUDA driver, NVRTC or cuBLAS call failed.
    #[error("cuda {op}: {source}")]
    Cuda {
        /// The operation that failed.
        op: &'static str,
        /// The library's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// NVRTC could not compile flodl's kernels, or the driver loaded neither the CUBIN nor the
    /// PTX it produced.
    #[error("cuda kernels: {reason}")]
    KernelCompile {
        /// What failed, with NVRTC's log or the driver's error.
        reason: String,
    },
    /// A cuBLAS call returned an error status.
    #[error("cublas {op}: status {status}")]
    Cublas {
        /// The call that failed.
        op: &'static str,
        /// The `cublasStatus_t`.
        status: i32,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

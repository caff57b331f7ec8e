//! Tensors, devices, streams, events, pinned buffers and the kernels flodl needs, on CPU and CUDA.
//!
//! One API for both kinds of device: a [`Tensor`] lives on a [`Device`], work is issued on a
//! [`Stream`] of that device, and the kernels in [`ops`] check their arguments and return a typed
//! [`Error`] instead of panicking. On the CPU a stream runs work synchronously (split across the
//! stream's threads for large inputs); on CUDA it queues work asynchronously, so the layers above
//! are written once.
//!
//! ```
//! use flodl_tensor::{DType, Stream, Tensor, ops};
//!
//! # fn main() -> flodl_tensor::Result<()> {
//! let s = Stream::cpu_with_threads(1);
//! let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &s)?;
//! let b = Tensor::rand_uniform(&[2, 2], -1.0, 1.0, 42, &s)?;
//! let mut avg = Tensor::zeros(&[2, 2], DType::F32, &s)?;
//! ops::weighted_sum(&[&a, &b], &[0.5, 0.5], &mut avg, &s)?;
//! let mut c = Tensor::zeros(&[2, 2], DType::F32, &s)?;
//! ops::gemm(1.0, &a, ops::Transpose::No, &avg, ops::Transpose::Yes, 0.0, &mut c, &s)?;
//! assert_eq!(c.to_vec::<f32>(&s)?.len(), 4);
//! # Ok(())
//! # }
//! ```
//!
//! | CPU | CUDA |
//! |---|---|
//! | `Device::Cpu` | `Device::Cuda(ordinal)` (one primary context per device) |
//! | `Vec<T>` in a `Tensor` | `CudaSlice` in a `Tensor` |
//! | the calling thread (+ the stream's thread pool) | a non-blocking `CUstream` |
//! | `Event`: the instant it was recorded | a `CUevent`, timing disabled unless [`Event::timed`] |
//! | `PinnedBuffer`: a plain `Vec` | page-locked host memory (not write-combined) |
//! | kernels: Rust loops, `gemm` crate | NVRTC kernels compiled once per device, cuBLAS gemm |
//!
//! CUDA support (the default `cuda` feature) loads the driver at run time: it builds without a
//! toolkit, and without a driver every CUDA call returns [`Error::CudaUnavailable`].
//! [`gpu_skip_reason`] and [`skip_or_fail`] gate GPU tests; [`skip`] records any test's skip.

mod address;
mod cpu;
mod cuda_library;
mod device;
mod dtype;
mod error;
mod event;
mod feedback;
// Without the `cuda` feature only the public names are used (nothing is loaded).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod library_search;
mod pinned;
mod skip;
mod stream;
mod tensor;

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_off.rs"]
mod cuda;

pub mod ops;
pub mod quant;

pub use address::DeviceAddress;
pub use cuda_library::{LibraryReport, LibraryStatus, cuda_libraries};
pub use device::{Device, DeviceDetails, DeviceInfo, cuda_device_count, devices, gpu_skip_reason};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use event::Event;
pub use feedback::ErrorFeedback;
pub use half::bf16;
pub use library_search::{CUDA_LIB_DIR_ENV, RuntimeLibrary, cuda_lib_folders};
pub use pinned::PinnedBuffer;
pub use skip::{
    REQUIRE_GPU_ENV, SKIP_LOG_ENV, SkipDecision, lacks_gpus, skip, skip_decision, skip_or_fail,
};
pub use stream::Stream;
pub use tensor::Tensor;

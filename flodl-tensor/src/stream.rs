//! Streams: ordered queues of work on one device.

use std::sync::Arc;

use crate::cpu::CpuWorkers;
use crate::{Device, Error, Event, Result, cuda};

/// An ordered queue of work on one device; cheap to clone (shared handle).
///
/// On the CPU, work runs synchronously on the calling thread when it is issued, split across
/// the stream's worker threads for large inputs; on CUDA it is a non-blocking stream and work
/// completes asynchronously.
///
/// # Thread safety
/// `Send + Sync`; clones share the same underlying queue.
#[derive(Debug, Clone)]
pub struct Stream {
    inner: StreamInner,
}

#[derive(Debug, Clone)]
pub(crate) enum StreamInner {
    Cpu(Arc<CpuWorkers>),
    Cuda(cuda::CudaStream),
}

impl Stream {
    /// A CPU stream whose kernels may use every hardware thread of the machine.
    pub fn cpu() -> Stream {
        let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        Stream { inner: StreamInner::Cpu(Arc::new(CpuWorkers::new(n))) }
    }

    /// A CPU stream whose kernels use at most `threads` threads (0 is taken as 1).
    ///
    /// A 1-thread stream runs everything on the calling thread and never touches a thread pool
    /// (what a CPU DDP rank uses).
    pub fn cpu_with_threads(threads: usize) -> Stream {
        Stream { inner: StreamInner::Cpu(Arc::new(CpuWorkers::new(threads.max(1)))) }
    }

    /// A new stream on `device`: a CPU stream for [`Device::Cpu`], a new non-blocking CUDA stream
    /// otherwise.
    ///
    /// # Errors
    /// [`Error::CudaNotCompiled`], [`Error::CudaUnavailable`], [`Error::NoSuchDevice`] or a
    /// driver error for CUDA devices.
    pub fn new(device: Device) -> Result<Stream> {
        match device {
            Device::Cpu => Ok(Stream::cpu()),
            Device::Cuda(ordinal) => {
                Ok(Stream { inner: StreamInner::Cuda(cuda::CudaStream::new(ordinal)?) })
            }
        }
    }

    /// The device this stream runs on.
    pub fn device(&self) -> Device {
        match &self.inner {
            StreamInner::Cpu(_) => Device::Cpu,
            StreamInner::Cuda(s) => Device::Cuda(s.ordinal()),
        }
    }

    /// How many threads a CPU stream's kernels may use; 1 for a CUDA stream (host side).
    pub fn threads(&self) -> usize {
        match &self.inner {
            StreamInner::Cpu(w) => w.threads(),
            StreamInner::Cuda(_) => 1,
        }
    }

    /// Blocks until all work issued on this stream has finished (a no-op on the CPU).
    ///
    /// # Errors
    /// A driver error from CUDA.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner {
            StreamInner::Cpu(_) => Ok(()),
            StreamInner::Cuda(s) => s.synchronize(),
        }
    }

    /// Makes later work on this stream wait until `event` has completed.
    ///
    /// A CPU stream blocks the caller until a CUDA event completes; a CUDA stream waiting on a
    /// CPU event has nothing to wait for (CPU work is complete when issued).
    ///
    /// # Errors
    /// A driver error from CUDA.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        match (&self.inner, event.cuda()) {
            (StreamInner::Cuda(s), Some(e)) => s.wait_event(e),
            (StreamInner::Cpu(_), Some(_)) => event.synchronize(),
            (_, None) => Ok(()),
        }
    }

    /// The raw `CUstream` handle of a CUDA stream (`None` for a CPU stream), for enqueueing work
    /// flodl does not issue itself, such as an NCCL collective.
    ///
    /// Taking the handle is harmless; using it is the caller's `unsafe` business. It is valid
    /// while this stream or a clone of it lives, and belongs to the primary context of
    /// [`device`](Self::device), which must be current on the thread that uses it. flodl does not
    /// see work enqueued through the handle: for every tensor that work touches, hold a
    /// [`DeviceAddress`](crate::DeviceAddress) taken for this stream
    /// ([`Tensor::cuda_device_ptr`](crate::Tensor::cuda_device_ptr)) until the work is enqueued.
    pub fn raw_cuda_stream(&self) -> Option<*mut std::ffi::c_void> {
        match &self.inner {
            StreamInner::Cpu(_) => None,
            StreamInner::Cuda(s) => Some(s.handle()),
        }
    }

    pub(crate) fn inner(&self) -> &StreamInner {
        &self.inner
    }

    /// Checks that `device` is this stream's device.
    pub(crate) fn check_device(&self, op: &'static str, device: Device) -> Result<()> {
        let expected = self.device();
        if device == expected {
            Ok(())
        } else {
            Err(Error::DeviceMismatch { op, expected, got: device })
        }
    }
}

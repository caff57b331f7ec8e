//! Host buffers for asynchronous copies: page-locked for CUDA, plain memory for the CPU.

use crate::{Device, Element, Error, Result, cuda};

/// A host buffer that asynchronous device copies can read from and write to.
///
/// For a CUDA device it is page-locked (pinned, not write-combined, so the host reads it at full
/// speed); for the CPU it is an ordinary vector.
#[derive(Debug)]
pub struct PinnedBuffer<T: Element> {
    inner: PinnedInner<T>,
}

#[derive(Debug)]
pub(crate) enum PinnedInner<T: Element> {
    Cpu(Vec<T>),
    Cuda(cuda::PinnedHost<T>),
}

impl<T: Element> PinnedBuffer<T> {
    /// `n` zeroed elements of host memory for copies with `device`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; CUDA unavailable or a driver error for CUDA devices.
    pub fn new(n: usize, device: Device) -> Result<PinnedBuffer<T>> {
        let inner = match device {
            Device::Cpu => {
                let mut v = Vec::new();
                v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
                    device,
                    bytes: n.saturating_mul(size_of::<T>()),
                })?;
                v.resize(n, T::zeroed());
                PinnedInner::Cpu(v)
            }
            Device::Cuda(ordinal) => PinnedInner::Cuda(cuda::PinnedHost::new(n, ordinal)?),
        };
        Ok(PinnedBuffer { inner })
    }

    /// The device this buffer was allocated for.
    pub fn device(&self) -> Device {
        match &self.inner {
            PinnedInner::Cpu(_) => Device::Cpu,
            PinnedInner::Cuda(p) => Device::Cuda(p.ordinal()),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.inner {
            PinnedInner::Cpu(v) => v.len(),
            PinnedInner::Cuda(p) => p.len(),
        }
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The contents, after waiting for any asynchronous copy into or out of the buffer.
    ///
    /// # Errors
    /// A driver error while waiting.
    pub fn as_slice(&self) -> Result<&[T]> {
        match &self.inner {
            PinnedInner::Cpu(v) => Ok(v),
            PinnedInner::Cuda(p) => p.as_slice(),
        }
    }

    /// The contents, mutable, after waiting for any asynchronous copy into or out of the buffer.
    ///
    /// # Errors
    /// A driver error while waiting.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        match &mut self.inner {
            PinnedInner::Cpu(v) => Ok(v),
            PinnedInner::Cuda(p) => p.as_mut_slice(),
        }
    }

    pub(crate) fn inner(&self) -> &PinnedInner<T> {
        &self.inner
    }

    pub(crate) fn inner_mut(&mut self) -> &mut PinnedInner<T> {
        &mut self.inner
    }
}

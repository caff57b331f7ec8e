//! Host buffers for asynchronous copies: page-locked for CUDA, plain memory for the CPU.

use crate::{Device, Element, Error, Result, cuda};

/// The one rule for which streams a buffer's async copies may run on: a page-locked buffer made
/// for `cuda:i` only on `cuda:i` (its copies are tracked by an event of that device's context,
/// which a stream of another device cannot wait on: the driver reports
/// `CUDA_ERROR_INVALID_CONTEXT` at some unrelated later call) or on the CPU (plain memory
/// there); a CPU buffer on any stream.
///
/// # Errors
/// [`Error::DeviceMismatch`] with the stream's device expected and the buffer's found.
pub(crate) fn check_copy_device(op: &'static str, buffer: Device, stream: Device) -> Result<()> {
    match (buffer, stream) {
        (Device::Cuda(b), Device::Cuda(s)) if b != s => {
            Err(Error::DeviceMismatch { op, expected: stream, got: buffer })
        }
        _ => Ok(()),
    }
}

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

    /// Checks, before any driver call, that this buffer can take part in an async copy on a
    /// stream of `stream` (see [`check_copy_device`]).
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`].
    pub(crate) fn check_stream(&self, op: &'static str, stream: Device) -> Result<()> {
        check_copy_device(op, self.device(), stream)
    }

    pub(crate) fn inner(&self) -> &PinnedInner<T> {
        &self.inner
    }

    pub(crate) fn inner_mut(&mut self) -> &mut PinnedInner<T> {
        &mut self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::check_copy_device;
    use crate::{Device, Error};

    #[test]
    fn buffers_copy_only_on_streams_their_memory_can_serve() {
        let (cpu, c0, c1) = (Device::Cpu, Device::Cuda(0), Device::Cuda(1));
        let cases = [
            (cpu, cpu, true),
            (cpu, c0, true),
            (cpu, c1, true),
            (c0, cpu, true),
            (c0, c0, true),
            (c1, c1, true),
            (c0, c1, false),
            (c1, c0, false),
        ];
        for (buffer, stream, allowed) in cases {
            match check_copy_device("copy", buffer, stream) {
                Ok(()) => assert!(allowed, "{buffer} buffer on a {stream} stream was allowed"),
                Err(Error::DeviceMismatch { op, expected, got }) => {
                    assert!(!allowed, "{buffer} buffer on a {stream} stream was refused");
                    assert_eq!((op, expected, got), ("copy", stream, buffer));
                }
                Err(e) => panic!("{buffer} on {stream}: unexpected error {e}"),
            }
        }
    }
}

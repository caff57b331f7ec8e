//! Device memory of a tensor: a cudarc `CudaSlice` of the tensor's element representation.

use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream as RawStream, DevicePtrMut, DeviceRepr, DriverError, sys,
};

use super::pinned::PinnedRaw;
use super::{CudaStream, PinnedHost, cuda_err};
use crate::cpu::CpuStorage;
use crate::{DType, Device, DeviceAddress, Element, Error, Result};

/// Contiguous device memory holding the elements of one tensor.
#[derive(Debug)]
pub(crate) enum CudaStorage {
    F32(CudaSlice<f32>),
    // bf16 is stored as its bit pattern (cudarc has no bf16 `DeviceRepr` without its `f16`
    // feature, and the kernels treat it as bits anyway).
    Bf16(CudaSlice<u16>),
    I32(CudaSlice<i32>),
}

/// Maps a driver error, turning out-of-memory into [`Error::OutOfMemory`].
fn alloc_err(ordinal: usize, bytes: usize) -> impl Fn(DriverError) -> Error {
    move |e| match e.0 {
        sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
            Error::OutOfMemory { device: Device::Cuda(ordinal), bytes }
        }
        _ => cuda_err("device alloc")(e),
    }
}

fn zeros_of<U: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    n: usize,
    s: &Arc<RawStream>,
    ordinal: usize,
) -> Result<CudaSlice<U>> {
    let e = alloc_err(ordinal, n.saturating_mul(size_of::<U>()));
    if n == 0 { s.null::<U>().map_err(e) } else { s.alloc_zeros::<U>(n).map_err(e) }
}

/// Views host elements `T` as the device representation `U` (same size; dtype checked).
fn host_as<T: Element, U: bytemuck::Pod>(x: &[T]) -> Result<&[U]> {
    bytemuck::try_cast_slice(x).map_err(|_| layout())
}

fn host_as_mut<T: Element, U: bytemuck::Pod>(x: &mut [T]) -> Result<&mut [U]> {
    bytemuck::try_cast_slice_mut(x).map_err(|_| layout())
}

/// Whether the driver may read `src` after an async copy call returns: page-locked (or managed)
/// memory. Only a definite "not memory the driver knows" (`CUDA_ERROR_INVALID_VALUE`, what a
/// pageable address gives) counts as pageable; any other answer counts as page-locked, the side
/// on which waiting is merely slower.
fn is_page_locked<T>(src: &[T]) -> bool {
    let mut kind: std::ffi::c_uint = 0;
    // SAFETY: `kind` is a valid out-pointer for the memory-type attribute (an unsigned int);
    // the address is only looked up, never dereferenced; the caller has just issued a copy on
    // a stream of this context, so the driver is initialised and the context current.
    let result = unsafe {
        sys::cuPointerGetAttribute(
            (&mut kind as *mut std::ffi::c_uint).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            src.as_ptr() as sys::CUdeviceptr,
        )
    };
    result != sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE
}

fn layout() -> Error {
    Error::InvalidArgument { op: "cuda copy", what: "element layout does not match" }
}

impl CudaStorage {
    pub(crate) fn zeros(dtype: DType, n: usize, s: &CudaStream) -> Result<CudaStorage> {
        let (raw, o) = (s.raw(), s.ordinal());
        Ok(match dtype {
            DType::F32 => CudaStorage::F32(zeros_of(n, raw, o)?),
            DType::Bf16 => CudaStorage::Bf16(zeros_of(n, raw, o)?),
            DType::I32 => CudaStorage::I32(zeros_of(n, raw, o)?),
        })
    }

    pub(crate) fn from_host<T: Element>(data: &[T], s: &CudaStream) -> Result<CudaStorage> {
        let mut t = CudaStorage::zeros(T::DTYPE, data.len(), s)?;
        t.copy_from_host(data, s)?;
        Ok(t)
    }

    pub(crate) fn dtype(&self) -> DType {
        match self {
            CudaStorage::F32(_) => DType::F32,
            CudaStorage::Bf16(_) => DType::Bf16,
            CudaStorage::I32(_) => DType::I32,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            CudaStorage::F32(d) => d.len(),
            CudaStorage::Bf16(d) => d.len(),
            CudaStorage::I32(d) => d.len(),
        }
    }

    pub(crate) fn ordinal(&self) -> usize {
        match self {
            CudaStorage::F32(d) => d.ordinal(),
            CudaStorage::Bf16(d) => d.ordinal(),
            CudaStorage::I32(d) => d.ordinal(),
        }
    }

    /// The address of the first element for writes on `s` (same device, checked by the
    /// caller): `s` waits for every earlier tracked read and write, and dropping the address
    /// records `s`'s queued work as the latest write.
    pub(crate) fn device_address<'a>(&'a mut self, s: &'a CudaStream) -> DeviceAddress<'a> {
        let raw: &'a RawStream = s.raw();
        let (addr, record) = match self {
            CudaStorage::F32(d) => d.device_ptr_mut(raw),
            CudaStorage::Bf16(d) => d.device_ptr_mut(raw),
            CudaStorage::I32(d) => d.device_ptr_mut(raw),
        };
        DeviceAddress::new(addr, record)
    }

    /// The stream this memory was allocated on.
    fn home(&self) -> &Arc<RawStream> {
        match self {
            CudaStorage::F32(d) => d.stream(),
            CudaStorage::Bf16(d) => d.stream(),
            CudaStorage::I32(d) => d.stream(),
        }
    }

    fn check<T: Element>(&self) -> Result<()> {
        if T::DTYPE == self.dtype() {
            Ok(())
        } else {
            Err(Error::DTypeMismatch { op: "cuda copy", expected: self.dtype(), got: T::DTYPE })
        }
    }

    /// Device to host on `s`, then waits for it.
    fn dtoh<T: Element>(&self, dst: &mut [T], s: &Arc<RawStream>) -> Result<()> {
        self.check::<T>()?;
        if dst.len() != self.len() {
            return Err(Error::LengthMismatch {
                op: "copy_to_host",
                expected: self.len(),
                got: dst.len(),
            });
        }
        if dst.is_empty() {
            return Ok(());
        }
        let e = cuda_err("copy device to host");
        match self {
            CudaStorage::F32(d) => s.memcpy_dtoh(d, host_as_mut::<T, f32>(dst)?),
            CudaStorage::Bf16(d) => s.memcpy_dtoh(d, host_as_mut::<T, u16>(dst)?),
            CudaStorage::I32(d) => s.memcpy_dtoh(d, host_as_mut::<T, i32>(dst)?),
        }
        .map_err(&e)?;
        s.synchronize().map_err(e)
    }

    /// Host to device on `s`; `src` may be reused when this returns.
    ///
    /// A pageable source is staged by the driver before the copy call returns; a page-locked
    /// one (a slice of a pinned buffer, as a host batch hands out) is read by the DMA engine
    /// later, and cudarc records nothing for a plain slice, so the copy is waited for here:
    /// otherwise refilling the buffer could overwrite data still in flight. Uploads that should
    /// overlap go through `copy_from_pinned`, whose buffer tracks the copy.
    fn htod<T: Element>(&mut self, src: &[T], s: &Arc<RawStream>) -> Result<()> {
        self.check::<T>()?;
        if src.len() != self.len() {
            return Err(Error::LengthMismatch {
                op: "copy_from_host",
                expected: self.len(),
                got: src.len(),
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        match self {
            CudaStorage::F32(d) => s.memcpy_htod(host_as::<T, f32>(src)?, d),
            CudaStorage::Bf16(d) => s.memcpy_htod(host_as::<T, u16>(src)?, d),
            CudaStorage::I32(d) => s.memcpy_htod(host_as::<T, i32>(src)?, d),
        }
        .map_err(cuda_err("copy host to device"))?;
        if is_page_locked(src) {
            s.synchronize().map_err(cuda_err("copy host to device"))?;
        }
        Ok(())
    }

    pub(crate) fn copy_to_host<T: Element>(&self, dst: &mut [T], s: &CudaStream) -> Result<()> {
        self.dtoh(dst, s.raw())
    }

    pub(crate) fn copy_from_host<T: Element>(&mut self, src: &[T], s: &CudaStream) -> Result<()> {
        self.htod(src, s.raw())
    }

    /// Copies from host storage, on `s` or, without one, on this memory's own stream (waiting).
    pub(crate) fn copy_from_cpu(&mut self, src: &CpuStorage, s: Option<&CudaStream>) -> Result<()> {
        let raw = s.map_or_else(|| self.home().clone(), |s| s.raw().clone());
        match src {
            CpuStorage::F32(v) => self.htod(v, &raw)?,
            CpuStorage::Bf16(v) => self.htod(v, &raw)?,
            CpuStorage::I32(v) => self.htod(v, &raw)?,
        }
        if s.is_none() {
            raw.synchronize().map_err(cuda_err("stream synchronize"))?;
        }
        Ok(())
    }

    /// Copies into host storage, on `s` or this memory's own stream, and waits.
    pub(crate) fn copy_to_cpu(&self, dst: &mut CpuStorage, s: Option<&CudaStream>) -> Result<()> {
        let raw = s.map_or_else(|| self.home().clone(), |s| s.raw().clone());
        match dst {
            CpuStorage::F32(v) => self.dtoh(v, &raw),
            CpuStorage::Bf16(v) => self.dtoh(v, &raw),
            CpuStorage::I32(v) => self.dtoh(v, &raw),
        }
    }

    pub(crate) fn copy_to_pinned<T: Element>(
        &self,
        dst: &mut PinnedHost<T>,
        s: &CudaStream,
    ) -> Result<()> {
        if self.len() == 0 {
            return Ok(());
        }
        let raw = s.raw();
        let e = cuda_err("copy device to pinned");
        match (self, dst.raw_mut()) {
            (CudaStorage::F32(d), PinnedRaw::F32(h)) => raw.memcpy_dtoh(d, h).map_err(e),
            (CudaStorage::Bf16(d), PinnedRaw::U16(h)) => raw.memcpy_dtoh(d, h).map_err(e),
            (CudaStorage::I32(d), PinnedRaw::I32(h)) => raw.memcpy_dtoh(d, h).map_err(e),
            _ => Err(Error::DTypeMismatch {
                op: "copy_to_pinned",
                expected: self.dtype(),
                got: T::DTYPE,
            }),
        }
    }

    pub(crate) fn copy_from_pinned<T: Element>(
        &mut self,
        src: &PinnedHost<T>,
        s: &CudaStream,
    ) -> Result<()> {
        if self.len() == 0 {
            return Ok(());
        }
        let raw = s.raw();
        let e = cuda_err("copy pinned to device");
        let dtype = self.dtype();
        match (self, src.raw()) {
            (CudaStorage::F32(d), PinnedRaw::F32(h)) => raw.memcpy_htod(h, d).map_err(e),
            (CudaStorage::Bf16(d), PinnedRaw::U16(h)) => raw.memcpy_htod(h, d).map_err(e),
            (CudaStorage::I32(d), PinnedRaw::I32(h)) => raw.memcpy_htod(h, d).map_err(e),
            _ => {
                Err(Error::DTypeMismatch { op: "copy_from_pinned", expected: dtype, got: T::DTYPE })
            }
        }
    }

    /// Device to device (same device or peer), ordered on `s`.
    ///
    /// The copy itself is issued on a stream of the destination's device (cudarc records the
    /// destination's write event on the issuing stream, which must belong to its context): `s`
    /// when it is there, otherwise the destination's own stream, joined to `s` both ways.
    pub(crate) fn copy_from_device(&mut self, src: &CudaStorage, s: &CudaStream) -> Result<()> {
        if src.len() != self.len() {
            return Err(Error::LengthMismatch {
                op: "copy_from",
                expected: self.len(),
                got: src.len(),
            });
        }
        if self.len() == 0 {
            return Ok(());
        }
        let e = cuda_err("copy device to device");
        let cross = s.ordinal() != self.ordinal();
        let raw = if cross { self.home().clone() } else { s.raw().clone() };
        if cross {
            raw.join(s.raw()).map_err(&e)?;
        }
        let dtype = self.dtype();
        match (&mut *self, src) {
            (CudaStorage::F32(d), CudaStorage::F32(x)) => raw.memcpy_dtod(x, d).map_err(&e)?,
            (CudaStorage::Bf16(d), CudaStorage::Bf16(x)) => raw.memcpy_dtod(x, d).map_err(&e)?,
            (CudaStorage::I32(d), CudaStorage::I32(x)) => raw.memcpy_dtod(x, d).map_err(&e)?,
            _ => {
                let got = src.dtype();
                return Err(Error::DTypeMismatch { op: "copy_from", expected: dtype, got });
            }
        }
        if cross {
            s.raw().join(&raw).map_err(&e)?;
        }
        Ok(())
    }

    pub(crate) fn try_clone(&self, s: &CudaStream) -> Result<CudaStorage> {
        let mut t = CudaStorage::zeros(self.dtype(), self.len(), s)?;
        t.copy_from_device(self, s)?;
        Ok(t)
    }
}

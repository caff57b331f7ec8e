//! Page-locked host memory for asynchronous copies.

use std::marker::PhantomData;

use cudarc::driver::{PinnedHostSlice, sys};

use super::{context, cuda_err};
use crate::{DType, Device, Element, Error, Result};

/// Page-locked host memory in the element representation the device copies use.
#[derive(Debug)]
pub(crate) enum PinnedRaw {
    F32(PinnedHostSlice<f32>),
    // bf16 travels as its bit pattern.
    U16(PinnedHostSlice<u16>),
    I32(PinnedHostSlice<i32>),
}

/// `len` elements of page-locked, portable, cached (not write-combined) host memory.
#[derive(Debug)]
pub(crate) struct PinnedHost<T: Element> {
    ordinal: usize,
    len: usize,
    // Holds at least one element: the driver rejects empty allocations.
    raw: PinnedRaw,
    _t: PhantomData<T>,
}

fn alloc<U: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    n: usize,
) -> Result<PinnedHostSlice<U>> {
    let bytes = n.checked_mul(size_of::<U>()).filter(|b| *b < isize::MAX as usize);
    let Some(bytes) = bytes else {
        return Err(Error::OutOfMemory { device: Device::Cpu, bytes: usize::MAX });
    };
    // SAFETY: the size was checked above not to overflow (cudarc would assert); the memory is
    // uninitialised until the fill below, and nothing reads it before.
    let mut p = unsafe { ctx.alloc_pinned_with_flags::<U>(n, sys::CU_MEMHOSTALLOC_PORTABLE) }
        .map_err(|e| match e.0 {
            sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
                Error::OutOfMemory { device: Device::Cpu, bytes }
            }
            _ => cuda_err("pinned alloc")(e),
        })?;
    let ptr = p.as_mut_ptr().map_err(cuda_err("pinned alloc"))?;
    // SAFETY: `ptr` points to `n` elements just allocated and not yet shared with any copy;
    // writing zero bits initialises them (valid for f32, u16, i32).
    unsafe { std::ptr::write_bytes(ptr, 0, n) };
    Ok(p)
}

impl<T: Element> PinnedHost<T> {
    pub(crate) fn new(n: usize, ordinal: usize) -> Result<PinnedHost<T>> {
        let ctx = &context::device(ordinal)?.ctx;
        let m = n.max(1);
        let raw = match T::DTYPE {
            DType::F32 => PinnedRaw::F32(alloc(ctx, m)?),
            DType::Bf16 => PinnedRaw::U16(alloc(ctx, m)?),
            DType::I32 => PinnedRaw::I32(alloc(ctx, m)?),
        };
        Ok(PinnedHost { ordinal, len: n, raw, _t: PhantomData })
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn raw(&self) -> &PinnedRaw {
        &self.raw
    }

    pub(crate) fn raw_mut(&mut self) -> &mut PinnedRaw {
        &mut self.raw
    }

    pub(crate) fn as_slice(&self) -> Result<&[T]> {
        let e = cuda_err("pinned read");
        let bytes: &[u8] = match &self.raw {
            PinnedRaw::F32(p) => bytemuck::cast_slice(p.as_slice().map_err(e)?),
            PinnedRaw::U16(p) => bytemuck::cast_slice(p.as_slice().map_err(e)?),
            PinnedRaw::I32(p) => bytemuck::cast_slice(p.as_slice().map_err(e)?),
        };
        let all: &[T] = bytemuck::try_cast_slice(bytes).map_err(|_| mismatch())?;
        Ok(&all[..self.len])
    }

    pub(crate) fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        let e = cuda_err("pinned write");
        let bytes: &mut [u8] = match &mut self.raw {
            PinnedRaw::F32(p) => bytemuck::cast_slice_mut(p.as_mut_slice().map_err(e)?),
            PinnedRaw::U16(p) => bytemuck::cast_slice_mut(p.as_mut_slice().map_err(e)?),
            PinnedRaw::I32(p) => bytemuck::cast_slice_mut(p.as_mut_slice().map_err(e)?),
        };
        let all: &mut [T] = bytemuck::try_cast_slice_mut(bytes).map_err(|_| mismatch())?;
        Ok(&mut all[..self.len])
    }
}

fn mismatch() -> Error {
    Error::InvalidArgument { op: "pinned buffer", what: "element layout does not match" }
}

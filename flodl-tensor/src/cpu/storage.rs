//! Host storage of a tensor: a typed, contiguous vector.

use half::bf16;

use crate::{DType, Device, Element, Error, Result};

/// Contiguous host memory holding the elements of one tensor.
#[derive(Debug)]
pub(crate) enum CpuStorage {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    I32(Vec<i32>),
}

fn alloc<T: Copy>(n: usize, zero: T) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        device: Device::Cpu,
        bytes: n.saturating_mul(size_of::<T>()),
    })?;
    v.resize(n, zero);
    Ok(v)
}

impl CpuStorage {
    /// `n` zeros of `dtype`.
    pub(crate) fn zeros(dtype: DType, n: usize) -> Result<CpuStorage> {
        Ok(match dtype {
            DType::F32 => CpuStorage::F32(alloc(n, 0.0)?),
            DType::Bf16 => CpuStorage::Bf16(alloc(n, bf16::ZERO)?),
            DType::I32 => CpuStorage::I32(alloc(n, 0)?),
        })
    }

    /// A copy of `data`.
    pub(crate) fn from_slice<T: Element>(data: &[T]) -> Result<CpuStorage> {
        let mut s = CpuStorage::zeros(T::DTYPE, data.len())?;
        if let Some(d) = s.as_mut_slice::<T>() {
            d.copy_from_slice(data);
        }
        Ok(s)
    }

    pub(crate) fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::Bf16(_) => DType::Bf16,
            CpuStorage::I32(_) => DType::I32,
        }
    }

    /// The elements as `T`, or `None` when `T` is not this storage's dtype.
    pub(crate) fn as_slice<T: Element>(&self) -> Option<&[T]> {
        match self {
            CpuStorage::F32(v) => bytemuck::try_cast_slice(v).ok(),
            CpuStorage::Bf16(v) => bytemuck::try_cast_slice(v).ok(),
            CpuStorage::I32(v) => bytemuck::try_cast_slice(v).ok(),
        }
        .filter(|_| T::DTYPE == self.dtype())
    }

    /// The elements as mutable `T`, or `None` when `T` is not this storage's dtype.
    pub(crate) fn as_mut_slice<T: Element>(&mut self) -> Option<&mut [T]> {
        if T::DTYPE != self.dtype() {
            return None;
        }
        match self {
            CpuStorage::F32(v) => bytemuck::try_cast_slice_mut(v).ok(),
            CpuStorage::Bf16(v) => bytemuck::try_cast_slice_mut(v).ok(),
            CpuStorage::I32(v) => bytemuck::try_cast_slice_mut(v).ok(),
        }
    }

    pub(crate) fn try_clone(&self) -> Result<CpuStorage> {
        match self {
            CpuStorage::F32(v) => CpuStorage::from_slice(v),
            CpuStorage::Bf16(v) => CpuStorage::from_slice(v),
            CpuStorage::I32(v) => CpuStorage::from_slice(v),
        }
    }
}

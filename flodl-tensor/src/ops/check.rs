//! Argument checks shared by the kernels, each turning a bad input into a typed error.

use crate::tensor::Storage;
use crate::{DType, Error, Result, Stream, Tensor, cuda};

/// Checks that every tensor is on the stream's device and has `dtype`.
pub(crate) fn on(op: &'static str, s: &Stream, dtype: DType, ts: &[&Tensor]) -> Result<()> {
    for t in ts {
        s.check_device(op, t.device())?;
        t.check_dtype(op, dtype)?;
    }
    Ok(())
}

/// Checks that `t` has exactly the shape of `like`.
pub(crate) fn same_shape(op: &'static str, like: &Tensor, t: &Tensor) -> Result<()> {
    if like.shape() == t.shape() {
        Ok(())
    } else {
        Err(Error::ShapeMismatch { op, expected: like.shape().to_vec(), got: t.shape().to_vec() })
    }
}

/// Checks that `t` has exactly `shape`.
pub(crate) fn shape(op: &'static str, t: &Tensor, shape: &[usize]) -> Result<()> {
    if t.shape() == shape {
        Ok(())
    } else {
        Err(Error::ShapeMismatch { op, expected: shape.to_vec(), got: t.shape().to_vec() })
    }
}

/// The `[rows, cols]` of a 2-d tensor.
pub(crate) fn matrix(op: &'static str, t: &Tensor) -> Result<(usize, usize)> {
    match *t.shape() {
        [r, c] => Ok((r, c)),
        _ => Err(Error::RankMismatch { op, expected: 2, got: t.shape().to_vec() }),
    }
}

/// The CUDA storage of a tensor already checked to be on the (CUDA) stream's device.
pub(crate) fn cuda<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a cuda::CudaStorage> {
    match t.storage() {
        Storage::Cuda(c) => Ok(c),
        Storage::Cpu(_) => Err(Error::NotOnCpu { op, device: t.device() }),
    }
}

/// The mutable CUDA storage of a tensor already checked to be on the (CUDA) stream's device.
pub(crate) fn cuda_mut<'a>(
    op: &'static str,
    t: &'a mut Tensor,
) -> Result<&'a mut cuda::CudaStorage> {
    let device = t.device();
    match t.storage_mut() {
        Storage::Cuda(c) => Ok(c),
        Storage::Cpu(_) => Err(Error::NotOnCpu { op, device }),
    }
}

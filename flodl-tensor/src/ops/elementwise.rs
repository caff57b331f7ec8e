//! Element-wise kernels: fill, scale, axpy, lerp, weighted sum, casts and ReLU.

use half::bf16;

use super::check;
use crate::cpu::elementwise as k;
use crate::cpu::weighted_sum as ws;
use crate::stream::StreamInner;
use crate::{DType, Error, Result, Stream, Tensor, cuda};

/// Sets every element to `v` (f32, bf16 rounded to nearest even, or i32 when `v` is integral).
///
/// # Errors
/// Device mismatch; [`Error::InvalidArgument`] for a non-integral value into an i32 tensor.
pub fn fill(t: &mut Tensor, v: f32, s: &Stream) -> Result<()> {
    const OP: &str = "fill";
    s.check_device(OP, t.device())?;
    let dtype = t.dtype();
    if dtype == DType::I32 && (v.fract() != 0.0 || !v.is_finite()) {
        return Err(Error::InvalidArgument { op: OP, what: "i32 fill value must be integral" });
    }
    match s.inner() {
        StreamInner::Cpu(w) => {
            match dtype {
                DType::F32 => k::fill(w, t.as_mut_slice::<f32>()?, v),
                DType::Bf16 => k::fill(w, t.as_mut_slice::<bf16>()?, k::f32_to_bf16(v)),
                DType::I32 => k::fill(w, t.as_mut_slice::<i32>()?, v as i32),
            }
            Ok(())
        }
        StreamInner::Cuda(cs) => cuda::ops::fill(cs, check::cuda_mut(OP, t)?, v),
    }
}

/// `t *= alpha` (f32).
///
/// # Errors
/// Device or dtype mismatch.
pub fn scale(t: &mut Tensor, alpha: f32, s: &Stream) -> Result<()> {
    const OP: &str = "scale";
    check::on(OP, s, DType::F32, &[t])?;
    match s.inner() {
        StreamInner::Cpu(w) => {
            k::scale(w, t.as_mut_slice()?, alpha);
            Ok(())
        }
        StreamInner::Cuda(cs) => cuda::ops::scale(cs, check::cuda_mut(OP, t)?, alpha),
    }
}

/// `y += alpha · x` (f32, same shape).
///
/// # Errors
/// Device, dtype or shape mismatch.
pub fn axpy(alpha: f32, x: &Tensor, y: &mut Tensor, s: &Stream) -> Result<()> {
    const OP: &str = "axpy";
    check::on(OP, s, DType::F32, &[x, y])?;
    check::same_shape(OP, y, x)?;
    match s.inner() {
        StreamInner::Cpu(w) => {
            k::axpy(w, alpha, x.as_slice()?, y.as_mut_slice()?);
            Ok(())
        }
        StreamInner::Cuda(cs) => {
            cuda::ops::axpy(cs, alpha, check::cuda(OP, x)?, check::cuda_mut(OP, y)?)
        }
    }
}

/// `a += w · (b − a)`: moves `a` a fraction `w` of the way to `b` (f32, same shape).
///
/// # Errors
/// Device, dtype or shape mismatch.
pub fn lerp(a: &mut Tensor, b: &Tensor, w: f32, s: &Stream) -> Result<()> {
    const OP: &str = "lerp";
    check::on(OP, s, DType::F32, &[a, b])?;
    check::same_shape(OP, a, b)?;
    match s.inner() {
        StreamInner::Cpu(workers) => {
            k::lerp(workers, a.as_mut_slice()?, b.as_slice()?, w);
            Ok(())
        }
        StreamInner::Cuda(cs) => {
            cuda::ops::lerp(cs, check::cuda_mut(OP, a)?, check::cuda(OP, b)?, w)
        }
    }
}

/// `out = Σ_i weights[i] · inputs[i]` in one pass (f32, all the shape of `out`), accumulated in
/// f32 in input order.
///
/// # Errors
/// [`Error::InvalidArgument`] with no inputs, [`Error::LengthMismatch`] when the weights do not
/// match the inputs; device, dtype or shape mismatch.
pub fn weighted_sum(
    inputs: &[&Tensor],
    weights: &[f32],
    out: &mut Tensor,
    s: &Stream,
) -> Result<()> {
    const OP: &str = "weighted_sum";
    if inputs.is_empty() {
        return Err(Error::InvalidArgument { op: OP, what: "needs at least one input" });
    }
    if weights.len() != inputs.len() {
        return Err(Error::LengthMismatch { op: OP, expected: inputs.len(), got: weights.len() });
    }
    check::on(OP, s, DType::F32, &[out])?;
    check::on(OP, s, DType::F32, inputs)?;
    for x in inputs {
        check::same_shape(OP, out, x)?;
    }
    match s.inner() {
        StreamInner::Cpu(w) => {
            let xs = inputs.iter().map(|t| t.as_slice::<f32>()).collect::<Result<Vec<_>>>()?;
            ws::weighted_sum(w, &xs, weights, out.as_mut_slice()?);
            Ok(())
        }
        StreamInner::Cuda(cs) => {
            let xs = inputs.iter().map(|t| check::cuda(OP, t)).collect::<Result<Vec<_>>>()?;
            cuda::ops::weighted_sum(cs, &xs, weights, check::cuda_mut(OP, out)?)
        }
    }
}

/// Converts `src` into `dst`'s dtype: f32 → bf16 rounds to nearest even, bf16 → f32 is exact
/// (same shape; equal dtypes copy).
///
/// # Errors
/// [`Error::UnsupportedDType`] for i32; device or shape mismatch.
pub fn cast(src: &Tensor, dst: &mut Tensor, s: &Stream) -> Result<()> {
    const OP: &str = "cast";
    s.check_device(OP, src.device())?;
    s.check_device(OP, dst.device())?;
    check::same_shape(OP, dst, src)?;
    for dtype in [src.dtype(), dst.dtype()] {
        if dtype == DType::I32 {
            return Err(Error::UnsupportedDType { op: OP, dtype });
        }
    }
    match s.inner() {
        StreamInner::Cpu(w) => {
            match (src.dtype(), dst.dtype()) {
                (DType::F32, DType::Bf16) => {
                    k::cast_f32_bf16(w, src.as_slice()?, dst.as_mut_slice()?)
                }
                (DType::Bf16, DType::F32) => {
                    k::cast_bf16_f32(w, src.as_slice()?, dst.as_mut_slice()?)
                }
                (DType::F32, _) => k::copy::<f32>(w, src.as_slice()?, dst.as_mut_slice()?),
                _ => k::copy::<bf16>(w, src.as_slice()?, dst.as_mut_slice()?),
            }
            Ok(())
        }
        StreamInner::Cuda(cs) => {
            cuda::ops::cast(cs, check::cuda(OP, src)?, check::cuda_mut(OP, dst)?)
        }
    }
}

/// `y = max(x, 0)` (f32, same shape).
///
/// # Errors
/// Device, dtype or shape mismatch.
pub fn relu(x: &Tensor, y: &mut Tensor, s: &Stream) -> Result<()> {
    const OP: &str = "relu";
    check::on(OP, s, DType::F32, &[x, y])?;
    check::same_shape(OP, y, x)?;
    match s.inner() {
        StreamInner::Cpu(w) => {
            k::relu(w, x.as_slice()?, y.as_mut_slice()?);
            Ok(())
        }
        StreamInner::Cuda(cs) => cuda::ops::relu(cs, check::cuda(OP, x)?, check::cuda_mut(OP, y)?),
    }
}

/// `dx = dy` where the ReLU output `y` is positive, else 0 (f32, same shape).
///
/// # Errors
/// Device, dtype or shape mismatch.
pub fn relu_backward(dy: &Tensor, y: &Tensor, dx: &mut Tensor, s: &Stream) -> Result<()> {
    const OP: &str = "relu_backward";
    check::on(OP, s, DType::F32, &[dy, y, dx])?;
    check::same_shape(OP, dx, dy)?;
    check::same_shape(OP, dx, y)?;
    match s.inner() {
        StreamInner::Cpu(w) => {
            k::relu_backward(w, dy.as_slice()?, y.as_slice()?, dx.as_mut_slice()?);
            Ok(())
        }
        StreamInner::Cuda(cs) => cuda::ops::relu_backward(
            cs,
            check::cuda(OP, dy)?,
            check::cuda(OP, y)?,
            check::cuda_mut(OP, dx)?,
        ),
    }
}

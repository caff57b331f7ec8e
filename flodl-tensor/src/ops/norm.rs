//! Reductions: dot product, L2 norms and global-norm clipping, accumulated in f64.

use super::check;
use crate::cpu::elementwise as k;
use crate::cpu::reduce;
use crate::stream::StreamInner;
use crate::{DType, Error, Result, Stream, Tensor, cuda};

/// `Σ a_i b_i` (f32 inputs of the same shape, f64 accumulation).
///
/// # Errors
/// Device, dtype or shape mismatch; CUDA errors.
pub fn dot(a: &Tensor, b: &Tensor, s: &Stream) -> Result<f64> {
    const OP: &str = "dot";
    check::on(OP, s, DType::F32, &[a, b])?;
    check::same_shape(OP, a, b)?;
    match s.inner() {
        StreamInner::Cpu(w) => Ok(reduce::dot(w, a.as_slice()?, b.as_slice()?)),
        StreamInner::Cuda(cs) => cuda::ops::dot(cs, check::cuda(OP, a)?, check::cuda(OP, b)?),
    }
}

fn sum_sq(op: &'static str, t: &Tensor, s: &Stream) -> Result<f64> {
    check::on(op, s, DType::F32, &[t])?;
    match s.inner() {
        StreamInner::Cpu(w) => Ok(reduce::sum_sq(w, t.as_slice()?)),
        StreamInner::Cuda(cs) => cuda::ops::sum_sq(cs, check::cuda(op, t)?),
    }
}

/// `‖t‖₂` (f32 input, f64 accumulation).
///
/// # Errors
/// Device or dtype mismatch; CUDA errors.
pub fn l2_norm(t: &Tensor, s: &Stream) -> Result<f64> {
    Ok(sum_sq("l2_norm", t, s)?.sqrt())
}

/// `‖a − b‖₂` without materialising the difference (f32 inputs of the same shape).
///
/// # Errors
/// Device, dtype or shape mismatch; CUDA errors.
pub fn l2_norm_diff(a: &Tensor, b: &Tensor, s: &Stream) -> Result<f64> {
    const OP: &str = "l2_norm_diff";
    check::on(OP, s, DType::F32, &[a, b])?;
    check::same_shape(OP, a, b)?;
    let sq = match s.inner() {
        StreamInner::Cpu(w) => reduce::sum_sq_diff(w, a.as_slice()?, b.as_slice()?),
        StreamInner::Cuda(cs) => {
            cuda::ops::sum_sq_diff(cs, check::cuda(OP, a)?, check::cuda(OP, b)?)?
        }
    };
    Ok(sq.sqrt())
}

/// `sqrt(Σ_t ‖t‖₂²)` over a set of f32 tensors (0 for an empty set).
///
/// # Errors
/// Device or dtype mismatch; CUDA errors.
pub fn global_l2_norm(ts: &[&Tensor], s: &Stream) -> Result<f64> {
    let mut sq = 0.0;
    for t in ts {
        sq += sum_sq("global_l2_norm", t, s)?;
    }
    Ok(sq.sqrt())
}

/// Scales every tensor by `max_norm / (norm + 1e-6)` when their global L2 norm exceeds
/// `max_norm`; returns the norm before clipping.
///
/// A non-finite norm is returned as is and nothing is scaled.
///
/// # Errors
/// [`Error::InvalidArgument`] unless `max_norm` is finite and positive; device or dtype
/// mismatch; CUDA errors.
pub fn clip_global_norm(ts: &mut [&mut Tensor], max_norm: f32, s: &Stream) -> Result<f64> {
    const OP: &str = "clip_global_norm";
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(Error::InvalidArgument { op: OP, what: "max_norm must be finite and > 0" });
    }
    for t in ts.iter() {
        check::on(OP, s, DType::F32, &[&**t])?;
    }
    let refs: Vec<&Tensor> = ts.iter().map(|t| &**t).collect();
    let norm = global_l2_norm(&refs, s)?;
    if norm.is_finite() && norm > f64::from(max_norm) {
        let coef = (f64::from(max_norm) / (norm + 1e-6)) as f32;
        for t in ts.iter_mut() {
            match s.inner() {
                StreamInner::Cpu(w) => k::scale(w, t.as_mut_slice()?, coef),
                StreamInner::Cuda(cs) => cuda::ops::scale(cs, check::cuda_mut(OP, t)?, coef)?,
            }
        }
    }
    Ok(norm)
}

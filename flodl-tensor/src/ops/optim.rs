//! Fused optimizer updates.

use super::check;
use crate::cpu::optim::{self as k, Adam, Sgd};
use crate::stream::StreamInner;
use crate::{DType, Error, Result, Stream, Tensor, cuda};

/// One SGD step with PyTorch's semantics (no dampening, no Nesterov):
/// `g = grad + weight_decay·param; buf = momentum·buf + g; param −= lr·buf`.
///
/// `momentum_buf` starts at zero, which makes the first step `buf = g`, exactly as PyTorch; with
/// `momentum == 0` the step is plain SGD (the buffer then just holds `g`).
///
/// # Errors
/// Device, dtype or shape mismatch; CUDA errors.
pub fn sgd_step(
    param: &mut Tensor,
    grad: &Tensor,
    momentum_buf: &mut Tensor,
    lr: f32,
    momentum: f32,
    weight_decay: f32,
    s: &Stream,
) -> Result<()> {
    const OP: &str = "sgd_step";
    check::on(OP, s, DType::F32, &[param, grad, momentum_buf])?;
    check::same_shape(OP, param, grad)?;
    check::same_shape(OP, param, momentum_buf)?;
    let h = Sgd { lr, momentum, weight_decay };
    match s.inner() {
        StreamInner::Cpu(w) => {
            k::sgd_step(
                w,
                h,
                param.as_mut_slice()?,
                grad.as_slice()?,
                momentum_buf.as_mut_slice()?,
            );
            Ok(())
        }
        StreamInner::Cuda(cs) => cuda::ops::sgd_step(
            cs,
            h,
            check::cuda_mut(OP, param)?,
            check::cuda(OP, grad)?,
            check::cuda_mut(OP, momentum_buf)?,
        ),
    }
}

/// One bias-corrected Adam step (`step` counts from 1), with L2 weight decay added to the
/// gradient: `g = grad + wd·p; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
/// p −= lr/(1−β1^t) · m / (sqrt(v)/sqrt(1−β2^t) + eps)`.
///
/// # Errors
/// [`Error::InvalidArgument`] for `step == 0`; device, dtype or shape mismatch; CUDA errors.
// The contract passes Adam's hyper-parameters as plain scalars, like the optimizer formulas.
#[allow(clippy::too_many_arguments)]
pub fn adam_step(
    param: &mut Tensor,
    grad: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    step: u64,
    s: &Stream,
) -> Result<()> {
    const OP: &str = "adam_step";
    if step == 0 {
        return Err(Error::InvalidArgument { op: OP, what: "step counts from 1" });
    }
    check::on(OP, s, DType::F32, &[param, grad, m, v])?;
    check::same_shape(OP, param, grad)?;
    check::same_shape(OP, param, m)?;
    check::same_shape(OP, param, v)?;
    let t = i32::try_from(step).unwrap_or(i32::MAX);
    let bc1 = 1.0 - f64::from(beta1).powi(t);
    let bc2 = 1.0 - f64::from(beta2).powi(t);
    let h = Adam {
        beta1,
        beta2,
        eps,
        weight_decay,
        step_size: (f64::from(lr) / bc1) as f32,
        inv_sqrt_bc2: (1.0 / bc2.sqrt()) as f32,
    };
    match s.inner() {
        StreamInner::Cpu(w) => {
            k::adam_step(
                w,
                h,
                param.as_mut_slice()?,
                grad.as_slice()?,
                m.as_mut_slice()?,
                v.as_mut_slice()?,
            );
            Ok(())
        }
        StreamInner::Cuda(cs) => cuda::ops::adam_step(
            cs,
            h,
            check::cuda_mut(OP, param)?,
            check::cuda(OP, grad)?,
            check::cuda_mut(OP, m)?,
            check::cuda_mut(OP, v)?,
        ),
    }
}

//! Fused optimizer updates on the CPU.

use super::CpuWorkers;

/// Hyper-parameters of one SGD step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sgd {
    pub(crate) lr: f32,
    pub(crate) momentum: f32,
    pub(crate) weight_decay: f32,
}

/// Hyper-parameters of one Adam step, with the bias corrections already folded in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Adam {
    pub(crate) beta1: f32,
    pub(crate) beta2: f32,
    pub(crate) eps: f32,
    pub(crate) weight_decay: f32,
    /// `lr / (1 − β1^t)`.
    pub(crate) step_size: f32,
    /// `1 / sqrt(1 − β2^t)`.
    pub(crate) inv_sqrt_bc2: f32,
}

/// `g = grad + wd·p; buf = μ·buf + g; p −= lr·buf`.
pub(crate) fn sgd_step(w: &CpuWorkers, h: Sgd, param: &mut [f32], grad: &[f32], buf: &mut [f32]) {
    w.split2(param, buf, |off, pc, bc| {
        let gc = &grad[off..off + pc.len()];
        for ((p, b), g) in pc.iter_mut().zip(bc.iter_mut()).zip(gc) {
            let g = *g + h.weight_decay * *p;
            *b = h.momentum * *b + g;
            *p -= h.lr * *b;
        }
    });
}

/// Bias-corrected Adam with L2 weight decay added to the gradient.
pub(crate) fn adam_step(
    w: &CpuWorkers,
    h: Adam,
    param: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
) {
    w.split3(param, m, v, |off, pc, mc, vc| {
        let gc = &grad[off..off + pc.len()];
        for (((p, m), v), g) in pc.iter_mut().zip(mc.iter_mut()).zip(vc.iter_mut()).zip(gc) {
            let g = *g + h.weight_decay * *p;
            *m = h.beta1 * *m + (1.0 - h.beta1) * g;
            *v = h.beta2 * *v + (1.0 - h.beta2) * g * g;
            let denom = v.sqrt() * h.inv_sqrt_bc2 + h.eps;
            *p -= h.step_size * *m / denom;
        }
    });
}

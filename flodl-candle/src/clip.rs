//! Gradient clipping by global norm, on a candle `GradStore`.

use candle_core::Var;
use candle_core::backprop::GradStore;
use flodl_ddp::Result;

use crate::vars::candle_error;

/// Scales the gradients of `vars` in `grads` so that their global L2 norm is at most `max_norm`,
/// and returns the norm before clipping. Variables without a gradient count as zero.
///
/// # Errors
/// candle's.
pub fn clip_grad_norm(grads: &mut GradStore, vars: &[Var], max_norm: f64) -> Result<f64> {
    let mut sum_sq = 0.0f64;
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            let s = g.sqr().and_then(|s| s.sum_all()).and_then(|s| s.to_scalar::<f32>());
            sum_sq += f64::from(s.map_err(candle_error)?);
        }
    }
    let norm = sum_sq.sqrt();
    if norm.is_finite() && norm > max_norm && norm > 0.0 {
        let scale = max_norm / norm;
        for v in vars {
            if let Some(g) = grads.remove(v.as_tensor()) {
                let scaled = g.affine(scale, 0.0).map_err(candle_error)?;
                grads.insert(v.as_tensor(), scaled);
            }
        }
    }
    Ok(norm)
}

//! Numerical divergence: the checks that stop a run whose loss or parameters are not finite.
//!
//! A rank checks the loss of every training step (free: the loss is already on the host) and
//! its parameters once per reduce: after a collective all-reduce (the average every rank now
//! holds), or in the snapshot it sends to a host average (so neither the average nor a bundle
//! saved with it is ever poisoned). A failed check is [`Error::Diverged`], which the coordinator
//! turns into the end of the run rather than the death of one rank.

use flodl_tensor::{Stream, Tensor, ops};

use crate::error::Divergence;
use crate::state::{HostState, first_where};
use crate::{Error, Result};

/// `Ok` when `loss`, the loss `rank` computed at cohort step `step`, is finite.
///
/// # Errors
/// [`Error::Diverged`] with [`Divergence::Loss`].
pub(crate) fn check_loss(loss: f32, rank: usize, step: u64) -> Result<()> {
    if loss.is_finite() {
        return Ok(());
    }
    Err(Error::Diverged { rank, step, cause: Divergence::Loss(loss), bundle: None })
}

/// `Ok` when every value of `params` (device tensors of `rank` at cohort step `step`) is
/// finite, found in one fused pass: their global L2 norm, accumulated in f64 (where no square
/// of an f32 overflows), is finite exactly when every value is.
///
/// # Errors
/// [`Error::Diverged`] with [`Divergence::Parameters`]; tensor errors.
pub(crate) fn check_parameters(
    params: &[Tensor],
    rank: usize,
    step: u64,
    stream: &Stream,
) -> Result<()> {
    let refs: Vec<&Tensor> = params.iter().collect();
    check_norm(ops::global_l2_norm(&refs, stream)?, rank, step)
}

/// `Ok` when `norm`, the global L2 norm of `rank`'s parameters at cohort step `step`
/// (accumulated in f64, as [`check_parameters`] computes it), is finite: every value is then
/// finite. For a caller that has the norm already (a reduce that measured its divergence).
///
/// # Errors
/// [`Error::Diverged`] with [`Divergence::Parameters`].
pub(crate) fn check_norm(norm: f64, rank: usize, step: u64) -> Result<()> {
    if norm.is_finite() {
        return Ok(());
    }
    Err(Error::Diverged { rank, step, cause: Divergence::Parameters, bundle: None })
}

/// `Ok` when every parameter value of `state` (the host snapshot of `rank` at cohort step
/// `step`) is finite.
///
/// # Errors
/// [`Error::Diverged`] with [`Divergence::Parameters`].
pub(crate) fn check_snapshot(state: &HostState, rank: usize, step: u64) -> Result<()> {
    let poisoned = state.params.iter().any(|v| first_where(v, |x| !x.is_finite()).is_some());
    if !poisoned {
        return Ok(());
    }
    Err(Error::Diverged { rank, step, cause: Divergence::Parameters, bundle: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_finite_values_pass() -> Result<()> {
        let stream = Stream::cpu_with_threads(1);
        for (values, finite) in [
            (vec![1.0, -2.5, f32::MAX, f32::MIN_POSITIVE], true),
            (vec![1.0, f32::NAN], false),
            (vec![f32::INFINITY, 0.0], false),
            (vec![0.0, f32::NEG_INFINITY], false),
        ] {
            let t = Tensor::from_slice(&values, &[values.len()], &stream)?;
            let state = HostState { params: vec![vec![0.5], values.clone()], buffers: Vec::new() };
            let on_device = check_parameters(&[t], 1, 7, &stream);
            let on_host = check_snapshot(&state, 1, 7);
            for (r, how) in [(on_device, "device"), (on_host, "host")] {
                match r {
                    Ok(()) => assert!(finite, "{values:?} on the {how}"),
                    Err(Error::Diverged {
                        rank: 1,
                        step: 7,
                        cause: Divergence::Parameters,
                        ..
                    }) => {
                        assert!(!finite, "{values:?} on the {how}");
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        assert!(check_loss(2.3, 0, 0).is_ok());
        assert!(matches!(
            check_loss(f32::NAN, 2, 9),
            Err(Error::Diverged { rank: 2, step: 9, cause: Divergence::Loss(l), .. }) if l.is_nan()
        ));
        Ok(())
    }
}

//! Classification heads: softmax cross-entropy with its gradient, and accuracy.

use super::check;
use crate::cpu::nn;
use crate::stream::StreamInner;
use crate::{DType, Error, Result, Stream, Tensor, cuda};

/// Checks logits `[n, c]` (f32) and labels `[n]` (i32), returning `(n, c)`.
fn check_head(
    op: &'static str,
    logits: &Tensor,
    labels: &Tensor,
    s: &Stream,
) -> Result<(usize, usize)> {
    check::on(op, s, DType::F32, &[logits])?;
    check::on(op, s, DType::I32, &[labels])?;
    let (n, c) = check::matrix(op, logits)?;
    check::shape(op, labels, &[n])?;
    if n == 0 || c == 0 {
        return Err(Error::InvalidArgument { op, what: "needs at least one row and one class" });
    }
    Ok((n, c))
}

fn check_labels(op: &'static str, labels: &Tensor, classes: usize) -> Result<()> {
    match nn::first_bad_label(labels.as_slice()?, classes) {
        Some((row, label)) => Err(Error::LabelOutOfRange { op, row, label, classes }),
        None => Ok(()),
    }
}

/// Mean over the batch of `−log softmax(logits[r])[labels[r]]`, computed stably (max-shifted);
/// writes `dlogits = (softmax − onehot) / n`, the gradient of that mean.
///
/// # Errors
/// [`Error::LabelOutOfRange`] (nothing is written), [`Error::InvalidArgument`] for an empty
/// batch; rank, shape, device or dtype mismatch; CUDA errors.
pub fn log_softmax_nll(
    logits: &Tensor,
    labels: &Tensor,
    dlogits: &mut Tensor,
    s: &Stream,
) -> Result<f32> {
    const OP: &str = "log_softmax_nll";
    let (_, c) = check_head(OP, logits, labels, s)?;
    check::on(OP, s, DType::F32, &[dlogits])?;
    check::same_shape(OP, logits, dlogits)?;
    match s.inner() {
        StreamInner::Cpu(_) => {
            check_labels(OP, labels, c)?;
            Ok(nn::log_softmax_nll(logits.as_slice()?, labels.as_slice()?, dlogits.as_mut_slice()?))
        }
        StreamInner::Cuda(cs) => cuda::ops::log_softmax_nll(
            cs,
            check::cuda(OP, logits)?,
            check::cuda(OP, labels)?,
            check::cuda_mut(OP, dlogits)?,
            c,
        ),
    }
}

/// How many rows have their largest logit (the first one on ties) at the label's index.
///
/// # Errors
/// [`Error::LabelOutOfRange`], [`Error::InvalidArgument`] for an empty batch; rank, shape,
/// device or dtype mismatch; CUDA errors.
pub fn argmax_correct(logits: &Tensor, labels: &Tensor, s: &Stream) -> Result<usize> {
    const OP: &str = "argmax_correct";
    let (_, c) = check_head(OP, logits, labels, s)?;
    match s.inner() {
        StreamInner::Cpu(_) => {
            check_labels(OP, labels, c)?;
            Ok(nn::argmax_correct(logits.as_slice()?, labels.as_slice()?))
        }
        StreamInner::Cuda(cs) => {
            cuda::ops::argmax_correct(cs, check::cuda(OP, logits)?, check::cuda(OP, labels)?, c)
        }
    }
}

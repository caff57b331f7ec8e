//! `Model`: what a tch model gives [`TchReplica`](crate::TchReplica).

use flodl_ddp::{Batch, BatchEval, Result};
use tch::Tensor;

/// A tch model whose variables live in the `VarStore` it was built on.
pub trait Model {
    /// The mean loss of `batch` (a scalar tensor that records autograd, for `backward`).
    ///
    /// # Errors
    /// Whatever the model raises (libtorch's errors through [`crate::Error`]).
    fn loss(&self, batch: &Batch) -> Result<Tensor>;

    /// The batch's summed loss and correct predictions, without training; `None` (the
    /// default) when the model does not evaluate. Called under `no_grad`.
    ///
    /// # Errors
    /// Whatever the model raises.
    fn evaluate(&self, batch: &Batch) -> Result<Option<BatchEval>> {
        let _ = batch;
        Ok(None)
    }
}

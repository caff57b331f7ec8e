//! A flodl batch's fields as tch tensors.

use flodl_ddp::{Batch, Result};
use tch::{Kind, Tensor};

use crate::error::Error;

/// Field `index` of `batch` (an `i32` host field, as token windows and labels are) as an
/// `Int64` tch tensor of the same shape, the index type of tch's embeddings and losses.
///
/// # Errors
/// flodl's when the field is missing, not `i32` or not on the host; libtorch's.
pub fn indices(batch: &Batch, index: usize) -> Result<Tensor> {
    let field = batch.field(index)?;
    let shape: Vec<i64> = field.shape().iter().map(|&d| d as i64).collect();
    let t = Tensor::f_from_slice(field.as_slice::<i32>()?)
        .and_then(|t| t.f_view(shape.as_slice()))
        .and_then(|t| t.f_to_kind(Kind::Int64))
        .map_err(Error::from)?;
    Ok(t)
}

/// Field `index` of `batch` (an `f32` host field) as a `Float` tch tensor of the same shape.
///
/// # Errors
/// As [`indices`].
pub fn values(batch: &Batch, index: usize) -> Result<Tensor> {
    let field = batch.field(index)?;
    let shape: Vec<i64> = field.shape().iter().map(|&d| d as i64).collect();
    let t = Tensor::f_from_slice(field.as_slice::<f32>()?)
        .and_then(|t| t.f_view(shape.as_slice()))
        .map_err(Error::from)?;
    Ok(t)
}

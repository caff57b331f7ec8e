//! Moving a candle model's variables to and from flat f32 values.

use candle_core::{Tensor, Var};
use flodl_ddp::{Error, HostTensor, Parameters, Result};

/// A candle model's variables as the cooperative tier reads and writes them.
#[derive(Debug)]
pub struct CandleParams<'a> {
    /// The variables, in the model's fixed order.
    pub vars: &'a [Var],
}

/// A candle error as flodl's.
pub fn candle_error(e: candle_core::Error) -> Error {
    Error::replica(e)
}

/// Copies variable `var`'s values into `out` (as many as it holds).
///
/// # Errors
/// [`Error::ReplicaMismatch`] when the sizes differ; candle's as [`Error::Replica`].
pub fn read_var(var: &Var, out: &mut [f32]) -> Result<()> {
    read_tensor(var.as_tensor(), out)
}

/// Copies candle tensor `t`'s values (f32) into `out` (as many as it holds): a variable's, or
/// its gradient's.
///
/// # Errors
/// As [`read_var`].
pub fn read_tensor(t: &Tensor, out: &mut [f32]) -> Result<()> {
    let values = t.flatten_all().and_then(|t| t.to_vec1::<f32>());
    let values = values.map_err(candle_error)?;
    if values.len() != out.len() {
        return Err(Error::mismatch("a variable's values", out.len(), values.len()));
    }
    out.copy_from_slice(&values);
    Ok(())
}

/// Overwrites variable `var` with `values` (in place).
///
/// # Errors
/// As [`read_var`].
pub fn write_var(var: &Var, values: &[f32]) -> Result<()> {
    if var.elem_count() != values.len() {
        return Err(Error::mismatch("a variable's values", var.elem_count(), values.len()));
    }
    let t = Tensor::from_slice(values, var.shape(), var.device()).map_err(candle_error)?;
    var.set(&t).map_err(candle_error)
}

/// The variables' shapes and values, for the cooperative tier's initial state.
///
/// # Errors
/// As [`read_var`].
pub fn host_tensors(vars: &[Var]) -> Result<Vec<HostTensor>> {
    vars.iter()
        .map(|v| {
            let mut data = vec![0.0; v.elem_count()];
            read_var(v, &mut data)?;
            Ok(HostTensor { shape: v.dims().to_vec(), data })
        })
        .collect()
}

impl Parameters for CandleParams<'_> {
    fn count(&self) -> usize {
        self.vars.len()
    }
    fn read(&self, index: usize, out: &mut [f32]) -> Result<()> {
        let var = self.vars.get(index).ok_or_else(|| missing(index))?;
        read_var(var, out)
    }
    fn write(&mut self, index: usize, values: &[f32]) -> Result<()> {
        let var = self.vars.get(index).ok_or_else(|| missing(index))?;
        write_var(var, values)
    }
}

fn missing(index: usize) -> Error {
    Error::mismatch("the model's variables", format!("variable {index}"), "fewer")
}

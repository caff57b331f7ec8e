//! The `Parameters` contract: the model's trainable values as the user's stack exposes them.

use flodl_tensor::Tensor;

use crate::{Error, Result};

/// A model's trainable parameters as a cooperative [`Worker`](super::Worker) reads and writes
/// them at reduces: `count()` tensors of f32 values in a fixed order, the same on every rank and
/// matching the shapes given to [`Trainer::run_cooperative`](crate::Trainer::run_cooperative)
/// (row-major, flattened).
///
/// Implemented for flat buffers (`[Vec<f32>]`, `Vec<Vec<f32>>`) and CPU flodl tensors
/// (`[Tensor]`, `Vec<Tensor>`); another stack implements it over its own variables.
pub trait Parameters {
    /// How many parameter tensors the model has.
    fn count(&self) -> usize;

    /// Copies parameter `index` into `out` (as many values as the parameter holds).
    ///
    /// # Errors
    /// Whatever reading the model raises; the index or length not fitting is
    /// [`Error::ReplicaMismatch`].
    fn read(&self, index: usize, out: &mut [f32]) -> Result<()>;

    /// Overwrites parameter `index` with `values`.
    ///
    /// # Errors
    /// As [`read`](Parameters::read).
    fn write(&mut self, index: usize, values: &[f32]) -> Result<()>;
}

/// The error of a parameter that does not fit.
pub(crate) fn misfit(index: usize, have: usize, want: usize) -> Error {
    Error::mismatch("a parameter's values", format!("{want} in parameter {index}"), have)
}

/// Copies parameter `index`, whose values are `p`, into `out`.
fn read_from(index: usize, p: &[f32], out: &mut [f32]) -> Result<()> {
    if p.len() != out.len() {
        return Err(misfit(index, p.len(), out.len()));
    }
    out.copy_from_slice(p);
    Ok(())
}

/// Overwrites parameter `index`, whose values are `p`, with `values`.
fn write_into(index: usize, p: &mut [f32], values: &[f32]) -> Result<()> {
    if p.len() != values.len() {
        return Err(misfit(index, p.len(), values.len()));
    }
    p.copy_from_slice(values);
    Ok(())
}

impl Parameters for [Vec<f32>] {
    fn count(&self) -> usize {
        self.len()
    }
    fn read(&self, index: usize, out: &mut [f32]) -> Result<()> {
        let p = self.get(index).ok_or_else(|| misfit(index, 0, out.len()))?;
        read_from(index, p, out)
    }
    fn write(&mut self, index: usize, values: &[f32]) -> Result<()> {
        let p = self.get_mut(index).ok_or_else(|| misfit(index, 0, values.len()))?;
        write_into(index, p, values)
    }
}

impl Parameters for [Tensor] {
    fn count(&self) -> usize {
        self.len()
    }
    fn read(&self, index: usize, out: &mut [f32]) -> Result<()> {
        let t = self.get(index).ok_or_else(|| misfit(index, 0, out.len()))?;
        read_from(index, t.as_slice::<f32>()?, out)
    }
    fn write(&mut self, index: usize, values: &[f32]) -> Result<()> {
        let t = self.get_mut(index).ok_or_else(|| misfit(index, 0, values.len()))?;
        write_into(index, t.as_mut_slice::<f32>()?, values)
    }
}

/// A vector of parameters is its slice (`Vec<Vec<f32>>`, `Vec<Tensor>`).
impl<P> Parameters for Vec<P>
where
    [P]: Parameters,
{
    fn count(&self) -> usize {
        self.as_slice().count()
    }
    fn read(&self, index: usize, out: &mut [f32]) -> Result<()> {
        self.as_slice().read(index, out)
    }
    fn write(&mut self, index: usize, values: &[f32]) -> Result<()> {
        self.as_mut_slice().write(index, values)
    }
}

//! The cooperative tier's `Parameters` over a `VarStore`'s variables.

use flodl_ddp::{Parameters, Result};

use crate::vars::Vars;

/// A cooperative [`Worker`](flodl_ddp::Worker) reads the trainable parameters straight from the
/// variables' storage at a reduce and writes the average straight back: one `memcpy` each way
/// per variable.
impl Parameters for Vars {
    fn count(&self) -> usize {
        self.len()
    }
    fn read(&self, index: usize, out: &mut [f32]) -> Result<()> {
        Ok(Vars::read(self, index, out)?)
    }
    fn write(&mut self, index: usize, values: &[f32]) -> Result<()> {
        Ok(Vars::write(self, index, values)?)
    }
}

//! `Vars`: a `VarStore`'s variables in a fixed order, read and written in place.

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};

/// One variable: its name in the `VarStore` and a handle sharing its storage.
#[derive(Debug)]
struct Var {
    name: String,
    tensor: Tensor,
    numel: usize,
}

/// The variables of a tch [`VarStore`], split into trainable parameters and buffers (the
/// variables that do not require a gradient), each sorted by name: the fixed order that is the
/// same on every rank that builds the same model. The handles share the variables' storage, so
/// reading and writing go straight to the model's memory: one `memcpy` per variable, no
/// intermediate buffer and no tensor allocated.
///
/// Every variable must be a contiguous `f32` tensor on the host; [`Vars::new`] checks it once
/// (tch's `VarStore` makes them so on the CPU device).
#[derive(Debug)]
pub struct Vars {
    params: Vec<Var>,
    buffers: Vec<Var>,
}

impl Vars {
    /// The variables of `vs`, in name order.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a variable that is not a contiguous `f32` host tensor.
    pub fn new(vs: &VarStore) -> Result<Vars> {
        let mut all: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let (mut params, mut buffers) = (Vec::new(), Vec::new());
        for (name, tensor) in all {
            check(&name, &tensor)?;
            let numel = tensor.numel();
            let var = Var { name, numel, tensor };
            if var.tensor.requires_grad() { params.push(var) } else { buffers.push(var) }
        }
        Ok(Vars { params, buffers })
    }

    /// Number of trainable parameters (variables).
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// Whether the store has no trainable parameter.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Number of buffers.
    pub fn buffer_count(&self) -> usize {
        self.buffers.len()
    }

    /// The parameters' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.params.iter().map(|v| v.name.as_str())
    }

    /// The parameters' shapes, in order.
    pub fn shapes(&self) -> Vec<Vec<usize>> {
        self.params.iter().map(|v| shape(&v.tensor)).collect()
    }

    /// The buffers' shapes, in order.
    pub fn buffer_shapes(&self) -> Vec<Vec<usize>> {
        self.buffers.iter().map(|v| shape(&v.tensor)).collect()
    }

    /// Total number of trainable values.
    pub fn numel(&self) -> usize {
        self.params.iter().map(|v| v.numel).sum()
    }

    /// Copies parameter `index` into `out`, read in place from the variable's storage.
    ///
    /// # Errors
    /// [`Error::Index`], or [`Error::Size`] when `out` does not hold the variable.
    pub fn read(&self, index: usize, out: &mut [f32]) -> Result<()> {
        read(pick(&self.params, index)?, out)
    }

    /// Overwrites parameter `index` with `values`, in place in the variable's storage (no
    /// autograd record: the optimizer's state is left as it is).
    ///
    /// # Errors
    /// As [`Vars::read`].
    pub fn write(&mut self, index: usize, values: &[f32]) -> Result<()> {
        write(pick(&self.params, index)?, values)
    }

    /// Copies buffer `index` into `out`.
    ///
    /// # Errors
    /// As [`Vars::read`].
    pub fn read_buffer(&self, index: usize, out: &mut [f32]) -> Result<()> {
        read(pick(&self.buffers, index)?, out)
    }

    /// Overwrites buffer `index` with `values`.
    ///
    /// # Errors
    /// As [`Vars::read`].
    pub fn write_buffer(&mut self, index: usize, values: &[f32]) -> Result<()> {
        write(pick(&self.buffers, index)?, values)
    }
}

fn shape(t: &Tensor) -> Vec<usize> {
    t.size().iter().map(|&d| d as usize).collect()
}

fn pick(vars: &[Var], index: usize) -> Result<&Var> {
    vars.get(index).ok_or(Error::Index { index, count: vars.len() })
}

/// Checks that `t` can be read and written in place as `numel` f32 values.
fn check(name: &str, t: &Tensor) -> Result<()> {
    let what = if t.kind() != Kind::Float {
        format!("{:?}", t.kind())
    } else if t.device() != Device::Cpu {
        format!("on {:?}", t.device())
    } else if !t.is_contiguous() {
        "not contiguous".to_owned()
    } else {
        return Ok(());
    };
    Err(Error::Unsupported { name: name.to_owned(), what })
}

fn fits(var: &Var, len: usize) -> Result<()> {
    if var.numel != len {
        return Err(Error::Size { name: var.name.clone(), have: var.numel, want: len });
    }
    // The variable may have been replaced since `Vars::new` (`set_data`): check again.
    check(&var.name, &var.tensor)
}

fn read(var: &Var, out: &mut [f32]) -> Result<()> {
    fits(var, out.len())?;
    if out.is_empty() {
        return Ok(());
    }
    // SAFETY: `fits` checked that the tensor is a contiguous f32 host tensor of `out.len()`
    // elements, so `data_ptr` (the first element, storage offset included) starts
    // `out.len()` initialised, aligned f32 values. The handle keeps the storage alive, and
    // nothing writes it while this borrow lives: a rank's model is used from its own thread.
    let values =
        unsafe { std::slice::from_raw_parts(var.tensor.data_ptr() as *const f32, out.len()) };
    out.copy_from_slice(values);
    Ok(())
}

fn write(var: &Var, values: &[f32]) -> Result<()> {
    fits(var, values.len())?;
    if values.is_empty() {
        return Ok(());
    }
    // SAFETY: as in `read`; the storage is writable host memory and no other Rust reference to
    // it exists while this one lives (tch hands out raw handles only, used on this thread).
    let dst =
        unsafe { std::slice::from_raw_parts_mut(var.tensor.data_ptr() as *mut f32, values.len()) };
    dst.copy_from_slice(values);
    Ok(())
}

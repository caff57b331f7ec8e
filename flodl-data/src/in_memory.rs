//! `InMemory`, a dataset whose samples all sit in host memory.

use flodl_tensor::{DType, Stream, Tensor};

use crate::batch::HostBatch;
use crate::dataset::{Dataset, check_indices};
use crate::error::{Error, Result};
use crate::layout::{Field, SampleLayout};

/// The values of one field for every sample, `n × numel` row-major.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// An f32 field.
    F32(Vec<f32>),
    /// An i32 field.
    I32(Vec<i32>),
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::I32(v) => v.len(),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            Values::F32(_) => DType::F32,
            Values::I32(_) => DType::I32,
        }
    }
}

/// A dataset held entirely in host memory, one [`Values`] per field.
#[derive(Debug, Clone)]
pub struct InMemory {
    layout: SampleLayout,
    columns: Vec<Values>,
    len: usize,
}

impl InMemory {
    /// A dataset of samples of `layout` whose field `i` holds `columns[i]`.
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] when the number of columns differs from the fields,
    /// [`Error::FieldType`] when a column's dtype differs from its field's, and
    /// [`Error::FieldLength`] when the columns do not all hold the same whole number of samples.
    pub fn new(layout: SampleLayout, columns: Vec<Values>) -> Result<Self> {
        let fields = layout.fields();
        if columns.len() != fields.len() {
            return Err(Error::InvalidLayout {
                reason: format!("{} columns for {} fields", columns.len(), fields.len()),
            });
        }
        let len = columns[0].len() / fields[0].numel();
        for (i, (c, f)) in columns.iter().zip(fields).enumerate() {
            if c.dtype() != f.dtype {
                return Err(Error::FieldType { field: i, found: c.dtype(), requested: f.dtype });
            }
            if c.len() != len * f.numel() {
                return Err(Error::FieldLength {
                    field: i,
                    len: c.len(),
                    expected: len * f.numel(),
                });
            }
        }
        Ok(Self { layout, columns, len })
    }

    /// A dataset from named tensors of shape `[n, ..]` (the per-sample shape is the rest), read
    /// to the host on `stream`.
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] for no tensors, a 0-d tensor, a repeated name or a bf16 tensor;
    /// [`Error::FieldLength`] when the tensors disagree on `n`; a tensor error when a copy fails.
    pub fn from_tensors(named: &[(&str, &Tensor)], stream: &Stream) -> Result<Self> {
        let mut fields = Vec::with_capacity(named.len());
        let mut columns = Vec::with_capacity(named.len());
        for (i, (name, t)) in named.iter().enumerate() {
            let Some((&n, rest)) = t.shape().split_first() else {
                return Err(Error::InvalidLayout {
                    reason: format!("tensor {name:?} has no sample dimension"),
                });
            };
            let n0 = named[0].1.shape().first().copied().unwrap_or(0);
            if n != n0 {
                return Err(Error::FieldLength { field: i, len: n, expected: n0 });
            }
            fields.push(Field::new(*name, rest, t.dtype()));
            columns.push(match t.dtype() {
                DType::F32 => Values::F32(t.to_vec::<f32>(stream)?),
                DType::I32 => Values::I32(t.to_vec::<i32>(stream)?),
                other => {
                    return Err(Error::InvalidLayout {
                        reason: format!("tensor {name:?}: dtype {other} is not supported"),
                    });
                }
            });
        }
        Self::new(SampleLayout::new(fields)?, columns)
    }

    /// The values of field `i` for every sample.
    ///
    /// # Errors
    /// [`Error::NoSuchField`] when `i` is past the last field.
    pub fn values(&self, i: usize) -> Result<&Values> {
        self.columns.get(i).ok_or(Error::NoSuchField { field: i, fields: self.columns.len() })
    }
}

impl Dataset for InMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn layout(&self) -> &SampleLayout {
        &self.layout
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> Result<()> {
        check_indices(indices, self.len)?;
        out.prepare(&self.layout, indices.len())?;
        for (i, (column, field)) in self.columns.iter().zip(self.layout.fields()).enumerate() {
            let k = field.numel();
            match column {
                Values::F32(src) => gather(src, k, indices, out.f32_mut(i)?),
                Values::I32(src) => gather(src, k, indices, out.i32_mut(i)?),
            }
        }
        Ok(())
    }
}

/// Copies rows `indices` of `src` (rows of `k` values) into consecutive rows of `dst`.
pub(crate) fn gather<T: Copy>(src: &[T], k: usize, indices: &[usize], dst: &mut [T]) {
    for (row, &i) in dst.chunks_exact_mut(k).zip(indices) {
        row.copy_from_slice(&src[i * k..(i + 1) * k]);
    }
}

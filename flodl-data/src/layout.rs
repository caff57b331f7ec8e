//! The layout of one sample: named fields, each with a shape and a dtype.

use flodl_tensor::DType;

use crate::error::{Error, Result};

/// One named field of a sample (for example MNIST's `image` and `label`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Field {
    /// Name, unique within the layout.
    pub name: String,
    /// Shape of the field for one sample (`[]` for a scalar).
    pub shape: Vec<usize>,
    /// Element type: [`DType::F32`] or [`DType::I32`].
    pub dtype: DType,
}

impl Field {
    /// A field named `name` of per-sample `shape` and `dtype`.
    pub fn new(name: impl Into<String>, shape: &[usize], dtype: DType) -> Self {
        Self { name: name.into(), shape: shape.to_vec(), dtype }
    }

    /// Elements per sample (the product of the shape; 1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes per sample.
    pub fn sample_bytes(&self) -> usize {
        self.numel() * self.dtype.size_in_bytes()
    }

    /// Shape of this field for a batch of `n` samples: `[n, shape..]`.
    pub fn batch_shape(&self, n: usize) -> Vec<usize> {
        let mut s = Vec::with_capacity(self.shape.len() + 1);
        s.push(n);
        s.extend_from_slice(&self.shape);
        s
    }
}

/// The fields of one sample, in a fixed order.
///
/// # Invariants
/// At least one field; names are unique; dtypes are [`DType::F32`] or [`DType::I32`]; every
/// field has at least one element; a sample's size in bytes is computed without overflow.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SampleLayout {
    fields: Vec<Field>,
}

impl SampleLayout {
    /// A layout of `fields`.
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] when `fields` is empty, repeats a name, holds a field with no
    /// elements, uses a dtype other than f32 or i32, or whose sample size overflows.
    pub fn new(fields: Vec<Field>) -> Result<Self> {
        if fields.is_empty() {
            return Err(Error::InvalidLayout {
                reason: "a sample needs at least one field".into(),
            });
        }
        for (i, f) in fields.iter().enumerate() {
            if fields[..i].iter().any(|g| g.name == f.name) {
                return Err(Error::InvalidLayout {
                    reason: format!("field name {:?} is repeated", f.name),
                });
            }
            let bytes = f
                .shape
                .iter()
                .try_fold(f.dtype.size_in_bytes(), |acc, &d| acc.checked_mul(d))
                .filter(|&b| b <= isize::MAX as usize);
            if bytes.is_none() {
                return Err(Error::InvalidLayout {
                    reason: format!(
                        "field {:?}: shape {:?} overflows a sample's size",
                        f.name, f.shape
                    ),
                });
            }
            if f.numel() == 0 {
                return Err(Error::InvalidLayout {
                    reason: format!("field {:?} has no elements (shape {:?})", f.name, f.shape),
                });
            }
            if !matches!(f.dtype, DType::F32 | DType::I32) {
                return Err(Error::InvalidLayout {
                    reason: format!("field {:?}: dtype {} is not supported", f.name, f.dtype),
                });
            }
        }
        let total = fields.iter().try_fold(0usize, |acc, f| acc.checked_add(f.sample_bytes()));
        if total.is_none_or(|t| t > isize::MAX as usize) {
            return Err(Error::InvalidLayout {
                reason: "the fields overflow a sample's size".into(),
            });
        }
        Ok(Self { fields })
    }

    /// A layout of fields the caller knows satisfy the invariants (crate-internal constants).
    pub(crate) fn trusted(fields: Vec<Field>) -> Self {
        debug_assert!(Self::new(fields.clone()).is_ok());
        Self { fields }
    }

    /// The fields, in order.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// The field at `index`.
    ///
    /// # Errors
    /// [`Error::NoSuchField`] when `index` is past the last field.
    pub fn field(&self, index: usize) -> Result<&Field> {
        self.fields.get(index).ok_or(Error::NoSuchField { field: index, fields: self.fields.len() })
    }

    /// Index of the field named `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    /// Bytes of one sample, all fields together.
    pub fn sample_bytes(&self) -> usize {
        self.fields.iter().map(Field::sample_bytes).sum()
    }
}

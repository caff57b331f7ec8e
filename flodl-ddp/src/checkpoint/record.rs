//! Stored tensors: [`TensorRecord`] and the named, ordered [`TensorSet`].

use super::dtype::StoredDType;
use super::error::{CheckpointError, Result};
use super::signature::{ModelSignature, SignatureEntry};

/// Bytes a tensor of `shape` and `dtype` occupies, or `None` when that overflows.
pub(crate) fn byte_len(shape: &[usize], dtype: StoredDType) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))?.checked_mul(dtype.size_in_bytes())
}

/// One stored tensor: a name, dtype, shape and its elements as little-endian bytes.
///
/// The byte length always equals `numel × dtype size` (checked on construction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRecord {
    name: String,
    dtype: StoredDType,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl TensorRecord {
    /// A record from raw little-endian bytes.
    ///
    /// # Errors
    /// [`CheckpointError::Malformed`] when `data.len()` is not `numel × dtype size`.
    pub fn from_le_bytes(
        name: impl Into<String>,
        dtype: StoredDType,
        shape: Vec<usize>,
        data: Vec<u8>,
    ) -> Result<Self> {
        let name = name.into();
        match byte_len(&shape, dtype) {
            Some(n) if n == data.len() => Ok(TensorRecord { name, dtype, shape, data }),
            expected => Err(CheckpointError::malformed(format!(
                "tensor {name}: {} bytes for {dtype} {shape:?} (needs {expected:?})",
                data.len()
            ))),
        }
    }

    /// A record of `f32` values.
    ///
    /// # Errors
    /// [`CheckpointError::Malformed`] when `values.len()` is not the shape's element count.
    pub fn from_f32(name: impl Into<String>, shape: Vec<usize>, values: &[f32]) -> Result<Self> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_le_bytes(name, StoredDType::F32, shape, data)
    }

    /// A record of `i32` values.
    ///
    /// # Errors
    /// [`CheckpointError::Malformed`] when `values.len()` is not the shape's element count.
    pub fn from_i32(name: impl Into<String>, shape: Vec<usize>, values: &[i32]) -> Result<Self> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_le_bytes(name, StoredDType::I32, shape, data)
    }

    /// A record of bfloat16 values given as their raw bit patterns.
    ///
    /// # Errors
    /// [`CheckpointError::Malformed`] when `bits.len()` is not the shape's element count.
    pub fn from_bf16_bits(
        name: impl Into<String>,
        shape: Vec<usize>,
        bits: &[u16],
    ) -> Result<Self> {
        let data = bits.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_le_bytes(name, StoredDType::Bf16, shape, data)
    }

    /// The tensor's name (unique within its [`TensorSet`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The element type.
    pub fn dtype(&self) -> StoredDType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len() / self.dtype.size_in_bytes()
    }

    /// The elements as little-endian bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The elements as `f32`, or `None` when the dtype is not [`StoredDType::F32`].
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        (self.dtype == StoredDType::F32).then(|| {
            self.data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }

    /// The elements as `i32`, or `None` when the dtype is not [`StoredDType::I32`].
    pub fn to_i32_vec(&self) -> Option<Vec<i32>> {
        (self.dtype == StoredDType::I32).then(|| {
            self.data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }

    /// The bfloat16 bit patterns, or `None` when the dtype is not [`StoredDType::Bf16`].
    pub fn to_bf16_bits(&self) -> Option<Vec<u16>> {
        (self.dtype == StoredDType::Bf16)
            .then(|| self.data.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect())
    }

    /// Its signature entry (name, shape, dtype).
    pub fn signature_entry(&self) -> SignatureEntry {
        SignatureEntry { name: self.name.clone(), shape: self.shape.clone(), dtype: self.dtype }
    }

    /// Checks that a target of `shape` and `dtype` can receive this record.
    pub(crate) fn check_target(&self, shape: &[usize], dtype: StoredDType) -> Result<()> {
        if self.shape == shape && self.dtype == dtype {
            Ok(())
        } else {
            Err(CheckpointError::TensorMismatch {
                name: self.name.clone(),
                stored_shape: self.shape.clone(),
                stored_dtype: self.dtype,
                target_shape: shape.to_vec(),
                target_dtype: dtype,
            })
        }
    }
}

/// An ordered list of [`TensorRecord`]s with unique names (parameters, buffers, optimizer state).
///
/// Order is significant: a restore writes record `i` into target tensor `i`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TensorSet {
    records: Vec<TensorRecord>,
}

impl TensorSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// A set from records in order.
    ///
    /// # Errors
    /// [`CheckpointError::Malformed`] when two records share a name.
    pub fn from_records(records: Vec<TensorRecord>) -> Result<Self> {
        let mut set = TensorSet::new();
        for r in records {
            set.push(r)?;
        }
        Ok(set)
    }

    /// Appends a record.
    ///
    /// # Errors
    /// [`CheckpointError::Malformed`] when the name is already in the set.
    pub fn push(&mut self, record: TensorRecord) -> Result<()> {
        if self.get(record.name()).is_some() {
            return Err(CheckpointError::malformed(format!(
                "duplicate tensor name {:?}",
                record.name()
            )));
        }
        self.records.push(record);
        Ok(())
    }

    /// The records in order.
    pub fn records(&self) -> &[TensorRecord] {
        &self.records
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The record with this name.
    pub fn get(&self, name: &str) -> Option<&TensorRecord> {
        self.records.iter().find(|r| r.name == name)
    }

    /// Total bytes of element data.
    pub fn data_bytes(&self) -> usize {
        self.records.iter().map(|r| r.data.len()).sum()
    }

    /// The names, shapes and dtypes of the records, in order.
    pub fn signature(&self) -> ModelSignature {
        ModelSignature::new(self.records.iter().map(TensorRecord::signature_entry).collect())
    }

    /// Checks that targets described by `(shape, dtype)` pairs, in order, can receive this set:
    /// same count, and each shape and dtype equal.
    ///
    /// # Errors
    /// [`CheckpointError::CountMismatch`] or the first [`CheckpointError::TensorMismatch`].
    pub fn check_shapes<'a>(
        &self,
        set: &str,
        targets: impl ExactSizeIterator<Item = (&'a [usize], StoredDType)>,
    ) -> Result<()> {
        if targets.len() != self.records.len() {
            return Err(CheckpointError::CountMismatch {
                set: set.to_string(),
                expected: self.records.len(),
                found: targets.len(),
            });
        }
        self.records
            .iter()
            .zip(targets)
            .try_for_each(|(r, (shape, dtype))| r.check_target(shape, dtype))
    }
}

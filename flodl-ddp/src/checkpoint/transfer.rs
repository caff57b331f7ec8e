//! Moving tensors between devices and checkpoints: capture from, and checked restore into,
//! [`Tensor`] lists.

use std::borrow::{Borrow, BorrowMut};

use flodl_tensor::{DType, Stream, Tensor, bf16};

use super::bundle::Checkpoint;
use super::dtype::StoredDType;
use super::error::{CheckpointError, Result};
use super::record::{TensorRecord, TensorSet};
use super::signature::{ModelSignature, SignatureEntry};

impl From<DType> for StoredDType {
    fn from(d: DType) -> Self {
        match d {
            DType::F32 => StoredDType::F32,
            DType::Bf16 => StoredDType::Bf16,
            DType::I32 => StoredDType::I32,
        }
    }
}

impl From<StoredDType> for DType {
    fn from(d: StoredDType) -> Self {
        match d {
            StoredDType::F32 => DType::F32,
            StoredDType::Bf16 => DType::Bf16,
            StoredDType::I32 => DType::I32,
        }
    }
}

fn le_words<const N: usize>(data: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    data.chunks_exact(N).map(|c| {
        let mut w = [0u8; N];
        w.copy_from_slice(c);
        w
    })
}

impl TensorRecord {
    /// Copies `tensor` (any device) to a record named `name`; waits for the copy on `stream`.
    ///
    /// # Errors
    /// [`CheckpointError::Tensor`] when the device-to-host copy fails.
    pub fn capture(name: impl Into<String>, tensor: &Tensor, stream: &Stream) -> Result<Self> {
        let shape = tensor.shape().to_vec();
        match tensor.dtype() {
            DType::F32 => Self::from_f32(name, shape, &tensor.to_vec::<f32>(stream)?),
            DType::I32 => Self::from_i32(name, shape, &tensor.to_vec::<i32>(stream)?),
            DType::Bf16 => {
                let bits: Vec<u16> =
                    tensor.to_vec::<bf16>(stream)?.iter().map(|v| v.to_bits()).collect();
                Self::from_bf16_bits(name, shape, &bits)
            }
        }
    }

    /// A new tensor holding this record, on `stream`'s device.
    ///
    /// # Errors
    /// [`CheckpointError::Tensor`] when allocation or the host-to-device copy fails.
    pub fn to_tensor(&self, stream: &Stream) -> Result<Tensor> {
        let shape = self.shape();
        Ok(match self.dtype() {
            StoredDType::F32 => {
                let v: Vec<f32> = le_words::<4>(self.data()).map(f32::from_le_bytes).collect();
                Tensor::from_slice(&v, shape, stream)?
            }
            StoredDType::I32 => {
                let v: Vec<i32> = le_words::<4>(self.data()).map(i32::from_le_bytes).collect();
                Tensor::from_slice(&v, shape, stream)?
            }
            StoredDType::Bf16 => {
                let v: Vec<bf16> = le_words::<2>(self.data())
                    .map(|w| bf16::from_bits(u16::from_le_bytes(w)))
                    .collect();
                Tensor::from_slice(&v, shape, stream)?
            }
        })
    }

    /// Checks that `target` has this record's shape and dtype.
    ///
    /// # Errors
    /// [`CheckpointError::TensorMismatch`].
    pub fn check_tensor(&self, target: &Tensor) -> Result<()> {
        self.check_target(target.shape(), target.dtype().into())
    }

    /// Writes this record into `target` after checking its shape and dtype.
    ///
    /// # Errors
    /// [`CheckpointError::TensorMismatch`] (nothing written), or [`CheckpointError::Tensor`]
    /// when the host-to-device copy fails.
    pub fn write_into(&self, target: &mut Tensor, stream: &Stream) -> Result<()> {
        self.check_tensor(target)?;
        match self.dtype() {
            StoredDType::F32 => {
                let v: Vec<f32> = le_words::<4>(self.data()).map(f32::from_le_bytes).collect();
                target.copy_from_host(&v, stream)?;
            }
            StoredDType::I32 => {
                let v: Vec<i32> = le_words::<4>(self.data()).map(i32::from_le_bytes).collect();
                target.copy_from_host(&v, stream)?;
            }
            StoredDType::Bf16 => {
                let v: Vec<bf16> = le_words::<2>(self.data())
                    .map(|w| bf16::from_bits(u16::from_le_bytes(w)))
                    .collect();
                target.copy_from_host(&v, stream)?;
            }
        }
        Ok(())
    }
}

impl TensorSet {
    /// Copies `tensors` (any device, in order) into a set with the given `names`.
    ///
    /// # Errors
    /// [`CheckpointError::CountMismatch`] when `names` and `tensors` differ in length,
    /// [`CheckpointError::Malformed`] for a duplicate name, [`CheckpointError::Tensor`] when a
    /// copy fails.
    pub fn capture<N: AsRef<str>, T: Borrow<Tensor>>(
        names: &[N],
        tensors: &[T],
        stream: &Stream,
    ) -> Result<Self> {
        if names.len() != tensors.len() {
            return Err(CheckpointError::CountMismatch {
                set: "names".to_string(),
                expected: tensors.len(),
                found: names.len(),
            });
        }
        let mut set = TensorSet::new();
        for (name, t) in names.iter().zip(tensors) {
            set.push(TensorRecord::capture(name.as_ref(), t.borrow(), stream)?)?;
        }
        Ok(set)
    }

    /// Copies `tensors` into a set named `<prefix>.0`, `<prefix>.1`, ...
    ///
    /// # Errors
    /// [`CheckpointError::Tensor`] when a copy fails.
    pub fn capture_indexed<T: Borrow<Tensor>>(
        prefix: &str,
        tensors: &[T],
        stream: &Stream,
    ) -> Result<Self> {
        let names: Vec<String> = (0..tensors.len()).map(|i| format!("{prefix}.{i}")).collect();
        Self::capture(&names, tensors, stream)
    }

    /// Checks that `targets` can receive this set: same count, each shape and dtype equal.
    /// `set` names the set in errors.
    ///
    /// # Errors
    /// [`CheckpointError::CountMismatch`] or the first [`CheckpointError::TensorMismatch`].
    pub fn check_tensors<T: Borrow<Tensor>>(&self, set: &str, targets: &[T]) -> Result<()> {
        self.check_shapes(
            set,
            targets.iter().map(|t| (t.borrow().shape(), StoredDType::from(t.borrow().dtype()))),
        )
    }

    /// Writes record `i` into `targets[i]`, after checking every target first: on a mismatch
    /// nothing is written.
    ///
    /// # Errors
    /// As [`TensorSet::check_tensors`], or [`CheckpointError::Tensor`] when a host-to-device
    /// copy fails (tensors before it are then already written).
    pub fn restore_into<T: BorrowMut<Tensor>>(
        &self,
        set: &str,
        targets: &mut [T],
        stream: &Stream,
    ) -> Result<()> {
        self.check_tensors(set, targets)?;
        self.records()
            .iter()
            .zip(targets.iter_mut())
            .try_for_each(|(r, t)| r.write_into(t.borrow_mut(), stream))
    }

    /// New tensors holding the set, in order, on `stream`'s device.
    ///
    /// # Errors
    /// [`CheckpointError::Tensor`] when allocation or a copy fails.
    pub fn to_tensors(&self, stream: &Stream) -> Result<Vec<Tensor>> {
        self.records().iter().map(|r| r.to_tensor(stream)).collect()
    }
}

impl ModelSignature {
    /// The signature of a running model: `names` paired with `tensors`' shapes and dtypes
    /// (no data copied).
    ///
    /// # Errors
    /// [`CheckpointError::CountMismatch`] when the lists differ in length.
    pub fn of_tensors<N: AsRef<str>, T: Borrow<Tensor>>(
        names: &[N],
        tensors: &[T],
    ) -> Result<Self> {
        if names.len() != tensors.len() {
            return Err(CheckpointError::CountMismatch {
                set: "names".to_string(),
                expected: tensors.len(),
                found: names.len(),
            });
        }
        Ok(ModelSignature::new(
            names
                .iter()
                .zip(tensors)
                .map(|(n, t)| SignatureEntry {
                    name: n.as_ref().to_string(),
                    shape: t.borrow().shape().to_vec(),
                    dtype: t.borrow().dtype().into(),
                })
                .collect(),
        ))
    }
}

impl ModelSignature {
    /// The signature of a running model whose tensors are named `<prefix>.0`, `<prefix>.1`, ...
    /// (as [`TensorSet::capture_indexed`] names them).
    pub fn of_indexed<T: Borrow<Tensor>>(prefix: &str, tensors: &[T]) -> Self {
        ModelSignature::new(
            tensors
                .iter()
                .enumerate()
                .map(|(i, t)| SignatureEntry {
                    name: format!("{prefix}.{i}"),
                    shape: t.borrow().shape().to_vec(),
                    dtype: t.borrow().dtype().into(),
                })
                .collect(),
        )
    }
}

impl Checkpoint {
    /// Writes the stored parameters and buffers into a replica's tensors, after checking every
    /// target of both lists: on any mismatch nothing is written.
    ///
    /// # Errors
    /// [`CheckpointError::CountMismatch`] / [`CheckpointError::TensorMismatch`] (nothing
    /// written), or [`CheckpointError::Tensor`] when a copy fails.
    pub fn restore_model_into<P: BorrowMut<Tensor>, B: BorrowMut<Tensor>>(
        &self,
        params: &mut [P],
        buffers: &mut [B],
        stream: &Stream,
    ) -> Result<()> {
        self.params.check_tensors("params", params)?;
        self.buffers.check_tensors("buffers", buffers)?;
        self.params.restore_into("params", params, stream)?;
        self.buffers.restore_into("buffers", buffers, stream)
    }
}

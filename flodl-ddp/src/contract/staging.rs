//! Device batches: allocating them for a dataset layout and filling them from host batches.

use flodl_data::{HostBatch, SampleLayout};
use flodl_tensor::{DType, Stream, Tensor};

use crate::Result;
use crate::config_error::{ConfigError, Field};
use crate::contract::replica::Batch;

/// The device shape of `n` samples of a field of `numel` values: `[n]` or `[n, numel]`.
fn batch_shape(n: usize, numel: usize) -> Vec<usize> {
    if numel == 1 { vec![n] } else { vec![n, numel] }
}

/// A device batch of `n` samples laid out like `layout`, zero-filled, on `stream`'s device.
///
/// # Errors
/// [`crate::Error::Invalid`] for a field dtype other than f32 or i32; tensor errors from allocation.
pub(crate) fn device_batch(layout: &SampleLayout, n: usize, stream: &Stream) -> Result<Batch> {
    let mut fields = Vec::with_capacity(layout.fields().len());
    for f in layout.fields() {
        if !matches!(f.dtype, DType::F32 | DType::I32) {
            return Err(ConfigError::unsupported(
                Field::Dataset,
                format!("field {} has dtype {:?}; batches carry f32 or i32", f.name, f.dtype),
            )
            .into());
        }
        fields.push(Tensor::zeros(&batch_shape(n, f.numel()), f.dtype, stream)?);
    }
    Batch::new(fields)
}

/// Hands a host batch to a device batch of the same size and layout, ordered on `stream`. On
/// a GPU the copy is asynchronous from the host batch's page-locked buffers, which track it:
/// the next fetch into `host` waits for the copy before overwriting them, so the upload never
/// blocks the rank and never reads a refilled buffer. On the CPU the buffers are swapped.
///
/// # Errors
/// Data errors when the host batch lacks a field or holds another dtype, shape or device.
pub(crate) fn upload(host: &mut HostBatch, batch: &mut Batch, stream: &Stream) -> Result<()> {
    for (i, t) in batch.fields_mut().iter_mut().enumerate() {
        host.upload_field(i, t, stream)?;
    }
    Ok(())
}

//! Host batches: one typed, reusable host buffer per field of a layout.

use flodl_tensor::{DType, Device, PinnedBuffer, Stream, Tensor};

use crate::error::{Error, Result};
use crate::layout::SampleLayout;

/// The host buffer of one field: `len × numel` elements, row-major by sample.
#[derive(Debug)]
pub(crate) enum Column {
    F32(PinnedBuffer<f32>),
    I32(PinnedBuffer<i32>),
    // A batch for the CPU holds CPU tensors of shape `[len, ..]`, so a prefetcher hands them
    // over as the device batch without a copy.
    Cpu(Tensor),
}

impl Column {
    fn alloc(field: &crate::layout::Field, n: usize, device: Device) -> Result<Self> {
        Ok(match (device, field.dtype) {
            (Device::Cpu, dtype) => Column::Cpu(Tensor::zeros(
                &field.batch_shape(n),
                dtype,
                &Stream::cpu_with_threads(1),
            )?),
            (_, DType::I32) => Column::I32(PinnedBuffer::new(n * field.numel(), device)?),
            // SampleLayout admits only f32 and i32.
            (_, _) => Column::F32(PinnedBuffer::new(n * field.numel(), device)?),
        })
    }

    fn len(&self) -> usize {
        match self {
            Column::F32(b) => b.len(),
            Column::I32(b) => b.len(),
            Column::Cpu(t) => t.numel(),
        }
    }

    fn view(&self) -> Result<View<'_>> {
        Ok(match self {
            Column::F32(b) => View::F32(b.as_slice()?),
            Column::I32(b) => View::I32(b.as_slice()?),
            Column::Cpu(t) if t.dtype() == DType::I32 => View::I32(t.as_slice()?),
            Column::Cpu(t) => View::F32(t.as_slice()?),
        })
    }

    fn view_mut(&mut self) -> Result<ViewMut<'_>> {
        Ok(match self {
            Column::F32(b) => ViewMut::F32(b.as_mut_slice()?),
            Column::I32(b) => ViewMut::I32(b.as_mut_slice()?),
            Column::Cpu(t) => {
                if t.dtype() == DType::I32 {
                    ViewMut::I32(t.as_mut_slice()?)
                } else {
                    ViewMut::F32(t.as_mut_slice()?)
                }
            }
        })
    }
}

/// A read view of one field's buffer.
#[derive(Debug)]
pub(crate) enum View<'a> {
    F32(&'a [f32]),
    I32(&'a [i32]),
}

/// A write view of one field's buffer.
#[derive(Debug)]
pub(crate) enum ViewMut<'a> {
    F32(&'a mut [f32]),
    I32(&'a mut [i32]),
}

/// Copies rows `k` values wide: row `from` of `src` into row `to` of `dst` (same dtype).
pub(crate) fn copy_row_view(
    src: &View<'_>,
    from: usize,
    dst: &mut ViewMut<'_>,
    to: usize,
    k: usize,
) {
    match (src, dst) {
        (View::F32(s), ViewMut::F32(d)) => {
            d[to * k..(to + 1) * k].copy_from_slice(&s[from * k..(from + 1) * k]);
        }
        (View::I32(s), ViewMut::I32(d)) => {
            d[to * k..(to + 1) * k].copy_from_slice(&s[from * k..(from + 1) * k]);
        }
        // Views of one layout always pair f32 with f32 and i32 with i32.
        _ => {}
    }
}

/// A batch of samples in host memory: one buffer per field of a [`SampleLayout`], holding
/// [`HostBatch::len`] samples.
///
/// Buffers are reused across fetches and reallocated only when the number of samples changes.
/// A batch made for a CUDA device holds page-locked buffers, so host-to-device copies from it
/// are asynchronous; a batch made for the CPU holds CPU tensors, which a prefetcher hands over
/// without copying.
#[derive(Debug)]
pub struct HostBatch {
    layout: SampleLayout,
    device: Device,
    len: usize,
    columns: Vec<Column>,
}

impl HostBatch {
    /// An empty batch for samples of `layout`, with buffers suited to copies to `device`.
    pub fn new(layout: &SampleLayout, device: Device) -> Self {
        Self { layout: layout.clone(), device, len: 0, columns: Vec::new() }
    }

    /// Makes room for exactly `n` samples of `layout` (contents unspecified until written).
    ///
    /// Datasets call this at the start of [`crate::Dataset::fetch`].
    ///
    /// # Errors
    /// [`Error::LayoutMismatch`] when the batch was made for another layout; a tensor error when
    /// a page-locked allocation fails.
    pub fn prepare(&mut self, layout: &SampleLayout, n: usize) -> Result<()> {
        if *layout != self.layout {
            return Err(Error::LayoutMismatch);
        }
        if n == self.len && self.columns.len() == self.layout.fields().len() {
            return Ok(());
        }
        let mut columns = Vec::with_capacity(self.layout.fields().len());
        for f in self.layout.fields() {
            columns.push(Column::alloc(f, n, self.device)?);
        }
        self.columns = columns;
        self.len = n;
        Ok(())
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no samples are held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The layout of the samples.
    pub fn layout(&self) -> &SampleLayout {
        &self.layout
    }

    /// The device the buffers are suited to.
    pub fn device(&self) -> Device {
        self.device
    }

    fn column(&self, field: usize) -> Result<&Column> {
        self.columns.get(field).ok_or(Error::NoSuchField { field, fields: self.columns.len() })
    }

    fn column_mut(&mut self, field: usize) -> Result<&mut Column> {
        let fields = self.columns.len();
        self.columns.get_mut(field).ok_or(Error::NoSuchField { field, fields })
    }

    /// The values of an f32 field, `len × numel` row-major.
    ///
    /// # Errors
    /// [`Error::NoSuchField`] for a field past the layout (or before [`HostBatch::prepare`]),
    /// [`Error::FieldType`] when the field is not f32.
    pub fn f32(&self, field: usize) -> Result<&[f32]> {
        match self.column(field)?.view()? {
            View::F32(v) => Ok(v),
            View::I32(_) => Err(type_error(field, DType::I32, DType::F32)),
        }
    }

    /// The values of an f32 field, mutable.
    ///
    /// # Errors
    /// As [`HostBatch::f32`].
    pub fn f32_mut(&mut self, field: usize) -> Result<&mut [f32]> {
        match self.column_mut(field)?.view_mut()? {
            ViewMut::F32(v) => Ok(v),
            ViewMut::I32(_) => Err(type_error(field, DType::I32, DType::F32)),
        }
    }

    /// The values of an i32 field, `len × numel` row-major.
    ///
    /// # Errors
    /// [`Error::NoSuchField`] for a field past the layout (or before [`HostBatch::prepare`]),
    /// [`Error::FieldType`] when the field is not i32.
    pub fn i32(&self, field: usize) -> Result<&[i32]> {
        match self.column(field)?.view()? {
            View::I32(v) => Ok(v),
            View::F32(_) => Err(type_error(field, DType::F32, DType::I32)),
        }
    }

    /// The values of an i32 field, mutable.
    ///
    /// # Errors
    /// As [`HostBatch::i32`].
    pub fn i32_mut(&mut self, field: usize) -> Result<&mut [i32]> {
        match self.column_mut(field)?.view_mut()? {
            ViewMut::I32(v) => Ok(v),
            ViewMut::F32(_) => Err(type_error(field, DType::F32, DType::I32)),
        }
    }

    /// Hands field `field`'s values to `dst`, a tensor of the field's batch shape and dtype on
    /// `stream`'s device. From a batch made for a CUDA device: an asynchronous copy from the
    /// page-locked buffer, which tracks it (the next write into the batch, such as the next
    /// fetch, and dropping the batch wait for the copy, so the device never reads a refilled
    /// buffer). From a CPU batch: the buffers are swapped, no copy (the batch keeps `dst`'s old
    /// buffer and overwrites it at the next fetch) when `dst` has the field's batch shape, else
    /// the values are copied.
    ///
    /// # Errors
    /// [`Error::NoSuchField`] for a field past the layout (or before [`HostBatch::prepare`]);
    /// a tensor error when `dst` has another dtype, shape or device than the field and `stream`.
    pub fn upload_field(&mut self, field: usize, dst: &mut Tensor, stream: &Stream) -> Result<()> {
        match self.column_mut(field)? {
            Column::F32(b) => dst.copy_from_pinned_async(b, stream)?,
            Column::I32(b) => dst.copy_from_pinned_async(b, stream)?,
            Column::Cpu(t)
                if t.shape() == dst.shape()
                    && t.dtype() == dst.dtype()
                    && t.device() == dst.device() =>
            {
                std::mem::swap(t, dst)
            }
            // Another shape of as many values (`[n, 28, 28]` into `[n, 784]`), or another
            // device: a copy, which names any other mismatch.
            Column::Cpu(t) if t.dtype() == DType::I32 => {
                dst.copy_from_host(t.as_slice::<i32>()?, stream)?
            }
            Column::Cpu(t) => dst.copy_from_host(t.as_slice::<f32>()?, stream)?,
        }
        Ok(())
    }

    /// Views of every field at once (crate-internal: bulk copies).
    pub(crate) fn views(&self) -> Result<Vec<View<'_>>> {
        self.columns.iter().map(Column::view).collect()
    }

    /// Mutable views of every field at once (crate-internal: bulk copies).
    pub(crate) fn views_mut(&mut self) -> Result<Vec<ViewMut<'_>>> {
        self.columns.iter_mut().map(Column::view_mut).collect()
    }

    /// Moves the buffers out as CPU tensors `[len, ..]` (one per field), leaving the batch
    /// empty; `None` (and the batch untouched) when it was not made for the CPU.
    pub(crate) fn take_tensors(&mut self) -> Option<Vec<Tensor>> {
        if self.columns.is_empty() || !self.columns.iter().all(|c| matches!(c, Column::Cpu(_))) {
            return None;
        }
        self.len = 0;
        Some(
            std::mem::take(&mut self.columns)
                .into_iter()
                .filter_map(|c| match c {
                    Column::Cpu(t) => Some(t),
                    Column::F32(_) | Column::I32(_) => None,
                })
                .collect(),
        )
    }

    /// Adopts CPU tensors given back by a consumer as the buffers of an empty CPU batch, when
    /// they fit the layout (one per field, `[n, ..]` for one `n`, right dtypes); else drops them.
    pub(crate) fn adopt(&mut self, tensors: Vec<Tensor>) {
        if !self.columns.is_empty() || self.device != Device::Cpu {
            return;
        }
        let fields = self.layout.fields();
        let n = tensors.first().and_then(|t| t.shape().first().copied()).unwrap_or(0);
        let fits = tensors.len() == fields.len()
            && tensors.iter().zip(fields).all(|(t, f)| {
                t.device() == Device::Cpu && t.dtype() == f.dtype && t.shape() == f.batch_shape(n)
            });
        if fits {
            self.columns = tensors.into_iter().map(Column::Cpu).collect();
            self.len = n;
        }
    }

    /// The buffers, one per field (crate-internal: the prefetcher uploads them).
    pub(crate) fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// Whether the buffers hold `len` whole samples (false only after a failed `prepare`).
    pub(crate) fn is_consistent(&self) -> bool {
        self.columns.len() == self.layout.fields().len()
            && self
                .columns
                .iter()
                .zip(self.layout.fields())
                .all(|(c, f)| c.len() == self.len * f.numel())
    }
}

fn type_error(field: usize, found: DType, requested: DType) -> Error {
    Error::FieldType { field, found, requested }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Field;

    /// A CPU batch hands a field over by swapping buffers into a tensor of the field's batch
    /// shape (the batch keeps the old buffer), by copying into another shape of as many
    /// values, and refuses a tensor of another size or dtype.
    #[test]
    fn upload_field_swaps_copies_or_refuses() -> Result<()> {
        let stream = Stream::cpu_with_threads(1);
        let layout = SampleLayout::new(vec![
            Field::new("x", &[2, 2], DType::F32),
            Field::new("y", &[], DType::I32),
        ])?;
        let mut host = HostBatch::new(&layout, Device::Cpu);
        host.prepare(&layout, 2)?;
        host.f32_mut(0)?.copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        host.i32_mut(1)?.copy_from_slice(&[4, 9]);
        let values: Vec<f32> = (1..=8).map(|v| v as f32).collect();
        // (destination shape, dtype, accepted)
        let cases: [(&[usize], DType, bool); 4] = [
            (&[2, 2, 2], DType::F32, true),
            (&[2, 4], DType::F32, true),
            (&[2, 3], DType::F32, false),
            (&[2, 4], DType::I32, false),
        ];
        for (shape, dtype, accepted) in cases {
            let mut dst = Tensor::zeros(shape, dtype, &stream)?;
            let handed = host.upload_field(0, &mut dst, &stream);
            assert_eq!(handed.is_ok(), accepted, "{shape:?} {dtype:?}: {handed:?}");
            if accepted {
                assert_eq!(dst.to_vec::<f32>(&stream)?, values, "{shape:?}");
                assert_eq!(dst.shape(), shape);
                // After a swap the batch holds the destination's old (zero) buffer; refill it.
                host.f32_mut(0)?.copy_from_slice(&values);
            }
        }
        let mut labels = Tensor::zeros(&[2], DType::I32, &stream)?;
        host.upload_field(1, &mut labels, &stream)?;
        assert_eq!(labels.to_vec::<i32>(&stream)?, vec![4, 9]);
        let mut past = Tensor::zeros(&[2], DType::I32, &stream)?;
        assert!(matches!(host.upload_field(2, &mut past, &stream), Err(Error::NoSuchField { .. })));
        Ok(())
    }
}

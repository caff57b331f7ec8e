//! MNIST batches as candle tensors, and the test-set evaluation.

use candle_core::{Device, Tensor};
use flodl_data::{Dataset, HostBatch};
use flodl_ddp::{Batch, Result};

use crate::lenet::LeNet;
use flodl_candle::candle_error;

/// Images `[n, 1, 28, 28]` f32 and labels `[n]` u32 from MNIST's flat fields.
///
/// # Errors
/// candle's, when the lengths do not make `n` images.
pub fn tensors(images: &[f32], labels: &[i32], device: &Device) -> Result<(Tensor, Tensor)> {
    let n = labels.len();
    let x = Tensor::from_slice(images, (n, 1, 28, 28), device).map_err(candle_error)?;
    let y: Vec<u32> = labels.iter().map(|&l| l.max(0) as u32).collect();
    let y = Tensor::from_vec(y, n, device).map_err(candle_error)?;
    Ok((x, y))
}

/// A flodl batch (MNIST's layout: images `[n, 784]` f32, labels `[n]` i32) as candle tensors.
///
/// # Errors
/// flodl's when the batch is not MNIST's layout on the host; candle's.
pub fn batch_tensors(batch: &Batch, device: &Device) -> Result<(Tensor, Tensor)> {
    tensors(batch.field(0)?.as_slice::<f32>()?, batch.field(1)?.as_slice::<i32>()?, device)
}

/// The model's accuracy on `data`, in batches of 1000.
///
/// # Errors
/// A fetch's or candle's.
pub fn accuracy(model: &LeNet, data: &dyn Dataset, device: &Device) -> Result<f64> {
    let mut host = HostBatch::new(data.layout(), flodl_tensor::Device::Cpu);
    let mut correct = 0usize;
    let indices: Vec<usize> = (0..data.len()).collect();
    for picks in indices.chunks(1000) {
        data.fetch(picks, &mut host)?;
        let (x, y) = tensors(host.f32(0)?, host.i32(1)?, device)?;
        let hits = model
            .forward(&x)
            .and_then(|logits| logits.argmax(1))
            .and_then(|p| p.eq(&y))
            .and_then(|eq| eq.to_dtype(candle_core::DType::F32))
            .and_then(|eq| eq.sum_all())
            .and_then(|s| s.to_scalar::<f32>())
            .map_err(candle_error)?;
        correct += hits as usize;
    }
    Ok(correct as f64 / data.len().max(1) as f64)
}

//! Evaluating a replica on a dataset: the one rule the runtime's evaluations, [`crate::Mlp`]
//! and users share.

use flodl_data::{Dataset, HostBatch};
use flodl_tensor::Stream;

use crate::config_error::{ConfigError, Field};
use crate::contract::replica::{Batch, Replica};
use crate::contract::staging::{device_batch, upload};
use crate::control::metrics::EvalMetrics;
use crate::{Error, Result};

/// Evaluates `replica` on every sample of `dataset`, in index order, in batches of
/// `batch_size` (the last one shorter) built on `stream` — the stream the replica computes on
/// (its [`ReplicaContext::stream`](crate::ReplicaContext::stream)), so the batches live on its
/// device. The batches follow the layout rules of [`Batch`]. Returns the mean loss per sample
/// and the accuracy over the samples the replica reports, or `None` when the replica does not
/// evaluate ([`Replica::evaluate_batch`] answers `None`).
///
/// # Errors
/// [`Error::Invalid`] for a zero batch size; [`Error::ReplicaMismatch`] when `stream` is not on
/// the device of the replica's parameters; data and tensor errors; whatever the replica's
/// evaluation raises.
pub fn evaluate(
    replica: &mut dyn Replica,
    dataset: &dyn Dataset,
    batch_size: usize,
    stream: &Stream,
) -> Result<Option<EvalMetrics>> {
    EvalBatches::default().evaluate(replica, dataset, batch_size, stream)
}

/// Device batches kept between evaluations (one per batch size met), so a rank that evaluates
/// every epoch allocates them once.
#[derive(Debug, Default)]
pub(crate) struct EvalBatches {
    batches: Vec<Batch>,
}

impl EvalBatches {
    /// [`evaluate`], reusing the batches of earlier calls.
    pub(crate) fn evaluate(
        &mut self,
        replica: &mut dyn Replica,
        dataset: &dyn Dataset,
        batch_size: usize,
        stream: &Stream,
    ) -> Result<Option<EvalMetrics>> {
        if batch_size == 0 {
            return Err(ConfigError::out_of_range(Field::BatchSize, 0, "at least 1").into());
        }
        let device = stream.device();
        if let Some(p) = replica.parameters().iter().find(|p| p.device() != device) {
            return Err(Error::mismatch(
                "the device of an evaluated replica's parameters",
                device,
                p.device(),
            ));
        }
        let layout = dataset.layout();
        let mut host = HostBatch::new(layout, device);
        let (mut loss_sum, mut correct, mut samples) = (0.0, 0, 0);
        let mut indices = Vec::with_capacity(batch_size.min(dataset.len()));
        let mut start = 0;
        while start < dataset.len() {
            let end = start.saturating_add(batch_size).min(dataset.len());
            let n = end - start;
            indices.clear();
            indices.extend(start..end);
            dataset.fetch(&indices, &mut host)?;
            let slot = match self.batches.iter().position(|b| b.len() == n) {
                Some(i) => i,
                None => {
                    self.batches.push(device_batch(layout, n, stream)?);
                    self.batches.len() - 1
                }
            };
            let batch = &mut self.batches[slot];
            upload(&mut host, batch, stream)?;
            match replica.evaluate_batch(batch)? {
                Some(e) => {
                    loss_sum += e.loss_sum;
                    correct += e.correct;
                    samples += e.samples;
                }
                None => return Ok(None),
            }
            start = end;
        }
        let div = samples.max(1) as f64;
        Ok(Some(EvalMetrics { loss: loss_sum / div, accuracy: correct as f64 / div, samples }))
    }
}

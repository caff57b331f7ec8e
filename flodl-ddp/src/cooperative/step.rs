//! One training step handed to the user's loop.

use crate::Result;
use crate::contract::replica::Batch;
use crate::cooperative::worker::Worker;

/// A batch of the rank's to train with the user's own stack; report its loss with
/// [`finish`](Step::finish). While a step is out, its worker cannot be asked for another.
#[derive(Debug)]
#[must_use = "a step's loss must be reported with finish()"]
pub struct Step<'w> {
    worker: &'w mut Worker,
    batch: Batch,
}

impl<'w> Step<'w> {
    pub(crate) fn new(worker: &'w mut Worker, batch: Batch) -> Step<'w> {
        Step { worker, batch }
    }

    /// The batch, on the host, in the dataset's layout (see [`Batch`]: MNIST's images as
    /// `[n, 784]` f32, its labels as `[n]` i32; read them with `Tensor::as_slice`).
    pub fn batch(&self) -> &Batch {
        &self.batch
    }

    /// Reports the mean loss of the batch (after the user's forward and backward) and returns
    /// the learning rate of the optimizer step that follows, from the run's schedule. The step
    /// counts as done when the worker is next asked for a step.
    ///
    /// # Errors
    /// [`Error::PeerGone`](crate::Error::PeerGone) when the rank ended meanwhile (a non-finite
    /// loss ends the run: [`Error::Diverged`](crate::Error::Diverged) from `join`);
    /// [`Error::Timeout`](crate::Error::Timeout) when the rank does not answer.
    pub fn finish(self, loss: f32) -> Result<f32> {
        self.worker.report_loss(loss)
    }
}

//! The `Replica` contract: what a user's model and optimizer give the runtime.

use flodl_tensor::{Device, Stream, Tensor};

use crate::{Error, Result};

/// One batch on a rank's device: the dataset's fields in layout order, `len` samples each.
///
/// The layout rules: field `i` is field `i` of the dataset's
/// [`SampleLayout`](flodl_data::SampleLayout), with that field's dtype (`f32` or `i32`; MNIST's
/// label is `i32`); each is a device tensor whose first dimension is the batch: a field whose
/// samples are scalars arrives as `[len]`, any other as `[len, features]` (the sample's
/// dimensions flattened, MNIST's image as `[len, 784]`).
#[derive(Debug)]
pub struct Batch {
    fields: Vec<Tensor>,
    len: usize,
}

impl Batch {
    /// A batch made of `fields`, which must all have the same first dimension.
    ///
    /// # Errors
    /// [`Error::ReplicaMismatch`] when `fields` is empty or the first dimensions differ.
    pub fn new(fields: Vec<Tensor>) -> Result<Batch> {
        let len = match fields.first().and_then(|t| t.shape().first()) {
            Some(&n) => n,
            None => return Err(Error::mismatch("a batch's fields", "at least one", "none")),
        };
        if let Some(bad) = fields.iter().find(|t| t.shape().first() != Some(&len)) {
            return Err(Error::mismatch(
                "a batch field's leading size",
                len,
                format!("shape {:?}", bad.shape()),
            ));
        }
        Ok(Batch { fields, len })
    }

    /// Samples in the batch.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the batch holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Field `i` (in the dataset's layout order).
    ///
    /// # Errors
    /// [`Error::ReplicaMismatch`] when the batch has fewer fields.
    pub fn field(&self, i: usize) -> Result<&Tensor> {
        self.fields.get(i).ok_or_else(|| {
            Error::mismatch("a batch's fields", format!("field {i}"), self.fields.len())
        })
    }

    /// All fields, in layout order.
    pub fn fields(&self) -> &[Tensor] {
        &self.fields
    }

    /// All fields, mutable (the runtime refills them in place).
    pub(crate) fn fields_mut(&mut self) -> &mut [Tensor] {
        &mut self.fields
    }

    /// Swaps the fields with `incoming` (a prefetched batch's tensors, `[n, ..sample shape]`),
    /// without copying or allocating tensors: the batch takes them in its own shapes (`[n]` or
    /// `[n, features]`), and `incoming` gets the old fields back in the shapes it had, so the
    /// prefetcher can reuse them.
    ///
    /// # Errors
    /// [`Error::ReplicaMismatch`] when the field counts, element counts or dtypes differ, or the
    /// incoming fields disagree on the batch size (the batch is then unusable).
    pub(crate) fn exchange(&mut self, incoming: &mut [Tensor]) -> Result<()> {
        if incoming.len() != self.fields.len() {
            return Err(Error::mismatch("a batch's fields", self.fields.len(), incoming.len()));
        }
        if let Some((mine, theirs)) = self
            .fields
            .iter()
            .zip(incoming.iter())
            .find(|(a, b)| a.numel() != b.numel() || a.dtype() != b.dtype())
        {
            return Err(Error::mismatch(
                "a batch field's size and dtype",
                format!("{:?} {:?}", mine.shape(), mine.dtype()),
                format!("{:?} {:?}", theirs.shape(), theirs.dtype()),
            ));
        }
        let fields = std::mem::take(&mut self.fields);
        // Same element type in and out: the vector's allocation is reused.
        self.fields = fields
            .into_iter()
            .zip(incoming.iter_mut())
            .map(|(mine, slot)| {
                let mine =
                    if mine.shape() == slot.shape() { mine } else { mine.reshape(slot.shape())? };
                let theirs = std::mem::replace(slot, mine);
                match flat_shape(theirs.shape()) {
                    Some(shape) => Ok(theirs.reshape(&shape)?),
                    None => Ok(theirs),
                }
            })
            .collect::<Result<Vec<Tensor>>>()?;
        let len = self.fields.first().and_then(|t| t.shape().first()).copied().unwrap_or(0);
        if self.fields.iter().any(|t| t.shape().first() != Some(&len)) {
            let sizes: Vec<Option<usize>> =
                self.fields.iter().map(|t| t.shape().first().copied()).collect();
            return Err(Error::mismatch(
                "prefetched fields' leading sizes",
                len,
                format!("{sizes:?}"),
            ));
        }
        self.len = len;
        Ok(())
    }
}

/// The batch shape of a field of shape `shape` (`[n, ..]`): `[n]` for scalar samples, else
/// `[n, features]`; `None` when `shape` already is.
fn flat_shape(shape: &[usize]) -> Option<Vec<usize>> {
    let (&n, rest) = shape.split_first()?;
    let features: usize = rest.iter().product();
    match (features, rest.len()) {
        (1, 0) => None,
        (_, 1) if features != 1 => None,
        (1, _) => Some(vec![n]),
        _ => Some(vec![n, features]),
    }
}

/// Where and how a rank's replica is built; handed to the replica factory inside the rank's
/// thread.
#[derive(Debug, Clone)]
pub struct ReplicaContext {
    /// The rank the replica belongs to.
    pub rank: usize,
    /// Ranks in the run.
    pub world: usize,
    /// The rank's device.
    pub device: Device,
    /// The rank's compute stream: build every tensor and run every kernel on it.
    pub stream: Stream,
    /// Samples per training batch on this rank (every training batch has exactly this size).
    pub batch_size: usize,
    /// The run's seed: build identical initial weights from it on every rank.
    pub seed: u64,
}

impl ReplicaContext {
    /// The context of a replica outside any run: rank 0 of 1, on `stream` and its device (to
    /// load and evaluate a returned state with
    /// [`TrainedState::load_into`](crate::TrainedState::load_into)).
    pub fn alone(stream: Stream, batch_size: usize, seed: u64) -> ReplicaContext {
        ReplicaContext { rank: 0, world: 1, device: stream.device(), stream, batch_size, seed }
    }
}

/// Loss and correct predictions of one evaluated batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchEval {
    /// Sum of the per-sample losses.
    pub loss_sum: f64,
    /// Samples predicted correctly.
    pub correct: usize,
    /// Samples evaluated.
    pub samples: usize,
}

/// A model with its optimizer, as one rank trains it.
///
/// The runtime calls [`train_step`](Replica::train_step) then [`step`](Replica::step) once per
/// batch, and between batches reads and overwrites [`parameters`](Replica::parameters) (and
/// [`buffers`](Replica::buffers)) to average replicas, calling
/// [`export_parameters`](Replica::export_parameters) before it reads them and
/// [`import_parameters`](Replica::import_parameters) after it wrote them (so a model kept in
/// another stack's variables crosses into flodl tensors only then). Parameters, gradients and buffers are
/// device tensors on the context's device, `f32`, in a fixed order that is the same on every
/// rank. A replica is built inside its rank's thread and never leaves it, so it need not be
/// `Send`.
///
/// Four methods are required; the others have defaults that offer nothing. Trainer options
/// that need an optional part ([`Capability`](crate::Capability)) are checked when the
/// replicas are built: [`Trainer::run`](crate::Trainer::run) fails with
/// [`Error::MissingCapability`] when the part is missing.
pub trait Replica {
    /// Forward and backward pass on `batch`: returns the mean loss and keeps the gradients of
    /// the mean loss for [`step`](Replica::step) (in [`gradients_mut`](Replica::gradients_mut)
    /// when the replica exposes them).
    ///
    /// # Errors
    /// Whatever the model's computation raises; the run stops with it.
    fn train_step(&mut self, batch: &Batch) -> Result<f32>;

    /// One optimizer step with learning rate `lr`, using the gradients of the last
    /// [`train_step`](Replica::train_step).
    ///
    /// # Errors
    /// Whatever the optimizer raises; the run stops with it.
    fn step(&mut self, lr: f32) -> Result<()>;

    /// The trainable parameters, in a fixed order.
    fn parameters(&self) -> &[Tensor];

    /// The trainable parameters, mutable (the runtime writes averaged values into them).
    fn parameters_mut(&mut self) -> &mut [Tensor];

    /// The gradients of the last training step, mutable, one per parameter, of its shape and
    /// in the same order, allocated from the replica's construction on: gradient clipping
    /// ([`Trainer::max_grad_norm`](crate::Trainer::max_grad_norm)) scales them in place between
    /// [`train_step`](Replica::train_step) and [`step`](Replica::step). `None` (the default):
    /// the replica does not expose them ([`Capability::MutableGradients`](crate::Capability)).
    fn gradients_mut(&mut self) -> Option<&mut [Tensor]> {
        None
    }

    /// Non-trainable state averaged with equal weight across ranks (running statistics).
    fn buffers(&self) -> &[Tensor] {
        &[]
    }

    /// The buffers, mutable.
    fn buffers_mut(&mut self) -> &mut [Tensor] {
        &mut []
    }

    /// The optimizer's state tensors (momentum, moments), in a fixed order, for checkpoints.
    fn optimizer_state(&self) -> &[Tensor] {
        &[]
    }

    /// The optimizer's state tensors, mutable.
    fn optimizer_state_mut(&mut self) -> &mut [Tensor] {
        &mut []
    }

    /// The optimizer's step counter, when it keeps one outside its state tensors (Adam's bias
    /// correction), for checkpoints; 0 by default.
    fn optimizer_steps(&self) -> u64 {
        0
    }

    /// Restores the optimizer's step counter from a checkpoint (ignored by default).
    fn set_optimizer_steps(&mut self, steps: u64) {
        let _ = steps;
    }

    /// Resets the optimizer to its initial state (zeroes the state tensors by default).
    ///
    /// # Errors
    /// A tensor error from zeroing.
    fn reset_optimizer(&mut self, stream: &Stream) -> Result<()> {
        for t in self.optimizer_state_mut() {
            flodl_tensor::ops::fill(t, 0.0, stream)?;
        }
        Ok(())
    }

    /// Evaluates one batch without training (forward only); `None` when the replica does not
    /// support evaluation (the runtime then reports no evaluation).
    ///
    /// # Errors
    /// Whatever the model's computation raises.
    fn evaluate_batch(&mut self, batch: &Batch) -> Result<Option<BatchEval>> {
        let _ = batch;
        Ok(None)
    }

    /// Brings [`parameters`](Replica::parameters) (and [`buffers`](Replica::buffers)) up to
    /// date from where the model keeps its values, before the runtime reads them: at a reduce,
    /// a host snapshot, a checkpoint and the end of the run. A replica whose model lives in
    /// another stack's variables (another framework's tensors) copies them in here, so its
    /// parameters cross into flodl tensors only at reduces; one whose parameters are its flodl
    /// tensors needs nothing (the default).
    ///
    /// # Errors
    /// Whatever reading the model raises; the run stops with it.
    fn export_parameters(&mut self) -> Result<()> {
        Ok(())
    }

    /// Pushes [`parameters`](Replica::parameters) (and [`buffers`](Replica::buffers)) into the
    /// model after the runtime wrote them: the initial state and every average. The counterpart
    /// of [`export_parameters`](Replica::export_parameters); nothing by default.
    ///
    /// # Errors
    /// Whatever writing the model raises; the run stops with it.
    fn import_parameters(&mut self) -> Result<()> {
        Ok(())
    }
}

impl<R: Replica + ?Sized> Replica for Box<R> {
    fn train_step(&mut self, batch: &Batch) -> Result<f32> {
        (**self).train_step(batch)
    }
    fn step(&mut self, lr: f32) -> Result<()> {
        (**self).step(lr)
    }
    fn parameters(&self) -> &[Tensor] {
        (**self).parameters()
    }
    fn parameters_mut(&mut self) -> &mut [Tensor] {
        (**self).parameters_mut()
    }
    fn gradients_mut(&mut self) -> Option<&mut [Tensor]> {
        (**self).gradients_mut()
    }
    fn buffers(&self) -> &[Tensor] {
        (**self).buffers()
    }
    fn buffers_mut(&mut self) -> &mut [Tensor] {
        (**self).buffers_mut()
    }
    fn optimizer_state(&self) -> &[Tensor] {
        (**self).optimizer_state()
    }
    fn optimizer_state_mut(&mut self) -> &mut [Tensor] {
        (**self).optimizer_state_mut()
    }
    fn optimizer_steps(&self) -> u64 {
        (**self).optimizer_steps()
    }
    fn set_optimizer_steps(&mut self, steps: u64) {
        (**self).set_optimizer_steps(steps);
    }
    fn reset_optimizer(&mut self, stream: &Stream) -> Result<()> {
        (**self).reset_optimizer(stream)
    }
    fn evaluate_batch(&mut self, batch: &Batch) -> Result<Option<BatchEval>> {
        (**self).evaluate_batch(batch)
    }
    fn export_parameters(&mut self) -> Result<()> {
        (**self).export_parameters()
    }
    fn import_parameters(&mut self) -> Result<()> {
        (**self).import_parameters()
    }
}

//! The user's handle on one cooperative rank, and the step it lends the user's loop (a
//! [`Step`] borrows its [`Worker`] and reports through it: one concept, one file).

use std::time::{Duration, Instant};

use flume::{Receiver, RecvTimeoutError, SendTimeoutError, Sender};

use crate::contract::replica::Batch;
use crate::control::metrics::drain_scalars;
use crate::cooperative::order::{Answer, Order};
use crate::cooperative::parameters::Parameters;
use crate::error::Peer;
use crate::{Error, Result};

/// Where a worker's loop stands with its rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Between steps: the rank's next order is awaited.
    Idle,
    /// A batch is out in a [`Step`] that has not reported its loss.
    Training,
    /// The loss is reported; the user runs the optimizer step, done at the next call.
    Stepping,
}

/// One rank of a cooperative run, driven by the user's loop on a thread of their own.
///
/// ```no_run
/// # fn demo(mut worker: flodl_ddp::Worker, mut params: Vec<Vec<f32>>) -> flodl_ddp::Result<()> {
/// while let Some(step) = worker.next_step(&mut params)? {
///     let batch = step.batch();
///     let loss = 0.0; // forward and backward on `batch` with the user's own stack
///     # let _ = batch;
///     let lr = step.finish(loss)?;
///     // the user's optimizer step at `lr`
///     # let _ = lr;
/// }
/// # Ok(()) }
/// ```
///
/// Dropping a worker (its thread ended or panicked) before the run is over, or not calling in
/// within the run's [watchdog](crate::Trainer::watchdog), makes its rank a dead rank: the
/// survivors go on without it, as with a failing [`Replica`](crate::Replica).
#[derive(Debug)]
pub struct Worker {
    rank: usize,
    orders: Receiver<Order>,
    answers: Sender<Answer>,
    /// How long the worker waits for its rank's next order.
    wait: Duration,
    phase: Phase,
}

impl Worker {
    /// The worker of `rank`, over the channels of its rank's bridge.
    pub(crate) fn new(
        rank: usize,
        orders: Receiver<Order>,
        answers: Sender<Answer>,
        wait: Duration,
    ) -> Worker {
        Worker { rank, orders, answers, wait, phase: Phase::Idle }
    }

    /// The rank this worker trains.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Waits for the rank's next batch: `Some(step)` to train, or `None` once the rank has no
    /// more work (the run finished, or the rank was retired: [`DdpHandle::join`](crate::DdpHandle::join) says which).
    /// Meanwhile the runtime may read the model's parameters from `params` or overwrite them
    /// (a reduce, a host snapshot, a checkpoint, the initial state, the end of the run).
    ///
    /// # Errors
    /// [`Error::StepUnfinished`] when the last step was dropped without
    /// [`finish`](Step::finish); [`Error::Timeout`] when the rank sends nothing within the
    /// stall timeout plus the watchdog; [`Error::ReplicaMismatch`] when `params` does not fit
    /// the run's parameters, and whatever `params` raises (the rank then fails).
    pub fn next_step<P: Parameters + ?Sized>(
        &mut self,
        params: &mut P,
    ) -> Result<Option<Step<'_>>> {
        match self.phase {
            Phase::Training => return Err(Error::StepUnfinished { rank: self.rank }),
            // The optimizer step is done; the rank did not wait for it.
            Phase::Stepping | Phase::Idle => self.phase = Phase::Idle,
        }
        loop {
            let Some(order) = self.order()? else { return Ok(None) };
            let answer = match order {
                Order::Train(batch) => {
                    self.phase = Phase::Training;
                    return Ok(Some(Step::new(self, batch)));
                }
                Order::Lend(mut tensors) => {
                    check_count(params.count(), tensors.len())?;
                    for (i, t) in tensors.iter_mut().enumerate() {
                        params.read(i, t.as_mut_slice::<f32>()?)?;
                    }
                    Answer::Lent(tensors)
                }
                Order::Take(tensors) => {
                    check_count(params.count(), tensors.len())?;
                    for (i, t) in tensors.iter().enumerate() {
                        params.write(i, t.as_slice::<f32>()?)?;
                    }
                    Answer::Taken(tensors)
                }
                Order::Lr(_) => return Err(out_of_step("a learning rate", self.phase)),
            };
            if !self.answer(answer)? {
                return Ok(None);
            }
        }
    }

    /// Reports the loss of the step in training and returns the learning rate of its
    /// optimizer step.
    pub(crate) fn report_loss(&mut self, loss: f32) -> Result<f32> {
        if !self.answer(Answer::Loss(loss, drain_scalars()))? {
            return Err(Error::PeerGone(Peer::Rank(self.rank)));
        }
        match self.order()? {
            Some(Order::Lr(lr)) => {
                self.phase = Phase::Stepping;
                Ok(lr)
            }
            Some(other) => Err(out_of_step(other.name(), self.phase)),
            None => Err(Error::PeerGone(Peer::Rank(self.rank))),
        }
    }

    /// The rank's next order; `None` when the rank has let go of its end.
    fn order(&self) -> Result<Option<Order>> {
        match self.orders.recv_timeout(self.wait) {
            Ok(order) => Ok(Some(order)),
            Err(RecvTimeoutError::Disconnected) => Ok(None),
            Err(RecvTimeoutError::Timeout) => {
                Err(Error::Timeout { what: "the cooperative rank's next order", after: self.wait })
            }
        }
    }

    /// Sends `answer`; `false` when the rank has let go of its end.
    fn answer(&self, answer: Answer) -> Result<bool> {
        let deadline = Instant::now() + self.wait;
        match self.answers.send_deadline(answer, deadline) {
            Ok(()) => Ok(true),
            Err(SendTimeoutError::Disconnected(_)) => Ok(false),
            Err(SendTimeoutError::Timeout(_)) => {
                Err(Error::Timeout { what: "room for the cooperative answer", after: self.wait })
            }
        }
    }
}

/// The error of lent parameters whose count differs from the run's.
fn check_count(have: usize, want: usize) -> Result<()> {
    if have == want {
        Ok(())
    } else {
        Err(Error::mismatch("parameters the model lends", want, have))
    }
}

/// The error of an order that does not fit where the worker stands.
fn out_of_step(what: &'static str, phase: Phase) -> Error {
    let during = match phase {
        Phase::Idle => "while idle",
        Phase::Training => "while training",
        Phase::Stepping => "while stepping",
    };
    Error::OutOfStep { got: what, during }
}

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

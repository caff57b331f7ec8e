//! The replica behind a cooperative rank: the runtime's calls forwarded to the user's
//! [`Worker`](super::Worker).

use std::time::{Duration, Instant};

use flodl_tensor::{Stream, Tensor};
use flume::{Receiver, RecvTimeoutError, SendTimeoutError, Sender};

use crate::contract::replica::{Batch, Replica, ReplicaContext};
use crate::control::metrics::absorb_scalars;
use crate::cooperative::order::{Answer, Order};
use crate::state::HostTensor;
use crate::{Error, Result};

/// Whether the user's model holds the values of the bridge's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agreement {
    /// The model has not been given the tensors' values yet (the start of the run).
    Unsent,
    /// The model and the tensors hold the same values.
    Same,
    /// The model trained since: the tensors are stale.
    Trained,
}

/// The rank's end of a cooperative worker: the runtime's replica for that rank.
pub(crate) struct Bridge {
    rank: usize,
    stream: Stream,
    /// The parameters as the runtime sees them (CPU tensors), lent to the worker at exchanges.
    params: Vec<Tensor>,
    orders: Sender<Order>,
    answers: Receiver<Answer>,
    /// How long the bridge waits for the worker (the run's watchdog).
    wait: Duration,
    agreement: Agreement,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge")
            .field("rank", &self.rank)
            .field("agreement", &self.agreement)
            .finish_non_exhaustive()
    }
}

impl Bridge {
    /// The bridge of the rank in `ctx`, starting from `initial`.
    pub(crate) fn new(
        ctx: &ReplicaContext,
        initial: &[HostTensor],
        orders: Sender<Order>,
        answers: Receiver<Answer>,
        wait: Duration,
    ) -> Result<Bridge> {
        let params = initial
            .iter()
            .map(|p| Ok(Tensor::from_slice(&p.data, &p.shape, &ctx.stream)?))
            .collect::<Result<Vec<Tensor>>>()?;
        Ok(Bridge {
            rank: ctx.rank,
            stream: ctx.stream.clone(),
            params,
            orders,
            answers,
            wait,
            agreement: Agreement::Unsent,
        })
    }

    /// Sends `order` to the worker and waits for its answer, each under the deadline.
    fn ask(&self, order: Order) -> Result<Answer> {
        let what = order.name();
        self.tell(order)?;
        match self.answers.recv_timeout(self.wait) {
            Ok(answer) => Ok(answer),
            Err(RecvTimeoutError::Disconnected) => Err(Error::WorkerGone { rank: self.rank }),
            Err(RecvTimeoutError::Timeout) => {
                tracing::warn!(rank = self.rank, order = what, "the cooperative worker is silent");
                Err(Error::Timeout { what: "the cooperative worker's answer", after: self.wait })
            }
        }
    }

    /// Sends `order` to the worker under the deadline, without waiting for an answer.
    fn tell(&self, order: Order) -> Result<()> {
        match self.orders.send_deadline(order, Instant::now() + self.wait) {
            Ok(()) => Ok(()),
            Err(SendTimeoutError::Disconnected(_)) => Err(Error::WorkerGone { rank: self.rank }),
            Err(SendTimeoutError::Timeout(_)) => {
                Err(Error::Timeout { what: "the cooperative worker", after: self.wait })
            }
        }
    }

    /// The error of an answer that does not fit the order.
    fn unexpected(&self, order: &'static str, answer: &Answer) -> Error {
        Error::OutOfStep { got: answer.name(), during: order }
    }
}

impl Replica for Bridge {
    fn train_step(&mut self, batch: &Batch) -> Result<f32> {
        if self.agreement == Agreement::Unsent {
            self.import_parameters()?;
        }
        let fields = batch
            .fields()
            .iter()
            .map(|t| Ok(t.try_clone(&self.stream)?))
            .collect::<Result<Vec<Tensor>>>()?;
        match self.ask(Order::Train(Batch::new(fields)?))? {
            Answer::Loss(loss, scalars) => {
                absorb_scalars(scalars);
                self.agreement = Agreement::Trained;
                Ok(loss)
            }
            other => Err(self.unexpected("in answer to train", &other)),
        }
    }

    /// Hands the rate to the user's optimizer step and goes on: the step runs while the rank
    /// does its bookkeeping, and the next order waits for it (its time counts in the next
    /// training step's, or in the reduce that reads the parameters).
    fn step(&mut self, lr: f32) -> Result<()> {
        self.tell(Order::Lr(lr))
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    fn parameters_mut(&mut self) -> &mut [Tensor] {
        &mut self.params
    }

    fn export_parameters(&mut self) -> Result<()> {
        if self.agreement != Agreement::Trained {
            return Ok(());
        }
        let lent = std::mem::take(&mut self.params);
        match self.ask(Order::Lend(lent))? {
            Answer::Lent(tensors) => {
                self.params = tensors;
                self.agreement = Agreement::Same;
                Ok(())
            }
            other => Err(self.unexpected("in answer to lend", &other)),
        }
    }

    fn import_parameters(&mut self) -> Result<()> {
        let given = std::mem::take(&mut self.params);
        match self.ask(Order::Take(given))? {
            Answer::Taken(tensors) => {
                self.params = tensors;
                self.agreement = Agreement::Same;
                Ok(())
            }
            other => Err(self.unexpected("in answer to take", &other)),
        }
    }
}

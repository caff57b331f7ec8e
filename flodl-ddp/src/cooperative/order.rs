//! The messages between a cooperative rank's runtime side (`Bridge`) and the user's
//! [`Worker`](super::Worker): one order at a time, each answered before the next but the
//! learning rate, which the user's optimizer step follows while the rank goes on.

use std::collections::BTreeMap;

use flodl_tensor::Tensor;

use crate::contract::replica::Batch;

/// What the runtime asks of the user's loop.
#[derive(Debug)]
pub(crate) enum Order {
    /// Train this batch (forward and backward); answered by [`Answer::Loss`].
    Train(Batch),
    /// The learning rate of the optimizer step that follows the reported loss; not answered:
    /// the rank goes on meanwhile, and its next order waits in the channel until the user asks
    /// for the next step (so one step costs two hand-offs each way, not four).
    Lr(f32),
    /// Copy the model's parameters into these tensors; answered by [`Answer::Lent`].
    Lend(Vec<Tensor>),
    /// Overwrite the model's parameters with these values; answered by [`Answer::Taken`].
    Take(Vec<Tensor>),
}

/// What the user's loop answers.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The mean loss of the batch just trained, and the scalars the user's thread recorded
    /// ([`record_scalar`](crate::record_scalar)) as `name → (sum, count)`.
    Loss(f32, BTreeMap<String, (f64, usize)>),
    /// The tensors of [`Order::Lend`], holding the model's parameters.
    Lent(Vec<Tensor>),
    /// The tensors of [`Order::Take`], handed back.
    Taken(Vec<Tensor>),
}

impl Order {
    /// The order's name, for errors.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Order::Train(_) => "train",
            Order::Lr(_) => "learning rate",
            Order::Lend(_) => "lend",
            Order::Take(_) => "take",
        }
    }
}

impl Answer {
    /// The answer's name, for errors.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Answer::Loss(..) => "loss",
            Answer::Lent(_) => "lent",
            Answer::Taken(_) => "taken",
        }
    }
}

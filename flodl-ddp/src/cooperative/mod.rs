//! The cooperative tier: the user owns the training loop (forward, backward, optimizer, in any
//! stack), the runtime owns everything around it.
//!
//! [`Trainer::run_cooperative`](crate::Trainer::run_cooperative) starts an ordinary run (the
//! same coordinator, rank loops, policies, backends, metrics, checkpoints and fault handling as
//! the [`Replica`](crate::Replica) tier) whose ranks train through a [`Worker`] each: a handle
//! the user moves to a thread of their own. [`Worker::next_step`] hands out the rank's next
//! batch as a [`Step`]; the user trains it and reports its loss with [`Step::finish`], which
//! answers the learning rate of the optimizer step that follows. Between steps, inside
//! `next_step`, the runtime reads and overwrites the model's parameters through the
//! [`Parameters`] the user lends (flat f32 buffers, flodl tensors, or another stack's variables)
//! whenever a reduce, a snapshot, a checkpoint or the end of the run needs them.
//!
//! On the rank's side, a crate-private replica (`Bridge`) forwards the runtime's calls to the
//! worker over a pair of one-slot channels (`Order`, `Answer`), each wait under a deadline. A
//! worker that is dropped (its thread ended or panicked) or stops calling in is a rank failure:
//! the rank is declared dead and the survivors go on, as with a failing replica.

pub(crate) mod bridge;
pub(crate) mod order;
pub(crate) mod parameters;
pub(crate) mod worker;

pub use parameters::Parameters;
pub use worker::{Step, Worker};

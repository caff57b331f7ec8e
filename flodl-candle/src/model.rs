//! `CandleModel`, what a candle model offers the adapters: its variables, a training loss and an
//! evaluation of a flodl batch.

use candle_core::{Device, Tensor, Var};
use flodl_ddp::{Batch, BatchEval, Result};

/// A model written in candle, as [`CandleReplica`](crate::CandleReplica) and
/// [`train_loop`](crate::train_loop) drive it (shared with the one-thread pool its candle work
/// runs on, hence `Sync`).
pub trait CandleModel: Sync {
    /// The trainable variables, in a fixed order that is the same on every rank.
    fn vars(&self) -> &[Var];

    /// The mean training loss of `batch` (a scalar candle tensor on `device`, with its graph).
    ///
    /// # Errors
    /// A batch of another layout than the model reads; candle's.
    fn loss(&self, batch: &Batch, device: &Device) -> Result<Tensor>;

    /// The summed loss and correct predictions of `batch` (no graph kept).
    ///
    /// # Errors
    /// As [`CandleModel::loss`].
    fn evaluate(&self, batch: &Batch, device: &Device) -> Result<BatchEval>;
}

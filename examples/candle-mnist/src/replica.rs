//! The `Replica` tier: the candle LeNet through flodl-candle's `Replica` adapter.

use candle_core::Device;
use flodl_candle::{CandleReplica, Optim, candle_error};
use flodl_ddp::Trainer;

use crate::lenet::LeNet;
use crate::settings::{Outcome, Settings};

/// Trains the model through the `Replica` tier ([`CandleReplica`] with candle's AdamW
/// defaults) and evaluates the averaged result.
///
/// # Errors
/// The run's or the evaluation's.
pub fn train(settings: &Settings) -> anyhow::Result<Outcome> {
    let factory = |ctx: &flodl_ddp::ReplicaContext| {
        let model = LeNet::new(&Device::Cpu).map_err(candle_error)?;
        CandleReplica::new(model, Optim::default(), ctx)
    };
    let state = settings.configure(Trainer::new(factory)).run()?.join()?;
    crate::cooperative::outcome(&state, settings)
}

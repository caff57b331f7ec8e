//! candle models trained by flodl-ddp: the glue between candle's variables and flodl's
//! runtime, for both of its tiers, and a GPT-style transformer that uses it.
//!
//! - [`CandleModel`]: what a candle model offers (its `Var`s in a fixed order, a training loss
//!   and an evaluation of a flodl [`Batch`](flodl_ddp::Batch)).
//! - The `Replica` tier: [`CandleReplica`] adapts any [`CandleModel`] with its AdamW ([`Optim`]:
//!   betas, weight decay, gradient clipping) to [`flodl_ddp::Replica`]. The optimizer
//!   ([`AdamW`]) steps on flodl tensors and writes the variables back, so its moments are
//!   flodl tensors a checkpoint saves and a resume restores (candle-nn's AdamW keeps them to
//!   itself), and the runtime's averages go back into the variables at
//!   [`import_parameters`](flodl_ddp::Replica::import_parameters).
//! - The cooperative tier: [`CandleParams`] is the [`flodl_ddp::Parameters`] view of the
//!   variables, and [`train_loop`] is a rank's own candle loop driven by a
//!   [`flodl_ddp::Worker`].
//! - [`gpt`]: a byte-level decoder-only transformer (pre-norm, causal self-attention, learned
//!   positions, tied embeddings) in three sizes ([`gpt::GptSize`]), trained on
//!   [`flodl_data::ByteWindows`].
//!
//! No flodl library crate depends on this one: it is the piece a candle project pulls in.
//!
//! A small transformer trained on two CPU ranks (rank 1 at half speed) through the `Replica`
//! tier, on the first windows of the vendored Shakespeare validation text:
//!
//! ```
//! use std::sync::Arc;
//! use flodl_candle::gpt::{Gpt, GptConfig, gpt_optim, gpt_schedule};
//! use flodl_candle::CandleReplica;
//! use flodl_data::{Dataset, Shakespeare, Subset, TextSplit};
//! use flodl_ddp::{Devices, Policy, Trainer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = GptConfig { context: 16, width: 32, layers: 1, heads: 2 };
//! let text = Shakespeare::vendored(TextSplit::Valid)?;
//! let windows: Arc<dyn Dataset> = Arc::new(Subset::first(text.windows(config.context)?, 256));
//! let factory = move |ctx: &flodl_ddp::ReplicaContext| {
//!     CandleReplica::new(Gpt::new(config, ctx.seed)?, gpt_optim(), ctx)
//! };
//! let state = Trainer::new(factory)
//!     .dataset(windows.clone())
//!     .test_dataset(windows, 1)
//!     .devices(Devices::Cpu(2))
//!     .slowdown(vec![1.0, 2.0])
//!     .policy(Policy::Cadence)
//!     .batch_size(8)
//!     .epochs(1)
//!     .schedule(gpt_schedule(3e-3, 32, 4))
//!     .run()?
//!     .join()?;
//! let eval = state.final_eval().ok_or("no evaluation")?;
//! // Nats per byte: below a uniform guess over 256 byte values (ln 256 = 5.55).
//! assert!(eval.loss < 256f64.ln(), "{eval:?}");
//! # Ok(())
//! # }
//! ```

mod adamw;
mod clip;
mod cooperative;
pub mod gpt;
mod model;
mod replica;
mod vars;

pub use adamw::AdamW;
pub use clip::clip_grad_norm;
pub use cooperative::{LoopTally, train_loop};
pub use model::CandleModel;
pub use replica::{CandleReplica, Optim, pool};
pub use vars::{CandleParams, candle_error, host_tensors, read_tensor, read_var, write_var};

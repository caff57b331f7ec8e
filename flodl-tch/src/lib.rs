//! libtorch models, written with [tch](https://docs.rs/tch), trained by flodl-ddp across
//! unequal devices.
//!
//! - [`TchReplica`]: a tch [`Model`] whose variables live in a [`tch::nn::VarStore`], with its
//!   tch optimizer, as a flodl [`Replica`](flodl_ddp::Replica) (the runtime drives the steps).
//! - [`Vars`]: the `VarStore`'s variables in a fixed order (by name), read and written in place
//!   in their storage; it is the cooperative tier's
//!   [`Parameters`](flodl_ddp::Parameters) (the user's own tch loop drives the steps).
//! - [`indices`] and [`values`]: a flodl batch's fields as tch tensors; [`seeded`]: identical
//!   initial weights on every rank.
//!
//! Parameters cross between tch and flodl only when a reduce needs them, one `memcpy` per
//! variable between the two storages. Ranks are host (CPU) ranks for now; a CUDA rank's
//! device-to-device path is not built (a CUDA variable is refused with [`Error::Unsupported`]).
//!
//! Building needs libtorch 2.13.0 (tch 0.26): see the crate's README.
//!
//! # Example
//!
//! A linear classifier trained on two CPU ranks, the second twice as slow:
//!
//! ```
//! use std::sync::Arc;
//!
//! use flodl_data::{Field, InMemory, SampleLayout, Values};
//! use flodl_ddp::{Batch, Devices, Policy, ReplicaContext, Trainer};
//! use flodl_tch::{Model, TchReplica, indices, seeded, values};
//! use flodl_tensor::DType;
//! use tch::nn::{self, Module, OptimizerConfig, VarStore};
//!
//! struct Classifier(nn::Linear);
//!
//! impl Model for Classifier {
//!     fn loss(&self, batch: &Batch) -> flodl_ddp::Result<tch::Tensor> {
//!         let (x, y) = (values(batch, 0)?, indices(batch, 1)?);
//!         let logits = self.0.forward(&x);
//!         let loss = logits.f_cross_entropy_loss::<tch::Tensor>(&y, None, tch::Reduction::Mean, -100, 0.0);
//!         Ok(loss.map_err(flodl_tch::Error::from)?)
//!     }
//! }
//!
//! // Points of the plane, labelled by the sign of their first coordinate.
//! let n = 1024;
//! let xs: Vec<f32> = (0..2 * n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
//! let ys: Vec<i32> = (0..n).map(|i| i32::from(xs[2 * i] > 0.0)).collect();
//! let layout = SampleLayout::new(vec![
//!     Field::new("x", &[2], DType::F32),
//!     Field::new("y", &[], DType::I32),
//! ])?;
//! let data = InMemory::new(layout, vec![Values::F32(xs), Values::I32(ys)])?;
//!
//! let trainer = Trainer::new(|ctx: &ReplicaContext| {
//!     let vs = VarStore::new(tch::Device::Cpu);
//!     let linear = seeded(ctx.seed, || nn::linear(vs.root() / "out", 2, 2, Default::default()));
//!     TchReplica::new(vs, Classifier(linear), nn::AdamW::default(), Some(1.0), &ctx.stream)
//! });
//! let state = trainer
//!     .dataset(Arc::new(data))
//!     .batch_size(32)
//!     .epochs(3)
//!     .devices(Devices::Cpu(2))
//!     .slowdown(vec![1.0, 2.0])
//!     .policy(Policy::Cadence)
//!     .learning_rate(0.05)
//!     .run()?
//!     .join()?;
//! // The averaged model: `out.bias` then `out.weight`, by name.
//! assert_eq!(state.params.len(), 2);
//! assert_eq!(state.params[1].shape, vec![2, 2]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod batch;
mod error;
mod model;
mod params;
mod replica;
mod seed;
mod vars;

pub use batch::{indices, values};
pub use error::{Error, Result};
pub use model::Model;
pub use replica::TchReplica;
pub use seed::seeded;
pub use vars::Vars;

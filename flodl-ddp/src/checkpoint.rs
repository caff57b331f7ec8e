//! Checkpoint bundles: the resumable state of a run, its versioned file format and atomic IO.
//!
//! A [`Checkpoint`] holds the consensus parameters and buffers, per-rank optimizer state, outer
//! optimizer state, the ElChe state (opaque), step/epoch/reduce counters, the data coverage of
//! the open epochs, RNG states, the world size and the hash of the run's configuration. Its
//! model signature is the parameters' names, shapes and dtypes.
//!
//! # File format (version 1)
//!
//! All integers little-endian.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `89 46 44 4C 43 4B 0D 0A` (`\x89FDLCK\r\n`) |
//! | 8 | 4 | format version, `u32` (= [`FORMAT_VERSION`]) |
//! | 12 | 4 | reserved, zero |
//! | 16 | 8 | `M`: metadata section length, `u64` (≤ [`MAX_META_BYTES`]) |
//! | 24 | 8 | `D`: data section length, `u64` |
//! | 32 | 32 | sha256 of bytes 0..32, then the metadata and data sections |
//! | 64 | `M` | metadata: bincode 2 (`config::standard()`, serde) of the scalars, coverage, RNG, opaque states, and each tensor's name, dtype and shape (params, buffers, each optimizer set, outer) |
//! | 64 + `M` | `D` | tensor data: each tensor's elements as little-endian bytes, in metadata order, unpadded |
//!
//! A bundle is exactly `64 + M + D` bytes. Reading checks, in order: length ≥ 64, magic,
//! version, `M` and `64 + M + D` against the ceilings ([`MAX_META_BYTES`], [`ReadLimits`]),
//! `64 + M + D` against the actual size, the checksum, the reserved field, the metadata decode
//! (bincode with a byte limit; it must consume exactly `M` bytes), every tensor's byte length
//! (the tensors must fill `D` exactly), unique names, and the coverage invariants. Only then is
//! a value returned; compatibility ([`Expectation`]: signature, world size, config hash) is
//! checked by [`Checkpoint::load`] and the loaders of [`CheckpointStore`].
//!
//! # Files
//!
//! [`Checkpoint::save`] writes a temporary file in the target's directory, fsyncs it, renames
//! it over the target and fsyncs the directory, so a crash leaves the previous bundle intact.
//! [`CheckpointStore`] keeps `step-<global_step>.fdlck` bundles (the newest `keep`) and
//! `latest.fdlck` (a hard link to the newest step bundle, swapped in atomically).
//! [`SaveInterval`] says when a periodic save falls due. [`locate`] finds the bundle to resume
//! from — a file is itself; in a directory `latest.fdlck` when it reads intact, else the highest
//! intact step bundle — and only reads; the trainer, the store's loaders and `fdl` all use it.
//!
//! # Restoring
//!
//! [`TensorSet::capture`] copies a replica's tensors (any device) into a set;
//! [`TensorSet::restore_into`] and [`Checkpoint::restore_model_into`] check every target's shape
//! and dtype before any tensor is written.
//!
//! # Example: save at a reduce, resume
//!
//! ```
//! use flodl_ddp::checkpoint::{
//!     Checkpoint, CheckpointStore, ConfigHash, EpochCoverage, Expectation, ModelSignature,
//!     OpaqueState, SampleRange, TensorSet,
//! };
//! use flodl_tensor::{DType, Stream, Tensor};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let s = Stream::cpu_with_threads(1);
//! let params = vec![Tensor::rand_normal(&[4, 3], 0.0, 1.0, 7, &s)?];
//! let config = ConfigHash::of("lr=0.1 batch=32 world=2 policy=sync");
//!
//! // At a reduce: capture the consensus and the progress, save atomically.
//! let mut ckpt = Checkpoint::new(TensorSet::capture_indexed("param", &params, &s)?, 2, config);
//! ckpt.global_step = 120;
//! ckpt.elche = Some(OpaqueState::encode(&vec![3u64, 5])?);
//! let mut epoch = EpochCoverage::new(0, 42, 1000);
//! epoch.mark_done(SampleRange::new(0, 480))?;
//! ckpt.coverage.push(epoch);
//! let dir = tempfile::tempdir()?;
//! let store = CheckpointStore::open(dir.path(), 3)?;
//! store.save(&ckpt)?;
//!
//! // On resume: load only a bundle of this model, world and configuration, then restore.
//! let expect = Expectation {
//!     signature: ModelSignature::of_indexed("param", &params),
//!     world_size: 2,
//!     config_hash: config,
//! };
//! let back = store.load_latest(&expect)?;
//! let mut fresh = vec![Tensor::zeros(&[4, 3], DType::F32, &s)?];
//! back.params.restore_into("params", &mut fresh, &s)?;
//! assert_eq!(fresh[0].to_vec::<f32>(&s)?, params[0].to_vec::<f32>(&s)?);
//! assert_eq!(back.coverage[0].uncovered(), [SampleRange::new(480, 520)]);
//! # Ok(())
//! # }
//! ```

mod bundle;
mod config_hash;
mod coverage;
mod dtype;
mod error;
mod format;
mod interval;
mod location;
mod rank_map;
mod record;
mod signature;
mod store;
mod transfer;

pub use bundle::{Checkpoint, MAX_META_BYTES, OpaqueState, RngStream, SaveReason};
pub use config_hash::ConfigHash;
pub use coverage::{EpochCoverage, SampleRange};
pub use dtype::StoredDType;
pub use error::{CheckpointError, Result};
pub use format::{FORMAT_VERSION, HEADER_LEN, MAGIC, ReadLimits};
pub use interval::SaveInterval;
pub use location::{Located, locate, step_bundles};
pub use rank_map::RankMap;
pub use record::{TensorRecord, TensorSet};
pub use signature::{Expectation, ModelSignature, SignatureEntry};
pub use store::CheckpointStore;

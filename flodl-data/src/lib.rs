//! flodl's data plane: datasets, deterministic sharding, the prefetcher and the staging cache.
//!
//! - [`Dataset`]: length, [`SampleLayout`] and a bulk [`Dataset::fetch`] into a reusable
//!   [`HostBatch`]. Readers: [`Mnist`] (idx files, gzipped or raw, validated, optional sha256)
//!   and [`InMemory`]; [`Shakespeare`] (the vendored byte text, split by play) cut into token
//!   windows by [`ByteWindows`], with its [`unigram_entropy`] as the context-free loss floor;
//!   [`Subset`] restricts any dataset; [`RecordFile`] reads samples from a
//!   checksummed record file on every fetch (written by [`RecordWriter`] / [`write_records`]),
//!   and says so with [`FetchCost::Storage`].
//! - Sharding: [`epoch_permutation`] depends only on `(seed, epoch)`; [`equal_partition`] and
//!   [`weighted_partition`] slice it into per-rank [`EpochPlan`]s; [`plan_batches`] cuts a plan
//!   into [`BatchPicks`] under a [`TailPolicy`]. Augmentation is multiplicity ([`PickSpace`]);
//!   transforms are pure functions of a [`PickKey`].
//! - [`Prefetcher`]: a background thread per rank, bounded queue, pinned staging, async
//!   uploads with a ready event; depth from the VRAM gauge ([`Depth`]).
//! - [`StagingCache`]: a sample-keyed host cache under a byte budget, filled ahead from
//!   advisories, evicting by farthest next use.
//!
//! ```
//! use std::num::NonZeroUsize;
//! use flodl_data::{TailPolicy, epoch_permutation, equal_partition, plan_batches};
//!
//! # fn main() -> flodl_data::Result<()> {
//! let perm = epoch_permutation(10, 42, 0);
//! let plans = equal_partition(0, perm.len(), 3)?;
//! let bs = NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN);
//! let batches = plan_batches(&perm, &plans[0], bs, TailPolicy::Drop)?;
//! assert_eq!(plans[0].size, 4);
//! assert_eq!(batches.len(), 2);
//! # Ok(())
//! # }
//! ```

mod background;
mod batch;
mod byte_windows;
mod checksum;
mod dataset;
mod depth;
mod entropy;
mod error;
mod idx;
mod in_memory;
mod layout;
pub mod mnist;
mod permutation;
mod plan;
mod prefetch;
mod record;
mod residency;
pub mod shakespeare;
mod staging;
mod transform;

pub use batch::HostBatch;
pub use byte_windows::ByteWindows;
pub use dataset::{Dataset, FetchCost, Subset};
pub use depth::{CPU_DEPTH, Depth, VramBudget, vram_depth};
pub use entropy::{Entropy, unigram_entropy};
pub use error::{Error, Result};
pub use in_memory::{InMemory, Values};
pub use layout::{Field, SampleLayout};
pub use mnist::{Mnist, Split, Verify};
pub use permutation::{PickKey, PickSpace, epoch_permutation};
pub use plan::{
    BatchPicks, EpochPlan, TailPolicy, equal_partition, plan_batches, weighted_partition,
};
pub use prefetch::{DeviceBatch, Feed, Next, PrefetchConfig, Prefetcher};
pub use record::{Access, RecordFile, RecordWriter, write_records};
pub use residency::Eviction;
pub use shakespeare::{Shakespeare, TextSplit};
pub use staging::{CacheReport, Fill, StagingCache, StagingConfig};
pub use transform::Transform;

//! The [`Checkpoint`] value: everything a run needs to resume exactly.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::config_hash::ConfigHash;
use super::coverage::EpochCoverage;
use super::error::{CheckpointError, Result};
use super::record::TensorSet;
use super::signature::{Expectation, ModelSignature};

/// Why a bundle was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SaveReason {
    /// The periodic save (every N reduces or epochs).
    Periodic,
    /// Asked for by the user.
    OnDemand,
    /// The normal end of training.
    GracefulShutdown,
    /// Every rank died.
    AllRanksLost,
    /// One rank is left and its collective cannot shrink to one.
    SingleSurvivor,
    /// More ranks failed than the configured maximum.
    MaxFailureExceeded,
    /// Reduces stopped completing.
    ReduceStall,
    /// Another failure, described.
    Fault {
        /// What happened.
        detail: String,
    },
    /// Training diverged (a loss or the parameters were not finite): the bundle is the last
    /// good state.
    Diverged,
}

/// A named random-number-generator state as raw `u64` words (e.g. a rank's Xoshiro256++).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngStream {
    /// Whose generator this is (e.g. `"rank0"`, `"coordinator"`).
    pub name: String,
    /// The generator's state words.
    pub words: Vec<u64>,
}

/// An opaque serialised value (ElChe state, scheduler state, ...), encoded with bincode 2.
///
/// The checkpoint does not know the type; the owner encodes and decodes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpaqueState(Vec<u8>);

impl OpaqueState {
    /// Serialises `value`.
    ///
    /// # Errors
    /// [`CheckpointError::Encode`] when the value's `Serialize` fails.
    pub fn encode<T: Serialize>(value: &T) -> Result<Self> {
        bincode::serde::encode_to_vec(value, bincode::config::standard())
            .map(OpaqueState)
            .map_err(|source| CheckpointError::Encode { what: "opaque state", source })
    }

    /// Deserialises the value; every byte must be consumed.
    ///
    /// # Errors
    /// [`CheckpointError::Decode`] when the bytes are not a `T`, or
    /// [`CheckpointError::Malformed`] when bytes are left over.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        let (value, used) = bincode::serde::decode_from_slice(
            &self.0,
            bincode::config::standard().with_limit::<{ MAX_META_BYTES as usize }>(),
        )
        .map_err(|source| CheckpointError::Decode { what: "opaque state", source })?;
        if used != self.0.len() {
            return Err(CheckpointError::malformed(format!(
                "opaque state has {} trailing bytes",
                self.0.len() - used
            )));
        }
        Ok(value)
    }

    /// Wraps bytes the caller serialised itself.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        OpaqueState(bytes)
    }

    /// The serialised bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The largest world size a bundle may name (far above any real run; a resume's work grows with
/// it, so a larger value in a file is malformed).
pub(crate) const MAX_WORLD_SIZE: usize = 1 << 16;

/// Ceiling on a bundle's metadata section (and on any opaque state decoded from it).
pub const MAX_META_BYTES: u64 = 64 << 20;

/// A training checkpoint: the consensus model, optimizer states, cadence state, progress and
/// the run's identity. Written at a reduce; see the [module docs](super) for the file format.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Why it was written.
    pub reason: SaveReason,
    /// Global (cohort) step at the reduce.
    pub global_step: u64,
    /// The epoch in progress.
    pub epoch: u64,
    /// Number of reduces completed (the consensus version).
    pub reduce_version: u64,
    /// World size of the run that wrote it.
    pub world_size: usize,
    /// Hash of the run's canonical configuration.
    pub config_hash: ConfigHash,
    /// Model parameters (consensus), in the replica's order; they define the model signature.
    pub params: TensorSet,
    /// Model buffers, in the replica's order.
    pub buffers: TensorSet,
    /// Inner optimizer state, one set per rank (or a single shared set).
    pub optimizer: Vec<TensorSet>,
    /// Outer optimizer state (SlowMo / DiLoCo momentum, ...).
    pub outer: TensorSet,
    /// The ElChe cadence state, serialised by its owner.
    pub elche: Option<OpaqueState>,
    /// Progress of each epoch pool still open (completed ranges and permutation seed).
    pub coverage: Vec<EpochCoverage>,
    /// Random-number-generator states.
    pub rng: Vec<RngStream>,
    /// Further named states (scheduler, guard, optimizer scalars, ...).
    pub extras: BTreeMap<String, OpaqueState>,
}

impl Checkpoint {
    /// A checkpoint of `params` for a run of `world_size` ranks and configuration `config_hash`,
    /// at step 0 with everything else empty.
    pub fn new(params: TensorSet, world_size: usize, config_hash: ConfigHash) -> Self {
        Checkpoint {
            reason: SaveReason::Periodic,
            global_step: 0,
            epoch: 0,
            reduce_version: 0,
            world_size,
            config_hash,
            params,
            buffers: TensorSet::new(),
            optimizer: Vec::new(),
            outer: TensorSet::new(),
            elche: None,
            coverage: Vec::new(),
            rng: Vec::new(),
            extras: BTreeMap::new(),
        }
    }

    /// The model signature: the parameters' names, shapes and dtypes.
    pub fn signature(&self) -> ModelSignature {
        self.params.signature()
    }

    /// The coverage of `epoch`, if the bundle holds it.
    pub fn coverage_of(&self, epoch: u64) -> Option<&EpochCoverage> {
        self.coverage.iter().find(|c| c.epoch == epoch)
    }

    /// Checks that this bundle belongs to the run described by `expect`: same model signature,
    /// same world size, same configuration hash (checked in that order).
    ///
    /// # Errors
    /// [`CheckpointError::SignatureMismatch`], [`CheckpointError::WorldSizeMismatch`] or
    /// [`CheckpointError::ConfigMismatch`].
    pub fn check_compatible(&self, expect: &Expectation) -> Result<()> {
        expect.signature.check(&self.signature())?;
        if self.world_size != expect.world_size {
            return Err(CheckpointError::WorldSizeMismatch {
                expected: expect.world_size,
                found: self.world_size,
            });
        }
        if self.config_hash != expect.config_hash {
            return Err(CheckpointError::ConfigMismatch {
                expected: expect.config_hash,
                found: self.config_hash,
            });
        }
        Ok(())
    }

    /// Checks the invariants every bundle holds (world size from 1 to 65,536, `MAX_WORLD_SIZE`;
    /// coverage normalised and within bounds, one coverage entry per epoch).
    ///
    /// # Errors
    /// [`CheckpointError::Malformed`] or [`CheckpointError::RangeOutOfBounds`].
    pub fn validate(&self) -> Result<()> {
        if self.world_size == 0 {
            return Err(CheckpointError::malformed("world size 0"));
        }
        // A resume does work per saving rank (the rank map): a file may not ask for unbounded work.
        if self.world_size > MAX_WORLD_SIZE {
            return Err(CheckpointError::malformed(format!(
                "world size {} above the most a bundle may hold ({MAX_WORLD_SIZE})",
                self.world_size
            )));
        }
        for (i, c) in self.coverage.iter().enumerate() {
            c.validate()?;
            if self.coverage[..i].iter().any(|o| o.epoch == c.epoch) {
                return Err(CheckpointError::malformed(format!(
                    "two coverage entries for epoch {}",
                    c.epoch
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::config_hash::ConfigHash;
    use super::super::error::CheckpointError;
    use super::super::record::{TensorRecord, TensorSet};
    use super::{Checkpoint, MAX_WORLD_SIZE};

    #[test]
    fn a_bundle_naming_a_huge_world_is_malformed() -> Result<(), Box<dyn std::error::Error>> {
        let params =
            TensorSet::from_records(vec![TensorRecord::from_f32("w", vec![2], &[1.0, 2.0])?])?;
        let mut ckpt = Checkpoint::new(params, MAX_WORLD_SIZE, ConfigHash::of("huge"));
        ckpt.validate()?;
        ckpt.world_size = MAX_WORLD_SIZE + 1;
        let r = ckpt.validate();
        assert!(matches!(r, Err(CheckpointError::Malformed { .. })), "{r:?}");
        Ok(())
    }
}

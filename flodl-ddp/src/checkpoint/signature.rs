//! Run identity: the [`ModelSignature`], the [`ConfigHash`] and the [`Expectation`] a load checks.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::{CheckpointError, Result};
use super::record::StoredDType;

/// One parameter's identity: name, shape and dtype.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SignatureEntry {
    /// Parameter name.
    pub name: String,
    /// Parameter shape.
    pub shape: Vec<usize>,
    /// Parameter element type.
    pub dtype: StoredDType,
}

/// The identity of a model: its parameters' names, shapes and dtypes, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ModelSignature {
    entries: Vec<SignatureEntry>,
}

impl ModelSignature {
    /// A signature from entries in parameter order.
    pub fn new(entries: Vec<SignatureEntry>) -> Self {
        ModelSignature { entries }
    }

    /// The entries in order.
    pub fn entries(&self) -> &[SignatureEntry] {
        &self.entries
    }

    /// Checks that `found` (a bundle's signature) equals this one (the running model's).
    ///
    /// # Errors
    /// [`CheckpointError::SignatureMismatch`] naming the first difference.
    pub fn check(&self, found: &ModelSignature) -> Result<()> {
        let mismatch = |detail: String| Err(CheckpointError::SignatureMismatch { detail });
        if self.entries.len() != found.entries.len() {
            return mismatch(format!(
                "{} parameters in the bundle, {} in the model",
                found.entries.len(),
                self.entries.len()
            ));
        }
        for (i, (want, got)) in self.entries.iter().zip(&found.entries).enumerate() {
            if want != got {
                return mismatch(format!(
                    "parameter {i}: bundle has {} {} {:?}, model has {} {} {:?}",
                    got.name, got.dtype, got.shape, want.name, want.dtype, want.shape
                ));
            }
        }
        Ok(())
    }
}

/// The sha256 of a run's canonical configuration (a run's bundles record
/// [`RunSpec::compat_hash`](crate::RunSpec::compat_hash)).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConfigHash(pub [u8; 32]);

impl ConfigHash {
    /// Hashes a canonical configuration string (the caller decides the canonical form; the
    /// runtime hashes a canonical binary encoding instead, see `RunSpec`).
    pub fn of(canonical_config: &str) -> Self {
        ConfigHash(Sha256::digest(canonical_config.as_bytes()).into())
    }
}

impl fmt::Display for ConfigHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for ConfigHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConfigHash({self})")
    }
}

/// What a resuming run requires of a bundle: same model, same world size, same configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    /// The running model's parameter signature.
    pub signature: ModelSignature,
    /// The running world size.
    pub world_size: usize,
    /// The running configuration's hash.
    pub config_hash: ConfigHash,
}

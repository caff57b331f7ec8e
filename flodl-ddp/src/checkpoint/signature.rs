//! Run identity: the [`ModelSignature`] and the [`Expectation`] a load checks.

use serde::{Deserialize, Serialize};

use super::config_hash::ConfigHash;
use super::dtype::StoredDType;
use super::error::{CheckpointError, Result};

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

//! The [`ConfigHash`]: a run's configuration as a bundle records it.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

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

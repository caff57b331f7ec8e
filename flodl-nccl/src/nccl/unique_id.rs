//! The NCCL unique id: 128 bytes created by one rank and handed to every other rank.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::library::{Library, RawUniqueId};
use crate::error::{Error, Result};

/// The bytes of an `ncclUniqueId`: rank 0 (or a coordinator) creates one with
/// [`UniqueId::new`] and every rank passes the same id to [`NcclComm::new`](crate::NcclComm::new).
///
/// Serialises as a byte string, so it travels in any serde format (the multi-host control plane
/// sends it in a frame).
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "Vec<u8>", into = "Vec<u8>")]
pub struct UniqueId([u8; UniqueId::LEN]);

impl UniqueId {
    /// The size of an id in bytes.
    pub const LEN: usize = 128;

    /// Asks NCCL for a fresh id (this also starts NCCL's bootstrap listener on this host).
    ///
    /// # Errors
    /// `LibraryMissing` without NCCL; `Nccl` if NCCL fails (e.g. no usable network interface).
    pub fn new() -> Result<UniqueId> {
        let lib = Library::get()?;
        let mut raw = RawUniqueId { internal: [0; UniqueId::LEN] };
        // SAFETY: `ncclGetUniqueId` fills the 128-byte struct it is given.
        lib.check(unsafe { (lib.get_unique_id)(&mut raw) }, None)?;
        Ok(UniqueId(raw.internal.map(|b| b as u8)))
    }

    /// An id from its bytes (as received from the rank that created it).
    pub fn from_bytes(bytes: [u8; UniqueId::LEN]) -> UniqueId {
        UniqueId(bytes)
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8; UniqueId::LEN] {
        &self.0
    }

    pub(crate) fn raw(&self) -> RawUniqueId {
        RawUniqueId { internal: self.0.map(|b| b as std::ffi::c_char) }
    }
}

impl TryFrom<Vec<u8>> for UniqueId {
    type Error = Error;

    fn try_from(bytes: Vec<u8>) -> Result<UniqueId> {
        let len = bytes.len();
        <[u8; UniqueId::LEN]>::try_from(bytes).map(UniqueId).map_err(|_| {
            Error::InvalidArgument(format!(
                "an NCCL unique id has {} bytes, not {len}",
                UniqueId::LEN
            ))
        })
    }
}

impl From<UniqueId> for Vec<u8> {
    fn from(id: UniqueId) -> Vec<u8> {
        id.0.to_vec()
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix: String = self.0[..8].iter().map(|b| format!("{b:02x}")).collect();
        write!(f, "UniqueId({prefix}…)")
    }
}

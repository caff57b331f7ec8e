//! The element type of a stored tensor.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The element type of a stored tensor; its on-disk code is frozen by the format version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StoredDType {
    /// 32-bit IEEE float, 4 little-endian bytes.
    F32,
    /// bfloat16, 2 little-endian bytes (the raw bit pattern).
    Bf16,
    /// 32-bit signed integer, 4 little-endian bytes.
    I32,
}

impl StoredDType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            StoredDType::F32 | StoredDType::I32 => 4,
            StoredDType::Bf16 => 2,
        }
    }
}

impl fmt::Display for StoredDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoredDType::F32 => "f32",
            StoredDType::Bf16 => "bf16",
            StoredDType::I32 => "i32",
        })
    }
}

//! Element types: the closed [`DType`] set and the sealed [`Element`] trait.

use std::fmt;

use half::bf16;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// bfloat16 (storage and conversion; used to compress averaging traffic).
    Bf16,
    /// 32-bit signed integer (class labels).
    I32,
}

impl DType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::Bf16 => 2,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::I32 => "i32",
        })
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for i32 {}
}

/// A Rust type that is the element of some [`DType`]: `f32`, [`half::bf16`] or `i32`.
pub trait Element:
    sealed::Sealed + bytemuck::Pod + Send + Sync + fmt::Debug + PartialEq + 'static
{
    /// The dtype this type stores.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}

impl Element for bf16 {
    const DTYPE: DType = DType::Bf16;
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;
}

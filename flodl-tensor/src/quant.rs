//! The blockwise quantized formats of an f32 delta on the wire: what each byte means.
//!
//! A vector of `n` f32 values is cut into blocks of [`QuantFormat::block`] values (the last block
//! may be shorter). Each block is written as its scale (an f32, little-endian) followed by its
//! codes; blocks follow each other with no padding, so a block starts at a whole byte.
//!
//! | format | block | codes of a block of `b` values | value |
//! |---|---|---|---|
//! | `Int8` | 64 | `b` bytes, each an `i8` in `-127..=127` | `code · scale` |
//! | `Q4` | 128 | `ceil(b/2)` bytes; value `2j` in the low nibble of byte `j`, `2j+1` in the high one; a nibble holds `code + 8`, `code` in `-7..=7` | `code · scale` |
//!
//! The scale is the block's largest magnitude divided by 127 (int8) or 7 (q4), so every value
//! is reproduced within half a step (`scale / 2`) and the largest exactly (up to f32 rounding);
//! an all-zero block has scale 0. Symmetric codes (no zero point) suit deltas, which centre on
//! zero; a trailing unused nibble is written as zero and ignored on reading.
//!
//! Bytes per value, scales included, for whole blocks: int8 `(64 + 4) / 64 = 1.0625`
//! (0.2656× f32), q4 `(64 + 4) / 128 = 0.53125` (0.1328× f32). The block sizes are the smallest
//! powers of two that keep the format within 0.27× and 0.14× of f32: a smaller block has less
//! error (its scale follows the data more closely) but more scale bytes; the measurement behind
//! the choice is `cargo run --release -p flodl-tensor --example quant_blocks`.
//!
//! The kernels ([`crate::ops::quantize`], [`crate::ops::dequantize`],
//! [`crate::ops::quantize_with_feedback`]) run on the CPU; on a CUDA stream they return
//! [`Error::NotOnCpu`](crate::Error::NotOnCpu) (a CUDA version is future work).

use std::fmt;

/// A blockwise quantized wire format of f32 values (see the module docs for the bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// 8-bit symmetric codes, one f32 scale per 64 values.
    Int8,
    /// 4-bit symmetric codes, two per byte, one f32 scale per 128 values.
    Q4,
}

/// The bytes of a block's scale.
pub const SCALE_BYTES: usize = 4;

impl QuantFormat {
    /// Both formats.
    pub const ALL: [QuantFormat; 2] = [QuantFormat::Int8, QuantFormat::Q4];

    /// Values per block (one scale each).
    pub const fn block(self) -> usize {
        match self {
            QuantFormat::Int8 => 64,
            QuantFormat::Q4 => 128,
        }
    }

    /// The largest code magnitude: a block's scale is its largest magnitude divided by this.
    pub const fn levels(self) -> f32 {
        match self {
            QuantFormat::Int8 => 127.0,
            QuantFormat::Q4 => 7.0,
        }
    }

    /// The bytes of the codes of `values` values (a block or less).
    pub(crate) const fn code_bytes(self, values: usize) -> usize {
        match self {
            QuantFormat::Int8 => values,
            QuantFormat::Q4 => values.div_ceil(2),
        }
    }

    /// The bytes of one whole block, scale included.
    pub const fn block_bytes(self) -> usize {
        SCALE_BYTES + self.code_bytes(self.block())
    }

    /// The bytes `n` values take in this format, scales included: `ceil(n / block)` scales plus
    /// the codes (`n` bytes for int8; for q4, half a byte a value, each block rounded up to a
    /// whole byte).
    pub const fn encoded_len(self, n: usize) -> usize {
        let whole = n / self.block();
        let rest = n % self.block();
        let last = if rest == 0 { 0 } else { SCALE_BYTES + self.code_bytes(rest) };
        whole * self.block_bytes() + last
    }

    /// The size of `n` values in this format relative to f32 (`encoded_len(n) / (4n)`); for
    /// whole blocks `block_bytes / (4 · block)`.
    pub fn ratio_to_f32(self, n: usize) -> f64 {
        self.encoded_len(n) as f64 / (4 * n) as f64
    }

    /// The name used on the command line and in logs.
    pub const fn name(self) -> &'static str {
        match self {
            QuantFormat::Int8 => "int8",
            QuantFormat::Q4 => "q4",
        }
    }
}

impl fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

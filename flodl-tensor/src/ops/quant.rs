//! Blockwise quantization of f32 values into the wire formats of [`crate::quant`], and back.

use super::check;
use crate::cpu::quant as k;
use crate::quant::QuantFormat;
use crate::stream::StreamInner;
use crate::{DType, Error, Result, Stream, Tensor};

/// Checks that `bytes` is exactly the encoded size of `n` values.
fn encoded(op: &'static str, format: QuantFormat, n: usize, bytes: usize) -> Result<()> {
    let expected = format.encoded_len(n);
    if bytes == expected { Ok(()) } else { Err(Error::LengthMismatch { op, expected, got: bytes }) }
}

/// Quantizes the f32 tensor `x` into `out` (exactly `format.encoded_len(x.numel())` bytes, laid
/// out as [`crate::quant`] says).
///
/// # Errors
/// [`Error::NonFinite`] naming the first NaN or infinite value (nothing meaningful is written);
/// [`Error::LengthMismatch`] for a wrong `out`; device or dtype mismatch; [`Error::NotOnCpu`] on
/// a CUDA stream (no CUDA kernel yet).
pub fn quantize(format: QuantFormat, x: &Tensor, out: &mut [u8], s: &Stream) -> Result<()> {
    const OP: &str = "quantize";
    check::on(OP, s, DType::F32, &[x])?;
    encoded(OP, format, x.numel(), out.len())?;
    match s.inner() {
        StreamInner::Cpu(w) => k::quantize(w, format, x.as_slice()?, out)
            .map_err(|index| Error::NonFinite { op: OP, index }),
        StreamInner::Cuda(_) => Err(Error::NotOnCpu { op: OP, device: x.device() }),
    }
}

/// Writes the values `bytes` encodes (exactly `format.encoded_len(y.numel())` bytes) into the
/// f32 tensor `y`.
///
/// # Errors
/// [`Error::NonFinite`] when a block's scale is not finite (forged bytes; `index` is the block's
/// first value); [`Error::LengthMismatch`]; device or dtype mismatch; [`Error::NotOnCpu`] on a
/// CUDA stream.
pub fn dequantize(format: QuantFormat, bytes: &[u8], y: &mut Tensor, s: &Stream) -> Result<()> {
    const OP: &str = "dequantize";
    check::on(OP, s, DType::F32, &[y])?;
    encoded(OP, format, y.numel(), bytes.len())?;
    match s.inner() {
        StreamInner::Cpu(w) => k::dequantize(w, format, bytes, y.as_mut_slice()?)
            .map_err(|index| Error::NonFinite { op: OP, index }),
        StreamInner::Cuda(_) => Err(Error::NotOnCpu { op: OP, device: y.device() }),
    }
}

/// Error feedback in one pass: `residual += delta`, that sum quantized into `out`, and `residual`
/// left holding what the codes did not carry (`residual − dequantize(out)`). Over many calls the
/// dequantized outputs add up to the sum of the deltas minus the final residual, which stays
/// within half a quantization step per value.
///
/// # Errors
/// [`Error::NonFinite`] naming the first position where `residual + delta` is not finite,
/// checked before anything is written (`residual` is unchanged); [`Error::LengthMismatch`];
/// shape, device or dtype mismatch; [`Error::NotOnCpu`] on a CUDA stream.
pub fn quantize_with_feedback(
    format: QuantFormat,
    delta: &Tensor,
    residual: &mut Tensor,
    out: &mut [u8],
    s: &Stream,
) -> Result<()> {
    const OP: &str = "quantize_with_feedback";
    check::on(OP, s, DType::F32, &[delta, residual])?;
    check::same_shape(OP, residual, delta)?;
    encoded(OP, format, delta.numel(), out.len())?;
    match s.inner() {
        StreamInner::Cpu(w) => {
            k::quantize_with_feedback(w, format, delta.as_slice()?, residual.as_mut_slice()?, out)
                .map_err(|index| Error::NonFinite { op: OP, index })
        }
        StreamInner::Cuda(_) => Err(Error::NotOnCpu { op: OP, device: delta.device() }),
    }
}

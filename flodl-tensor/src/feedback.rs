//! The sender's memory of what quantization dropped, added back into its next delta.

use crate::quant::QuantFormat;
use crate::{DType, Result, Stream, Tensor, ops};

/// A sender's error-feedback state for one vector of values sent in a quantized format: the
/// part of past deltas the wire has not carried yet. Each [`encode`](ErrorFeedback::encode)
/// sends `delta + residual` and keeps the new rounding error, so the receiver's running sum of
/// what arrived tracks the sender's running sum of deltas within half a quantization step per
/// value, however many steps pass (nothing is lost over time).
///
/// The residual is part of the sender's state: a checkpoint that must resume exactly saves it
/// ([`residual`](ErrorFeedback::residual)) and restores it ([`from_residual`](ErrorFeedback::from_residual)).
#[derive(Debug)]
pub struct ErrorFeedback {
    format: QuantFormat,
    residual: Tensor,
}

impl ErrorFeedback {
    /// A fresh state (zero residual) for vectors of `len` values.
    ///
    /// # Errors
    /// Allocation errors of the stream's device.
    pub fn new(format: QuantFormat, len: usize, s: &Stream) -> Result<ErrorFeedback> {
        Ok(ErrorFeedback { format, residual: Tensor::zeros(&[len], DType::F32, s)? })
    }

    /// A state resuming from a saved residual (a 1-d f32 tensor).
    pub fn from_residual(format: QuantFormat, residual: Tensor) -> ErrorFeedback {
        ErrorFeedback { format, residual }
    }

    /// The format this state encodes in.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// The values not yet carried (what a checkpoint saves).
    pub fn residual(&self) -> &Tensor {
        &self.residual
    }

    /// The bytes one [`encode`](ErrorFeedback::encode) writes.
    pub fn encoded_len(&self) -> usize {
        self.format.encoded_len(self.residual.numel())
    }

    /// Encodes `delta` plus the residual into `out` (exactly [`encoded_len`] bytes) and keeps
    /// the new rounding error.
    ///
    /// # Errors
    /// [`crate::Error::NonFinite`] when `delta + residual` holds a NaN or an infinity (the state
    /// is unchanged; the caller names the sender); shape, length or device errors.
    ///
    /// [`encoded_len`]: ErrorFeedback::encoded_len
    pub fn encode(&mut self, delta: &Tensor, out: &mut [u8], s: &Stream) -> Result<()> {
        ops::quantize_with_feedback(self.format, delta, &mut self.residual, out, s)
    }
}

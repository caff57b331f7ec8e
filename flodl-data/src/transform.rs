//! Transforms: augmentation applied to an uploaded batch, a pure function of each row's pick key.

use flodl_tensor::{Stream, Tensor};

use crate::error::Result;
use crate::permutation::PickKey;

/// An augmentation applied on the device after upload, before the batch is handed over.
///
/// Row `i` of every tensor must be transformed as a pure function of its values and `keys[i]`
/// (sample, repeat, epoch, seed), so a rerun, a resumed run or another rank produces the same
/// values for the same pick.
pub trait Transform: Send + Sync {
    /// Transforms `tensors` (one per layout field, `[n, ..]`) in place, with work issued on
    /// `stream`.
    ///
    /// # Errors
    /// Whatever the transform's kernels fail with.
    fn apply(&self, keys: &[PickKey], tensors: &mut [Tensor], stream: &Stream) -> Result<()>;
}

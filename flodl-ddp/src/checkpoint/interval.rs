//! When periodic saves fall due: every N reduces and/or every N epochs.

use std::num::NonZeroU64;

/// The periodic-save rule: save after every `every_reduces`-th reduce and/or after every
/// `every_epochs`-th completed epoch (`None` turns a trigger off). On-demand saves are separate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct SaveInterval {
    /// Save when the number of completed reduces is a multiple of this.
    pub every_reduces: Option<NonZeroU64>,
    /// Save when the number of completed epochs is a multiple of this.
    pub every_epochs: Option<NonZeroU64>,
}

impl SaveInterval {
    /// No periodic saves.
    pub fn never() -> Self {
        Self::default()
    }

    /// Every `n` reduces (`0` means never).
    pub fn every_reduces(n: u64) -> Self {
        SaveInterval { every_reduces: NonZeroU64::new(n), every_epochs: None }
    }

    /// Every `n` epochs (`0` means never).
    pub fn every_epochs(n: u64) -> Self {
        SaveInterval { every_reduces: None, every_epochs: NonZeroU64::new(n) }
    }

    /// Whether any periodic save is set.
    pub fn is_periodic(&self) -> bool {
        self.every_reduces.is_some() || self.every_epochs.is_some()
    }

    /// Whether a save is due right after the reduce that brought the count of completed
    /// reduces to `reduces_done` (no save at 0).
    pub fn due_after_reduce(&self, reduces_done: u64) -> bool {
        due(self.every_reduces, reduces_done)
    }

    /// Whether a save is due right after the epoch aggregation that brought the count of
    /// completed epochs to `epochs_done` (no save at 0).
    pub fn due_after_epoch(&self, epochs_done: u64) -> bool {
        due(self.every_epochs, epochs_done)
    }
}

fn due(every: Option<NonZeroU64>, done: u64) -> bool {
    every.is_some_and(|n| done > 0 && done.is_multiple_of(n.get()))
}

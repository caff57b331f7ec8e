//! The divergence guard's verdict on one reduce, which ElChe obeys through `ElChe::apply_verdict`.

use serde::{Deserialize, Serialize};

/// What the divergence guard says about the window that just ended.
///
/// `Stable` lets ElChe commit a staged anchor growth; `SuppressGrowth` drops it and latches growth
/// off; `NudgeDown` additionally shrinks the anchor by `factor` (clamped to [0.1, 1]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Verdict {
    /// Replicas agree well enough: growth may proceed.
    Stable,
    /// Divergence is creeping up: do not grow the window.
    SuppressGrowth,
    /// Divergence grows fast: shrink the window by `factor` (0.5 halves the anchor).
    NudgeDown {
        /// The multiplier applied to the anchor, clamped to [0.1, 1].
        factor: f64,
    },
}

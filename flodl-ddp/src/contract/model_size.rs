//! What one replica of a model holds in memory, for the run's memory check.

use serde::{Deserialize, Serialize};

/// A model's size: what one replica holds in memory besides its activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSize {
    /// Trainable parameters (f32 each).
    pub parameters: u64,
    /// Optimizer state per parameter, in f32 values (SGD with momentum 1, Adam 2).
    pub state_per_parameter: u32,
}

impl ModelSize {
    /// Bytes one replica holds: its parameters, their gradients and the optimizer state.
    pub fn replica_bytes(&self) -> u64 {
        let values = 2 + u64::from(self.state_per_parameter);
        self.parameters.saturating_mul(values).saturating_mul(4)
    }
}

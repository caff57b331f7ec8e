//! A model's state on the host: what crosses between ranks, the coordinator and bundles.

use serde::{Deserialize, Serialize};

/// A tensor on the host: shape and row-major f32 values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostTensor {
    /// The shape.
    pub shape: Vec<usize>,
    /// The values, `shape.iter().product()` of them.
    pub data: Vec<f32>,
}

/// A replica's parameters then buffers, each flattened, in the replica's order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct HostState {
    /// Parameter values, in the replica's order.
    pub(crate) params: Vec<Vec<f32>>,
    /// Buffer values, in the replica's order.
    pub(crate) buffers: Vec<Vec<f32>>,
}

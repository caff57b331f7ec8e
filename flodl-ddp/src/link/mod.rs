//! The link between the coordinator and the ranks: the wire messages they exchange.

pub(crate) mod wire;

//! Helpers shared by the integration tests.

#![allow(dead_code)]

pub(crate) mod devtools;
pub(crate) mod http;
pub(crate) mod impostor;
pub(crate) mod launched;
pub(crate) mod prometheus;
pub(crate) mod serving;

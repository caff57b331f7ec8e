//! The running system in two floors: the face the user drives — the `Trainer` builder
//! (`trainer.rs`), the run's description (`spec.rs`), the handles (`handle.rs`) and a cluster
//! run's place (`cluster.rs`), the settings a user names (`settings.rs`, read as text by
//! `as_text.rs`) — above the engine (`engine/`), which runs the coordinator and the
//! ranks' loops and never imports the face.

pub mod as_text;
pub(crate) mod cluster;
pub(crate) mod engine;
pub(crate) mod handle;
pub(crate) mod settings;
#[cfg(test)]
mod settings_tests;
pub(crate) mod spec;
#[cfg(test)]
mod standby_tests;
pub(crate) mod takeover;
pub(crate) mod trainer;

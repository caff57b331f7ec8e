//! Background threads of the data plane.

use std::thread::JoinHandle;

use crate::error::{Error, Result};

/// Spawns a data-plane thread named `flodl-<role>` running `f`.
///
/// # Errors
/// [`Error::Spawn`] when the operating system refuses the thread.
pub(crate) fn spawn<T: Send + 'static>(
    role: &'static str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<JoinHandle<T>> {
    std::thread::Builder::new()
        .name(format!("flodl-{role}"))
        .spawn(f)
        .map_err(|source| Error::Spawn { role, source })
}

//! The tokio runtime a controller or a joined session owns.

use std::sync::Arc;

use tokio::runtime::{Builder, Runtime};

use crate::error::NetError;

/// A shared tokio runtime; the last holder shuts it down.
#[derive(Debug)]
pub(crate) struct Reactor(Option<Runtime>);

impl Reactor {
    pub(crate) fn handle(&self) -> Option<&tokio::runtime::Handle> {
        self.0.as_ref().map(Runtime::handle)
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        // Never blocks (so dropping inside async code cannot panic): by now the owners have waited
        // for their tasks, and the worker threads finish on their own.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// A fresh multi-threaded runtime (two workers: a lane's reader and writer can run at once).
pub(crate) fn reactor(name: &str) -> Result<Arc<Reactor>, NetError> {
    let runtime = Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| NetError::Runtime(e.to_string()))?;
    Ok(Arc::new(Reactor(Some(runtime))))
}

//! The abort handle: a shared, idempotent, thread-safe way to kill a communicator.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A cloneable handle that aborts the communicator group it was taken from.
///
/// Any thread may call [`abort`](Self::abort), any number of times; only the first call acts. Every
/// rank blocked in (or later entering) an operation of the aborted group returns
/// [`Error::Aborted`](crate::Error::Aborted). An aborted communicator stays dead: shrink it
/// ([`HostComm::shrink`](crate::HostComm::shrink)) or rebuild it from a new unique id.
#[derive(Clone)]
pub struct AbortHandle {
    inner: Arc<AbortInner>,
}

struct AbortInner {
    aborted: AtomicBool,
    action: Box<dyn Fn() + Send + Sync>,
}

impl AbortHandle {
    /// Builds a handle that runs `action` on the first abort only.
    pub(crate) fn new(action: impl Fn() + Send + Sync + 'static) -> Self {
        Self {
            inner: Arc::new(AbortInner {
                aborted: AtomicBool::new(false),
                action: Box::new(action),
            }),
        }
    }

    /// Aborts the group: wakes every waiting rank with an error. Idempotent.
    pub fn abort(&self) {
        if !self.inner.aborted.swap(true, Ordering::AcqRel) {
            tracing::warn!("collective group aborted");
            (self.inner.action)();
        }
    }

    /// Whether [`abort`](Self::abort) has been called on this handle (or a clone of it).
    pub fn is_aborted(&self) -> bool {
        self.inner.aborted.load(Ordering::Acquire)
    }
}

impl fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AbortHandle").field("aborted", &self.is_aborted()).finish()
    }
}

//! Ctrl-C during a run: the first press stops it at its next reduce after saving a checkpoint
//! (or aborts it when it saves none), a second press aborts it at once.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Ctrl-C presses since the process started.
static PRESSES: AtomicUsize = AtomicUsize::new(0);

/// Counts Ctrl-C presses from now on instead of letting them kill the process. Without a
/// handler (another one is installed, or the platform refuses) Ctrl-C keeps its default.
pub(crate) fn install() {
    if let Err(e) = ctrlc::set_handler(|| {
        PRESSES.fetch_add(1, Ordering::AcqRel);
    }) {
        tracing::warn!(error = %e, "Ctrl-C cannot be caught: it will kill the run");
    }
}

/// Ctrl-C presses so far.
pub(crate) fn presses() -> usize {
    PRESSES.load(Ordering::Acquire)
}

/// How a run ended when the user interrupted it (the process exits with 130).
#[derive(Debug)]
pub(crate) struct Interrupted {
    /// The checkpoint saved before stopping, when one was.
    pub(crate) bundle: Option<PathBuf>,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.bundle {
            Some(bundle) => {
                let dir = bundle.parent().unwrap_or(bundle);
                write!(
                    f,
                    "interrupted: stopped at a checkpoint saved in {} (resume with --resume {})",
                    bundle.display(),
                    dir.display()
                )
            }
            None => write!(f, "interrupted: the run was aborted and nothing was saved"),
        }
    }
}

impl std::error::Error for Interrupted {}

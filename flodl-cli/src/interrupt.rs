//! Stop requests during a run — Ctrl-C (SIGINT) and SIGTERM, what Slurm and Kubernetes send
//! before a kill — through one handler: the first signal stops the run at its next reduce after
//! saving a checkpoint (or aborts it when it saves none), a second one aborts it at once.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

/// A signal that asks the run to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// SIGINT, Ctrl-C in a terminal.
    Interrupt,
    /// SIGTERM, a scheduler's or `kill`'s request to end.
    Terminate,
}

impl Signal {
    /// The exit status of a process ended by this signal, as a shell reports it (128 + number).
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Signal::Interrupt => 130,
            Signal::Terminate => 143,
        }
    }

    /// How the messages name the signal's effect.
    fn verb(self) -> &'static str {
        match self {
            Signal::Interrupt => "interrupted",
            Signal::Terminate => "terminated",
        }
    }

    /// What the user does to abort after this signal.
    fn again(self) -> &'static str {
        match self {
            Signal::Interrupt => "Ctrl-C again to abort",
            Signal::Terminate => "a second signal aborts",
        }
    }

    fn code(self) -> u8 {
        match self {
            Signal::Interrupt => 1,
            Signal::Terminate => 2,
        }
    }

    fn from_code(code: u8) -> Option<Signal> {
        match code {
            1 => Some(Signal::Interrupt),
            2 => Some(Signal::Terminate),
            _ => None,
        }
    }
}

/// Stop signals received since the process started.
static RECEIVED: AtomicUsize = AtomicUsize::new(0);

/// The first stop signal received ([`Signal::code`]; 0 before any): it decides the exit status.
static FIRST: AtomicU8 = AtomicU8::new(0);

/// Whether a second stop signal ends the process at once ([`exit_on_second`]).
static EXIT_ON_SECOND: AtomicBool = AtomicBool::new(false);

/// Records one stop signal: the one path both signals take. A second one ends a process that
/// asked for it ([`exit_on_second`]) with the first one's status.
fn record(signal: Signal) {
    let _ = FIRST.compare_exchange(0, signal.code(), Ordering::AcqRel, Ordering::Acquire);
    let received = RECEIVED.fetch_add(1, Ordering::AcqRel) + 1;
    if received >= 2 && EXIT_ON_SECOND.load(Ordering::Acquire) {
        let first = first().unwrap_or(signal);
        eprintln!("{}", aborting_line(first));
        std::process::exit(i32::from(first.exit_code()));
    }
}

/// Makes a second stop signal end this process at once: a rank process, which has no run
/// loop of its own to abort (the controller's process stops the run at the first signal), and
/// may be stuck inside a step.
pub(crate) fn exit_on_second() {
    EXIT_ON_SECOND.store(true, Ordering::Release);
}

/// Counts SIGINT and SIGTERM from now on instead of letting them kill the process. Without a
/// handler (the platform refuses) they keep their default.
#[cfg(unix)]
pub(crate) fn install() {
    use signal_hook::consts::signal::{SIGINT, SIGTERM};
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
        Ok(signals) => signals,
        Err(e) => {
            tracing::warn!(error = %e, "stop signals cannot be caught: they will kill the run");
            return;
        }
    };
    // Lives as long as the process: signals are read until it exits.
    let spawned = std::thread::Builder::new().name("fdl-signals".into()).spawn(move || {
        for number in signals.forever() {
            record(if number == SIGTERM { Signal::Terminate } else { Signal::Interrupt });
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "stop signals cannot be caught: they will kill the run");
    }
}

/// Counts Ctrl-C presses from now on (platforms without SIGTERM).
#[cfg(not(unix))]
pub(crate) fn install() {
    if let Err(e) = ctrlc::set_handler(|| record(Signal::Interrupt)) {
        tracing::warn!(error = %e, "Ctrl-C cannot be caught: it will kill the run");
    }
}

/// Stop signals received so far.
pub(crate) fn received() -> usize {
    RECEIVED.load(Ordering::Acquire)
}

/// The first stop signal received, if any.
pub(crate) fn first() -> Option<Signal> {
    Signal::from_code(FIRST.load(Ordering::Acquire))
}

/// The line shown when the first signal stops a run that checkpoints.
pub(crate) fn stopping_line(signal: Signal) -> String {
    format!(
        "{}: stopping at the next reduce after saving a checkpoint ({})",
        signal.verb(),
        signal.again()
    )
}

/// The line shown when a signal aborts the run.
pub(crate) fn aborting_line(signal: Signal) -> String {
    format!("{}: aborting the run", signal.verb())
}

/// How a run ended when a signal stopped it (the process exits with
/// [`Signal::exit_code`]).
#[derive(Debug)]
pub(crate) struct Interrupted {
    /// The signal that stopped it.
    pub(crate) signal: Signal,
    /// The checkpoint saved before stopping, when one was.
    pub(crate) bundle: Option<PathBuf>,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = self.signal.verb();
        match &self.bundle {
            Some(bundle) => {
                let dir = bundle.parent().unwrap_or(bundle);
                write!(
                    f,
                    "{verb}: stopped at a checkpoint saved in {} (resume with --resume {})",
                    bundle.display(),
                    dir.display()
                )
            }
            None => write!(f, "{verb}: the run was aborted and nothing was saved"),
        }
    }
}

impl std::error::Error for Interrupted {}

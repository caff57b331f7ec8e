//! Why a ledger cannot be read or audited.

use std::path::PathBuf;

/// A ledger that cannot be read, naming its file (and line).
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The file cannot be opened, read or written.
    #[error("ledger {}: {source}", file.display())]
    Io {
        /// The ledger file.
        file: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A line is not a ledger entry.
    #[error("ledger {} line {line} is corrupt: {reason}", file.display())]
    Corrupt {
        /// The ledger file.
        file: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The last line is cut short (the writer stopped mid-line).
    #[error("ledger {} is truncated at line {line}", file.display())]
    Truncated {
        /// The ledger file.
        file: PathBuf,
        /// 1-based number of the partial line.
        line: usize,
    },
    /// A resumed run's ledger audited with one that is not of the run it resumed.
    #[error("ledgers {} and {} are not a run and its resumption: {reason}", earlier.display(), later.display())]
    Unrelated {
        /// The earlier run's ledger.
        earlier: PathBuf,
        /// The resumed run's ledger.
        later: PathBuf,
        /// Why not.
        reason: String,
    },
    /// The file holds no header line.
    #[error("ledger {} is empty (no run header)", file.display())]
    Empty {
        /// The ledger file.
        file: PathBuf,
    },
}

impl LedgerError {
    /// An entry that contradicts the run's header or the entries before it.
    pub(super) fn inconsistent(file: &std::path::Path, line: usize, reason: String) -> Self {
        LedgerError::Corrupt { file: file.to_owned(), line, reason }
    }
}

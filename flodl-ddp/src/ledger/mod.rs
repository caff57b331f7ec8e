//! The exactly-once ledger: which sample positions of which epoch each consensus holds, what
//! deaths threw away and where it went again, written by the coordinator as the run goes and
//! audited afterwards (`fdl audit RUN_DIR`).
//!
//! A position indexes an epoch's permutation, as the dispatcher's chunks do. The ledger is
//! computed from the facts the coordinator sees (the chunks handed to each rank in order, each
//! reduce's steps per rank, each death's steps a reduce in progress holds), independently of
//! the dispatcher's book it checks: an audit computed by the rule it audits could not fail.

mod audit;
mod book;
mod entry;
mod error;
mod file;

pub use audit::{Audit, EpochAudit};
pub use book::Book;
pub use entry::{Entry, Header, RankSpan, Resume, Span};
pub use error::LedgerError;
pub use file::{LedgerWriter, read};

/// The ledger's file name inside a run directory.
pub const FILE: &str = "ledger.jsonl";

/// The format version [`Header::version`] carries.
pub const VERSION: u32 = 1;

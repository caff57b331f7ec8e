//! The coordinator's exactly-once trail: the ledger's book fed with what the coordinator does,
//! each entry written to the run's ledger file as it happens.

use std::path::Path;

use crate::checkpoint::EpochCoverage;
use crate::control::dispatch::Chunk;
use crate::ledger::{Book, Entry, Header, LedgerWriter, Resume, Span, VERSION};

/// The ledger being written: the book of each rank's handed positions and the file. A write
/// that fails stops the trail (with a warning): the file then ends early and its audit says
/// so; training goes on.
#[derive(Debug)]
pub(crate) struct Trail {
    book: Book,
    out: Option<LedgerWriter>,
}

/// A chunk as the ledger's span.
fn span(c: &Chunk) -> Span {
    Span { epoch: c.epoch, offset: c.offset, len: c.len }
}

/// A checkpoint's cut as the ledger's resume: the oldest open `epoch`, the `reduces` done, and
/// what `coverage` says the consensus holds of the open epochs.
pub(crate) fn resume_of(epoch: usize, reduces: u64, coverage: &[EpochCoverage]) -> Resume {
    let coverage = coverage
        .iter()
        .flat_map(|c| {
            let epoch = usize::try_from(c.epoch).unwrap_or(usize::MAX);
            c.completed().iter().map(move |r| Span { epoch, offset: r.offset, len: r.size })
        })
        .collect();
    Resume { epoch, reduces, coverage }
}

impl Trail {
    /// Creates the ledger at `path` and writes its header; `None` (with a warning) when it
    /// cannot be created.
    pub(crate) fn open(path: &Path, header: Header) -> Option<Trail> {
        let mut trail = Trail { book: Book::new(header.batch_size), out: None };
        match LedgerWriter::create(path) {
            Ok(w) => trail.out = Some(w),
            Err(e) => {
                tracing::warn!(%e, "no ledger: it cannot be created");
                return None;
            }
        }
        trail.write(&Entry::Run(header));
        Some(trail)
    }

    fn write(&mut self, entry: &Entry) {
        if let Some(out) = &mut self.out
            && let Err(e) = out.write(entry)
        {
            tracing::warn!(%e, "the ledger stops here: an entry cannot be written");
            self.out = None;
        }
    }

    /// `chunk` was handed to `rank`.
    pub(crate) fn handed(&mut self, rank: usize, chunk: &Chunk) {
        self.book.hand(rank, span(chunk));
    }

    /// The `n`th reduce completed with `steps` per rank.
    pub(crate) fn reduced(&mut self, n: u64, steps: &[usize]) {
        let (spans, short) = self.book.reduce(steps);
        if short > 0 {
            tracing::warn!(n, short, "a reduce holds batches no rank was handed");
        }
        self.write(&Entry::Reduce { n, spans });
    }

    /// `rank` died after `after` reduces with `pending` batches in the reduce in progress; the
    /// dispatcher handed `requeued` out again.
    pub(crate) fn died(&mut self, rank: usize, after: u64, pending: usize, requeued: &[Chunk]) {
        let (kept, unreduced) = self.book.retire(rank, pending);
        let requeued = requeued.iter().map(span).collect();
        self.write(&Entry::Death { rank, after, kept, unreduced, requeued });
    }

    /// The run finished after `reduces` reduces.
    pub(crate) fn ended(&mut self, reduces: u64) {
        self.write(&Entry::End { reduces });
    }
}

/// The ledger's header of a run of `world` ranks.
pub(crate) fn header(
    world: usize,
    epochs: usize,
    batch_size: usize,
    batches: usize,
    resumed: Option<Resume>,
) -> Header {
    Header { version: VERSION, world, epochs, batch_size, batches, resumed }
}

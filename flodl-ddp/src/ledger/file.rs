//! The ledger on disk: one JSON entry per line, appended and flushed as the run goes.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::entry::Entry;
use super::error::LedgerError;

/// The longest line a reader accepts (a reduce of many ranks' spans is a few KiB).
const MAX_LINE: u64 = 16 << 20;

/// Appends entries to a ledger file, each flushed whole as it is written, so a crash leaves
/// every entry before it readable.
#[derive(Debug)]
pub struct LedgerWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl LedgerWriter {
    /// Creates (or truncates) the file at `path`.
    ///
    /// # Errors
    /// [`LedgerError::Io`] when it cannot be created.
    pub fn create(path: &Path) -> Result<Self, LedgerError> {
        let file = File::create(path).map_err(|source| io(path, source))?;
        Ok(LedgerWriter { path: path.to_owned(), out: BufWriter::new(file) })
    }

    /// Appends `entry` as one line and flushes it.
    ///
    /// # Errors
    /// [`LedgerError::Io`] when it cannot be written.
    pub fn write(&mut self, entry: &Entry) -> Result<(), LedgerError> {
        let mut line = serde_json::to_vec(entry).map_err(|e| io(&self.path, e.into()))?;
        line.push(b'\n');
        self.out.write_all(&line).map_err(|e| io(&self.path, e))?;
        self.out.flush().map_err(|e| io(&self.path, e))
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn io(file: &Path, source: std::io::Error) -> LedgerError {
    LedgerError::Io { file: file.to_owned(), source }
}

/// Reads every entry of the ledger at `path`, in order.
///
/// # Errors
/// [`LedgerError::Io`] when it cannot be read, [`LedgerError::Empty`] without a line,
/// [`LedgerError::Truncated`] when its last line is cut short, [`LedgerError::Corrupt`] for a
/// line that is no entry (or over 16 MiB), or a first line that is no header or a later one
/// that is.
pub fn read(path: &Path) -> Result<Vec<Entry>, LedgerError> {
    let file = File::open(path).map_err(|e| io(path, e))?;
    let mut reader = BufReader::new(file);
    let mut entries = Vec::new();
    let mut buf = Vec::new();
    for line in 1.. {
        buf.clear();
        let n = (&mut reader)
            .take(MAX_LINE + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|e| io(path, e))?;
        if n == 0 {
            break;
        }
        let corrupt = |reason: String| LedgerError::Corrupt { file: path.to_owned(), line, reason };
        if buf.last() != Some(&b'\n') {
            if n as u64 > MAX_LINE {
                return Err(corrupt(format!("a line over {MAX_LINE} bytes")));
            }
            return Err(LedgerError::Truncated { file: path.to_owned(), line });
        }
        let entry: Entry = serde_json::from_slice(&buf).map_err(|e| corrupt(e.to_string()))?;
        match (&entry, entries.is_empty()) {
            (Entry::Run(_), false) => return Err(corrupt("a second run header".into())),
            (Entry::Run(_), true) => {}
            (_, true) => return Err(corrupt("the first line is no run header".into())),
            (_, false) => {}
        }
        entries.push(entry);
    }
    if entries.is_empty() {
        return Err(LedgerError::Empty { file: path.to_owned() });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::entry::{Header, RankSpan, Span};

    fn entries() -> Vec<Entry> {
        let header =
            Header { version: 1, world: 2, epochs: 1, batch_size: 2, batches: 4, resumed: None };
        let span = Span { epoch: 0, offset: 0, len: 8 };
        vec![
            Entry::Run(header),
            Entry::Reduce { n: 1, spans: vec![RankSpan { rank: 0, span }] },
            Entry::End { reduces: 1 },
        ]
    }

    /// A written ledger reads back as written; a damaged one is a typed error naming the file
    /// and the line.
    #[test]
    fn damaged_ledgers_are_typed_errors_naming_the_file() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("ledger.jsonl");
        let mut w = LedgerWriter::create(&path)?;
        for e in entries() {
            w.write(&e)?;
        }
        drop(w);
        if read(&path)? != entries() {
            return Err("the ledger did not read back as written".into());
        }
        let good = std::fs::read(&path)?;
        // (what is done to the file, the error's kind, the line it names)
        type Damage = (&'static str, Vec<u8>, &'static str, Option<usize>);
        let cut = good[..good.len() - 5].to_vec();
        let mut flipped = good.clone();
        let second = good.iter().position(|&b| b == b'\n').ok_or("one line")? + 3;
        flipped[second] = b'#';
        let no_header =
            good[good.iter().position(|&b| b == b'\n').ok_or("one line")? + 1..].to_vec();
        let cases: Vec<Damage> = vec![
            ("cut mid-line", cut, "truncated", Some(3)),
            ("a byte changed", flipped, "corrupt", Some(2)),
            ("the header lost", no_header, "corrupt", Some(1)),
            ("emptied", Vec::new(), "empty", None),
        ];
        for (what, bytes, kind, line) in cases {
            std::fs::write(&path, bytes)?;
            let e = match read(&path) {
                Ok(_) => return Err(format!("{what}: read as good").into()),
                Err(e) => e,
            };
            let (got_kind, got_line) = match &e {
                LedgerError::Truncated { line, .. } => ("truncated", Some(*line)),
                LedgerError::Corrupt { line, .. } => ("corrupt", Some(*line)),
                LedgerError::Empty { .. } => ("empty", None),
                LedgerError::Io { .. } | LedgerError::Unrelated { .. } => ("other", None),
            };
            let text = e.to_string();
            if (got_kind, got_line) != (kind, line) || !text.contains(&path.display().to_string()) {
                return Err(format!("{what}: {text} ({got_kind}, {got_line:?})").into());
            }
        }
        Ok(())
    }
}

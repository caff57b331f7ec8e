//! A run directory: `metrics.jsonl` written as training goes, `summary.json` and `report.html` at the end.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

use crate::record::{Line, Summary};

/// File names inside a run directory.
pub(crate) const METRICS: &str = "metrics.jsonl";
/// Summary file name.
pub(crate) const SUMMARY: &str = "summary.json";
/// Report file name.
pub(crate) const REPORT: &str = "report.html";

/// An open run directory with its metrics file.
#[derive(Debug)]
pub(crate) struct RunDir {
    path: PathBuf,
    metrics: BufWriter<File>,
    /// Whether `create` made the directory (rather than reusing one).
    created: bool,
    /// Records appended so far.
    appended: usize,
}

impl RunDir {
    /// Creates the directory (and parents) and an empty `metrics.jsonl` in it.
    ///
    /// # Errors
    /// The directory cannot be created or is not writable.
    pub(crate) fn create(path: &Path) -> Result<Self> {
        if path.exists() && !path.is_dir() {
            bail!("output directory {} exists and is not a directory", path.display());
        }
        let created = !path.exists();
        fs::create_dir_all(path)
            .with_context(|| format!("cannot create output directory {}", path.display()))?;
        let metrics_path = path.join(METRICS);
        let file = File::create(&metrics_path)
            .with_context(|| format!("cannot write to output directory {}", path.display()))?;
        Ok(Self { path: path.to_owned(), metrics: BufWriter::new(file), created, appended: 0 })
    }

    /// Removes what `create` made when nothing was recorded (a run refused before training):
    /// the empty `metrics.jsonl` (and the ledger's header), and the directory when `create` made it. Best effort.
    pub(crate) fn discard_if_empty(self) {
        if self.appended > 0 {
            return;
        }
        let _ = fs::remove_file(self.path.join(METRICS));
        let _ = fs::remove_file(self.path.join(flodl_ddp::ledger::FILE));
        if self.created {
            // Fails, harmlessly, when something else was put there meanwhile.
            let _ = fs::remove_dir(&self.path);
        }
    }

    /// The directory.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record to `metrics.jsonl` and flushes it (so a crash keeps what was written).
    ///
    /// # Errors
    /// Writing fails.
    pub(crate) fn append(&mut self, line: &Line) -> Result<()> {
        serde_json::to_writer(&mut self.metrics, line)?;
        self.metrics.write_all(b"\n")?;
        self.appended += 1;
        self.metrics
            .flush()
            .with_context(|| format!("cannot write {}", self.path.join(METRICS).display()))
    }

    /// Writes `summary.json`.
    ///
    /// # Errors
    /// Writing fails.
    pub(crate) fn write_summary(&self, summary: &Summary) -> Result<()> {
        let path = self.path.join(SUMMARY);
        let text = serde_json::to_string_pretty(summary)?;
        fs::write(&path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
    }
}

/// Reads every record of a run directory's `metrics.jsonl`. A last line with no newline that
/// is not a record is a write the run's end cut short (a kill): it is left out.
///
/// # Errors
/// The file is missing or a line is not a valid record (the line number is named).
pub(crate) fn read_metrics(dir: &Path) -> Result<Vec<Line>> {
    let path = dir.join(METRICS);
    let file = File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut records = Vec::new();
    let mut reader = BufReader::new(file);
    let mut line = String::new();
    for number in 1.. {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(record) => records.push(record),
            Err(_) if !line.ends_with('\n') => break,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("{} line {number}: not a metrics record", path.display())
                });
            }
        }
    }
    Ok(records)
}

/// Reads a run directory's `summary.json`.
///
/// # Errors
/// The file is missing or malformed.
pub(crate) fn read_summary(dir: &Path) -> Result<Summary> {
    let path = dir.join(SUMMARY);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot open {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a run summary", path.display()))
}

/// Writes `report.html` into a run directory and returns its path.
///
/// # Errors
/// Writing fails.
pub(crate) fn write_report(dir: &Path, html: &str) -> Result<PathBuf> {
    let path = dir.join(REPORT);
    fs::write(&path, html).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// Current UTC time as (RFC 3339 text, compact `YYYYmmdd-HHMMSS` for directory names).
pub(crate) fn utc_now() -> (String, String) {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (y, mo, d, h, mi, s) = civil_from_unix(secs);
    (
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z"),
        format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}"),
    )
}

/// Splits Unix seconds into a UTC calendar date and time (proleptic Gregorian).
fn civil_from_unix(secs: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days to civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, (rem / 3600) as u32, (rem % 3600 / 60) as u32, (rem % 60) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_match_known_instants() {
        let cases = [
            (0, (1970, 1, 1, 0, 0, 0)),
            (951_782_400, (2000, 2, 29, 0, 0, 0)),
            (1_709_210_096, (2024, 2, 29, 12, 34, 56)),
            (4_102_444_799, (2099, 12, 31, 23, 59, 59)),
        ];
        for (secs, want) in cases {
            assert_eq!(civil_from_unix(secs), want, "{secs}");
        }
    }

    #[test]
    fn corrupt_metrics_name_the_line() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let good = r#"{"kind":"reduce","round":1,"epoch":0,"at_ms":5.0,"anchor":10,"counts":[10,20],"steps":[10,21],"sync_ms":1.5}"#;
        fs::write(dir.path().join(METRICS), format!("{good}\nnot json\n"))?;
        let err = read_metrics(dir.path()).err().map(|e| format!("{e:#}"));
        assert!(err.as_deref().is_some_and(|e| e.contains("line 2")), "{err:?}");
        // A kill mid-write leaves a last line cut short: what came before is read.
        fs::write(dir.path().join(METRICS), format!("{good}\n{}", &good[..40]))?;
        assert_eq!(read_metrics(dir.path())?.len(), 1);
        Ok(())
    }
}

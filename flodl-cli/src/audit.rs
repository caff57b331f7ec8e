//! `fdl audit RUN_DIR`: the run's exactly-once ledger, audited epoch by epoch.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use flodl_ddp::ledger::{self, Audit};

/// Prints the audit of `dir`'s ledger (through the ledgers of `resumed_from`, nearest first: the
/// run whose checkpoint it resumed, the one that run resumed, and so on).
///
/// # Errors
/// A ledger missing, unreadable or corrupt (naming its file); a run whose final model does not
/// hold every sample of every epoch exactly once.
pub(crate) fn run(dir: &Path, resumed_from: &[PathBuf]) -> Result<()> {
    let files: Vec<PathBuf> = resumed_from
        .iter()
        .rev()
        .chain([&dir.to_path_buf()])
        .map(|d| d.join(ledger::FILE))
        .collect();
    let ledgers = files.iter().map(|f| ledger::read(f)).collect::<Result<Vec<_>, _>>()?;
    let runs: Vec<(&Path, &[ledger::Entry])> =
        files.iter().zip(&ledgers).map(|(f, l)| (f.as_path(), l.as_slice())).collect();
    let audit = Audit::chained(&runs)?;
    println!("{audit}");
    if !audit.exactly_once() {
        bail!("not every sample of {} is in the final model exactly once", dir.display());
    }
    Ok(())
}

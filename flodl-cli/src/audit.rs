//! `fdl audit RUN_DIR`: the run's exactly-once ledger, audited epoch by epoch.

use std::path::Path;

use anyhow::{Result, bail};
use flodl_ddp::ledger::{self, Audit};

/// Prints the audit of each run directory's ledger.
///
/// # Errors
/// A ledger missing, unreadable or corrupt (naming its file); a run whose final model does not
/// hold every sample of every epoch exactly once.
pub(crate) fn run(dirs: &[impl AsRef<Path>]) -> Result<()> {
    let mut failed = Vec::new();
    for dir in dirs {
        let file = dir.as_ref().join(ledger::FILE);
        let audit = Audit::read(&file)?;
        if dirs.len() > 1 {
            println!("{}", dir.as_ref().display());
        }
        println!("{audit}");
        if !audit.exactly_once() {
            failed.push(dir.as_ref().display().to_string());
        }
    }
    if !failed.is_empty() {
        bail!("not every sample is in the final model exactly once: {}", failed.join(", "));
    }
    Ok(())
}

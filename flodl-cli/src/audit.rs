//! `fdl audit RUN_DIR`: the run's exactly-once ledger, audited epoch by epoch.

use std::path::Path;

use anyhow::{Result, bail};
use flodl_ddp::ledger::{self, Audit};

/// Prints the audit of `dir`'s ledger (through the ledger of `resumed_from`, the run whose
/// checkpoint it resumed, when given).
///
/// # Errors
/// A ledger missing, unreadable or corrupt (naming its file); a run whose final model does not
/// hold every sample of every epoch exactly once.
pub(crate) fn run(dir: &Path, resumed_from: Option<&Path>) -> Result<()> {
    let file = dir.join(ledger::FILE);
    let audit = match resumed_from {
        None => Audit::read(&file)?,
        Some(earlier) => {
            let earlier = earlier.join(ledger::FILE);
            Audit::resumed(&earlier, &ledger::read(&earlier)?, &file, &ledger::read(&file)?)?
        }
    };
    println!("{audit}");
    if !audit.exactly_once() {
        bail!("not every sample of {} is in the final model exactly once", dir.display());
    }
    Ok(())
}

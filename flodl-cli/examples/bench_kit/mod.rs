//! What the bench examples share: the `fdl` binary they drive and the flags of the 20M-parameter
//! job the wire, overlap and slow-link benches run.

use std::path::{Path, PathBuf};

pub(crate) type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The 20M-parameter job (MLP 784-4096-4096-10) on the host backend under `Cadence`; each bench
/// adds its data, epochs and format flags.
#[allow(dead_code, reason = "each example includes the kit and uses part of it")]
pub(crate) const BIG_MLP: [&str; 6] =
    ["--backend", "host", "--policy", "cadence", "--hidden", "4096,4096"];

/// The `fdl` binary built beside the example (`target/<profile>/fdl`).
pub(crate) fn fdl() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().and_then(Path::parent).ok_or("no target directory")?;
    let fdl = dir.join("fdl");
    if fdl.is_file() {
        Ok(fdl)
    } else {
        Err(format!("{} is missing: build the fdl binary", fdl.display()).into())
    }
}

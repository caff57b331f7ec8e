//! The skip log: the tests that skipped during a CI test step, each with why.
//!
//! A test that cannot run here (no GPU, no `mpirun`, no network namespaces, no browser) calls
//! `flodl_tensor::skip`, which appends `<test binary> <test name>\t<reason>` to the file named by
//! [`LOG_ENV`]. `.ci/run` and `cargo xtask ci` point it at one file per test step and end the
//! step with [`render`]'s list, so a skip never reads as a pass.

use std::path::Path;

/// The environment variable the test processes append their skips to (flodl-tensor's
/// `SKIP_LOG_ENV`; xtask stays free of the workspace's crates, so the name is written here too).
pub(crate) const LOG_ENV: &str = "FLODL_SKIP_LOG";

/// One skipped test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Skip {
    /// `<test binary> <test name>`.
    pub(crate) test: String,
    /// Why it did not run.
    pub(crate) reason: String,
}

/// The skips a log holds (none for a log never written: no test skipped).
pub(crate) fn parse(text: &str) -> Vec<Skip> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_once('\t') {
            Some((test, reason)) => Skip { test: test.into(), reason: reason.into() },
            None => Skip { test: l.into(), reason: String::new() },
        })
        .collect()
}

/// The skips of the log at `path`; none when it does not exist.
///
/// # Errors
/// The file exists but cannot be read.
pub(crate) fn read(path: &Path) -> std::io::Result<Vec<Skip>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(parse(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// `skipped: N`, then one `  <test>: <reason>` line per skip (as `.ci/run` prints it).
pub(crate) fn render(skips: &[Skip]) -> String {
    let mut out = format!("skipped: {}", skips.len());
    for s in skips {
        out.push_str(&format!("\n  {}: {}", s.test, s.reason));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_parse_and_render_as_the_script_prints_them() {
        let cases: [(&str, &str); 3] = [
            ("", "skipped: 0"),
            (
                "it gpu::sync_on_two_gpus\tno CUDA driver\nhosts ranks_on_emulated_hosts\tno netns\n",
                "skipped: 2\n  it gpu::sync_on_two_gpus: no CUDA driver\n  hosts ranks_on_emulated_hosts: no netns",
            ),
            ("\nodd line without a reason\n", "skipped: 1\n  odd line without a reason: "),
        ];
        for (log, want) in cases {
            assert_eq!(render(&parse(log)), want, "{log:?}");
        }
    }

    #[test]
    fn a_log_never_written_holds_no_skip() -> std::io::Result<()> {
        let missing = std::env::temp_dir().join(format!("flodl-no-skips-{}", std::process::id()));
        assert_eq!(read(&missing)?, Vec::new());
        Ok(())
    }
}

//! `fdl audit`: every policy × backend writes a ledger the audit finds exactly once; a ledger
//! cut short, corrupted or missing is an error naming the file, and the exit code says which.

use std::process::Command;

mod support;

use support::launched::{FDL, Result};

/// Every policy on both backends, 3 in-process ranks: `fdl audit` exits 0 and says so; then the
/// same ledger damaged is refused naming the file.
#[test]
fn audits_pass_on_clean_runs_and_refuse_damaged_ledgers() -> Result {
    let tmp = tempfile::tempdir()?;
    for policy in ["sync", "cadence", "async"] {
        for backend in ["collective", "host"] {
            let dir = tmp.path().join(format!("{policy}-{backend}"));
            let run = Command::new(FDL)
                .args(["train", "--ranks", "3", "--epochs", "2", "--quiet"])
                .args(["--train-subset", "4096", "--test-subset", "200"])
                .args(["--policy", policy, "--backend", backend, "--out"])
                .arg(&dir)
                .output()?;
            assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
            let audit = Command::new(FDL).arg("audit").arg(&dir).output()?;
            let out = String::from_utf8_lossy(&audit.stdout);
            assert!(audit.status.success(), "{policy} {backend}: {out}");
            assert!(out.contains("exactly once"), "{policy} {backend}: {out}");
            assert!(out.contains("    1      4096           0        0"), "{out}");
        }
    }
    let dir = tmp.path().join("cadence-host");
    let file = dir.join("ledger.jsonl");
    let good = std::fs::read(&file)?;
    // (what is done to the ledger, what the error says)
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("cut mid-line", good[..good.len() - 3].to_vec(), "is truncated at line"),
        (
            "its end line lost",
            cut_last_line(&good),
            "NOT EXACT: the ledger ends before the run did",
        ),
        ("garbage", b"{\"run\":7}\n".to_vec(), "line 1 is corrupt"),
    ];
    for (what, bytes, says) in cases {
        std::fs::write(&file, bytes)?;
        let audit = Command::new(FDL).arg("audit").arg(&dir).output()?;
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&audit.stdout),
            String::from_utf8_lossy(&audit.stderr)
        );
        assert!(!audit.status.success(), "{what}: the audit passed: {all}");
        assert!(all.contains(says), "{what}: {all}");
        if !says.starts_with("NOT EXACT") {
            assert!(all.contains(&file.display().to_string()), "{what}: names no file: {all}");
        }
    }
    std::fs::remove_file(&file)?;
    let audit = Command::new(FDL).arg("audit").arg(&dir).output()?;
    let err = String::from_utf8_lossy(&audit.stderr);
    assert!(!audit.status.success() && err.contains(&file.display().to_string()), "{err}");
    Ok(())
}

/// `bytes` without its last line.
fn cut_last_line(bytes: &[u8]) -> Vec<u8> {
    let body = &bytes[..bytes.len().saturating_sub(1)];
    let end = body.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    bytes[..end].to_vec()
}

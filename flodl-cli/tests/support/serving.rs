//! A real `fdl train --dashboard` run in the background, for tests that watch it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::http;

/// A training run serving a dashboard; killed when dropped.
#[derive(Debug)]
pub(crate) struct Serving {
    child: Child,
    /// The URL it printed (`http://127.0.0.1:PORT/...`).
    pub(crate) url: String,
    /// `127.0.0.1:PORT`.
    pub(crate) host: String,
    /// Its stdout lines after the URL (read on a thread so the pipe never fills).
    pub(crate) lines: mpsc::Receiver<String>,
    _dir: tempfile::TempDir,
}

/// A run long enough to be watched for a minute or more: 2 CPU ranks, 6,000 images, 300 epochs.
pub(crate) const LONG: [&str; 12] = [
    "--ranks",
    "2",
    "--train-subset",
    "6000",
    "--test-subset",
    "500",
    "--batch-size",
    "32",
    "--epochs",
    "300",
    "--quiet",
    "--dashboard",
];

impl Serving {
    /// Starts `fdl train ARGS --out TMP` and waits (60 s at most) for the dashboard's URL.
    pub(crate) fn start(fdl: &str, args: &[&str]) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = dir.path().join("run");
        let mut child = Command::new(fdl)
            .arg("train")
            .args(args)
            .arg("--out")
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {fdl}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let url = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(url) = line.strip_prefix("dashboard: ") {
                        break url.to_owned();
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("fdl printed no dashboard URL within 60 s".into());
                }
            }
        };
        let (host, _) = http::split_url(&url)?;
        Ok(Self { child, url, host, lines, _dir: dir })
    }

    /// The run directory's parent (a temporary directory).
    pub(crate) fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// Waits (`within` at most) for the run to end by itself; its exit success.
    pub(crate) fn wait(&mut self, within: Duration) -> Result<bool, String> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Ok(status.success());
            }
            if Instant::now() > deadline {
                return Err(format!("the run did not end within {within:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        // Only this child, by its own handle.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

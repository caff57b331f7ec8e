//! The live page in a real headless browser (Debian's `chromium`): during a run it loads
//! without console errors, and its numbers change between two screenshots.
//!
//! Runs only with `FLODL_BROWSER_TESTS=1` (`.ci/run` installs chromium and sets it); without it
//! the test prints `skipped: ...` and checks nothing; with it and no chromium, it fails.

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use support::devtools::Browser;
use support::serving::{LONG, Serving};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const FDL: &str = env!("CARGO_BIN_EXE_fdl");

/// What the test reads off the page: the updates applied, the status line, the key figures,
/// the charts and ranks shown, script errors seen by the page itself.
const READ_PAGE: &str = r##"(() => {
  const b = document.body;
  if (!b || !document.getElementById("live")) {
    return { updates: 0, loading: true };
  }
  return {
    updates: Number(b.dataset.updates || 0),
    seq: Number(b.dataset.seq || 0),
    errors: Number(b.dataset.errors || 0),
    status: (document.getElementById("status") || {}).textContent || "",
    figures: Array.from(document.querySelectorAll(".figure b")).map((e) => e.textContent),
    charts: document.querySelectorAll("#live svg").length,
    ranks: document.querySelectorAll("#ranks tr").length - 1,
    connection: document.getElementById("conn").textContent,
  };
})()"##;

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("chromium")).find(|p| p.is_file())
}

/// Waits (until `deadline`) for the page to have applied more than `past` updates.
fn read_after(browser: &mut Browser, past: u64, deadline: Instant) -> Result<Value> {
    loop {
        let page = browser.eval(READ_PAGE)?;
        if page["updates"].as_u64().is_some_and(|n| n > past) {
            return Ok(page);
        }
        if Instant::now() > deadline {
            return Err(format!("no update past {past} before the deadline: {page}").into());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn the_live_page_updates_in_a_headless_browser() -> Result {
    if std::env::var("FLODL_BROWSER_TESTS").as_deref() != Ok("1") {
        flodl_tensor::skip("FLODL_BROWSER_TESTS=1 is not set (this test drives headless chromium)");
        return Ok(());
    }
    let chromium = chromium().ok_or("FLODL_BROWSER_TESTS=1 but chromium is not on PATH")?;
    let mut args = LONG.to_vec();
    args.push("127.0.0.1:0");
    let run = Serving::start(FDL, &args)?;
    let profile = tempfile::tempdir()?;
    let mut browser = Browser::launch(&chromium, profile.path(), 1280, 1700)?;
    browser.navigate(&run.url)?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let first = read_after(&mut browser, 0, deadline)?;
    let shot_1 = browser.screenshot()?;
    // Two more updates: at least a second of training later.
    let updates = first["updates"].as_u64().unwrap_or(0);
    let second = read_after(&mut browser, updates + 1, deadline)?;
    let shot_2 = browser.screenshot()?;

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    for (name, shot) in [("dashboard-1.png", &shot_1), ("dashboard-2.png", &shot_2)] {
        std::fs::write(dir.join(name), shot)?;
        println!("screenshot: {}", dir.join(name).display());
    }
    let errors = browser.errors.clone();
    browser.close();
    drop(run);

    assert!(errors.is_empty(), "console errors: {errors:#?}");
    for page in [&first, &second] {
        assert_eq!(page["errors"], 0, "script errors: {page}");
        assert_eq!(page["charts"], 6, "the report's charts: {page}");
        assert_eq!(page["ranks"], 2, "{page}");
        assert_eq!(page["connection"], "live", "{page}");
        assert!(page["status"].as_str().is_some_and(|s| s.starts_with("running")), "{page}");
    }
    assert!(second["seq"].as_u64() > first["seq"].as_u64(), "{first} then {second}");
    assert_ne!(first["status"], second["status"], "the clock did not move");
    assert_ne!(first["figures"], second["figures"], "no figure changed");
    assert!(shot_1.starts_with(b"\x89PNG") && shot_2.starts_with(b"\x89PNG"));
    assert_ne!(shot_1, shot_2, "the two screenshots are the same");
    Ok(())
}

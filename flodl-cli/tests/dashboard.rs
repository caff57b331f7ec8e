//! `fdl train --dashboard` end to end: a real run's page, event stream and `/metrics` answer
//! while it trains, and their numbers move; a token guards them; a taken address is one line.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;

use support::http;
use support::serving::{LONG, Serving};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const FDL: &str = env!("CARGO_BIN_EXE_fdl");

/// `/metrics` of a run, read strictly.
fn scrape(host: &str, query: &str) -> Result<std::collections::BTreeMap<String, f64>> {
    let answer = http::get(host, &format!("/metrics{query}"))?;
    assert_eq!(answer.status, 200, "{}", answer.body);
    Ok(support::prometheus::parse(&answer.body)?)
}

/// While a run trains: the page has the report's six charts, the event stream delivers
/// snapshots with growing sequence numbers, and two scrapes of `/metrics` a moment apart
/// differ in elapsed time and in work done.
#[test]
fn a_running_job_serves_a_live_page_events_and_metrics() -> Result {
    let mut args = LONG.to_vec();
    args.extend(["127.0.0.1:0", "--dashboard-token", "t0k"]);
    let run = Serving::start(FDL, &args)?;
    assert!(run.url.ends_with("/?token=t0k"), "{}", run.url);
    let host = run.host.as_str();

    let page = http::get(host, "/?token=t0k")?;
    assert_eq!(page.status, 200);
    assert_eq!(page.body.matches("<svg").count(), 6, "the report's charts");
    assert!(page.body.contains("<script>") && !page.body.contains("src="));
    assert_eq!(http::get(host, "/")?.status, 401);
    assert_eq!(http::get(host, "/metrics?token=nope")?.status, 403);

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut events = http::Events::open(host, "/events?token=t0k")?;
    let mut seqs = Vec::new();
    while seqs.len() < 3 {
        let data = events.next(deadline)?.ok_or("the event stream ended")?;
        let update: Value = serde_json::from_str(&data)?;
        assert_eq!(update["stage"], "running");
        assert!(update["html"].as_str().is_some_and(|h| h.matches("<svg").count() == 6));
        seqs.push(update["seq"].as_u64().ok_or("no seq")?);
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    let first = scrape(host, "?token=t0k")?;
    // Wait for more work and a finished (evaluated) epoch, a minute at most.
    let key = "fdl_rank_samples_total{rank=\"0\",device=\"cpu\"}";
    let later = loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = scrape(host, "?token=t0k")?;
        let epochs = now.get("fdl_epochs_completed").copied().unwrap_or(0.0);
        if (now.get(key) > first.get(key) && epochs >= 1.0) || Instant::now() > deadline {
            break now;
        }
    };
    assert_eq!(first.get("fdl_run_running"), Some(&1.0));
    assert!(later.get(key) > first.get(key), "no progress: {first:?} then {later:?}");
    assert!(later["fdl_elapsed_seconds"] > first["fdl_elapsed_seconds"]);
    assert!(later["fdl_reduces_total"] >= first["fdl_reduces_total"]);
    for series in ["fdl_rank_batch_share", "fdl_elche_anchor_batches", "fdl_test_accuracy"] {
        assert!(later.keys().any(|k| k.starts_with(series)), "{series} missing: {later:?}");
    }
    Ok(())
}

/// A short run with a dashboard ends normally, printing the URL once; the server is gone after.
#[test]
fn a_finished_run_closes_its_dashboard() -> Result {
    let args = [
        "--ranks",
        "2",
        "--train-subset",
        "1024",
        "--test-subset",
        "200",
        "--epochs",
        "2",
        "--quiet",
        "--dashboard",
        "127.0.0.1:0",
    ];
    let mut run = Serving::start(FDL, &args)?;
    let host = run.host.clone();
    let report = run.dir().join("run/report.html");
    assert!(run.wait(Duration::from_secs(120))?, "the run failed");
    assert!(report.is_file());
    assert!(http::get(&host, "/").is_err(), "still serving after the run");
    Ok(())
}

/// An address that cannot be bound stops `fdl train` before training, with one line naming it,
/// and leaves no run directory.
#[test]
fn a_taken_address_is_a_one_line_error() -> Result {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?.to_string();
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("run");
    let out_s = out.to_str().ok_or("path")?;
    let cases: [(&[&str], &[&str]); 3] = [
        (&["--dashboard", &addr], &["cannot serve the dashboard", &addr]),
        (&["--dashboard", "example.org:80"], &["example.org:80"]),
        (&["--dashboard-token", "x"], &["dashboard-token needs dashboard"]),
    ];
    for (extra, needles) in cases {
        let mut args = vec!["train", "--ranks", "2", "--epochs", "1", "--out", out_s];
        args.extend(extra);
        let output = std::process::Command::new(FDL).args(&args).output()?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{extra:?}: succeeded");
        assert_eq!(stderr.lines().count(), 1, "{extra:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{extra:?}: {stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{extra:?}: {needle} missing from {stderr}");
        }
        assert!(!out.exists(), "{extra:?}: left {}", out.display());
    }
    Ok(())
}

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

/// On loopback, a request whose `Host` is another site's name (a page that rebound its name to
/// 127.0.0.1) is turned away before any work; a loopback `Host` is served.
#[test]
fn a_loopback_dashboard_answers_loopback_hosts_only() -> Result {
    use std::io::{Read, Write};
    let mut args = LONG.to_vec();
    args.push("127.0.0.1:0");
    let run = Serving::start(FDL, &args)?;
    for (host, status) in [("evil.example:80", "421"), (run.host.as_str(), "200")] {
        let mut stream = std::net::TcpStream::connect(&run.host)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(stream, "GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        let first = answer.lines().next().unwrap_or_default();
        assert!(first.contains(status), "Host {host}: {first}");
    }
    Ok(())
}

/// A network namespace for one test, with a veth pair whose one end holds the addresses
/// (deleted on drop).
struct Namespace(String);

impl Namespace {
    fn make(addrs: &[&str]) -> Result<Namespace> {
        let name = format!("flodl-dash-{}", std::process::id());
        let ip = |args: &[&str]| -> Result {
            let out = std::process::Command::new("ip").args(args).output()?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr))
                    .into())
            }
        };
        ip(&["netns", "add", &name])?;
        let ns = Namespace(name.clone());
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        ip(&["-n", &name, "link", "add", "v0", "type", "veth", "peer", "name", "v1"])?;
        for addr in addrs {
            ip(&["-n", &name, "addr", "add", &format!("{addr}/24"), "dev", "v0"])?;
        }
        ip(&["-n", &name, "link", "set", "v0", "up"])?;
        ip(&["-n", &name, "link", "set", "v1", "up"])?;
        Ok(ns)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Sets this process's open-file limit to `soft` (its hard limit when `None`), which children
/// started after inherit; returns the limit set.
fn set_nofile(soft: Option<u64>) -> std::result::Result<u64, String> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        limit.rlim_cur = soft.map_or(limit.rlim_max, |s| s.min(limit.rlim_max));
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
    }
    Ok(limit.rlim_cur)
}

/// The dashboard on a non-loopback address (in a network namespace this test makes) under
/// 10,000 idle connections from one address: the page still answers another address, and
/// training goes on (the samples counted in `/metrics` grow while the flood holds). Needs root
/// for `ip netns`; without it, it prints why and skips, unless `FLODL_REQUIRE_NETNS=1`.
#[test]
fn the_dashboard_answers_under_ten_thousand_idle_connections() -> Result {
    const IDLE: usize = 10_000;
    const SERVER: &str = "10.214.7.1";
    const FLOODER: &str = "10.214.7.2";
    const FDL_NOFILE: u64 = 4096;
    let ns = match Namespace::make(&[SERVER, FLOODER]) {
        Ok(ns) => ns,
        Err(e) if std::env::var("FLODL_REQUIRE_NETNS").as_deref() != Ok("1") => {
            println!("skipped: network namespaces are not available here ({e})");
            return Ok(());
        }
        Err(e) => return Err(format!("FLODL_REQUIRE_NETNS=1 but: {e}").into()),
    };
    let hard = set_nofile(None)?;
    if hard < IDLE as u64 + 1024 {
        return Err(format!("the open-file limit is {hard}, below {IDLE} + 1024").into());
    }
    let netns = std::fs::File::open(std::path::Path::new("/run/netns").join(&ns.0))?;
    // One thread enters the namespace; fdl, started from it, runs there too.
    let inside = std::thread::spawn(move || -> std::result::Result<(), String> {
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("setns: {e}"))?;
        let mut args = LONG.to_vec();
        let bind = format!("{SERVER}:0");
        args.extend([bind.as_str(), "--dashboard-token", "t0k"]);
        // fdl runs with a common default limit, well below the flood: a server that kept every
        // idle connection would run out of descriptors; this process holds them all.
        set_nofile(Some(FDL_NOFILE))?;
        let started = Serving::start(FDL, &args);
        set_nofile(None)?;
        let run = started?;
        let host = run.host.clone();
        let key = "fdl_rank_samples_total{rank=\"0\",device=\"cpu\"}";
        let samples = || -> std::result::Result<f64, String> {
            let m = scrape(&host, "?token=t0k").map_err(|e| e.to_string())?;
            Ok(m.get(key).copied().unwrap_or(0.0))
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let server: std::net::SocketAddr = host.parse().map_err(|e| format!("{host}: {e}"))?;
        let source: std::net::SocketAddr =
            format!("{FLOODER}:0").parse().map_err(|e| format!("{e}"))?;
        // The flood: IDLE connections that never send a byte, held open.
        let (held, connected) = runtime.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..IDLE {
                tasks.spawn(async move {
                    let socket = tokio::net::TcpSocket::new_v4().ok()?;
                    socket.bind(source).ok()?;
                    tokio::time::timeout(Duration::from_secs(20), socket.connect(server))
                        .await
                        .ok()?
                        .ok()
                });
            }
            let mut held = Vec::with_capacity(IDLE);
            while let Some(joined) = tasks.join_next().await {
                if let Ok(Some(stream)) = joined {
                    held.push(stream);
                }
            }
            let connected = held.len();
            (held, connected)
        });
        println!("{connected} of {IDLE} idle connections established");
        if connected < IDLE / 2 {
            return Err(format!("only {connected} of {IDLE} idle connections were made"));
        }
        let before = samples()?;
        let page = http::get(&host, "/?token=t0k")?;
        if page.status != 200 || page.body.matches("<svg").count() != 6 {
            return Err(format!("the page under the flood: status {}", page.status));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let after = loop {
            std::thread::sleep(Duration::from_millis(500));
            let now = samples()?;
            if now > before || Instant::now() > deadline {
                break now;
            }
        };
        if after <= before {
            return Err(format!("training stalled under the flood: {before} then {after}"));
        }
        drop(held);
        drop(run);
        Ok(())
    });
    inside.join().map_err(|_| "the namespace thread panicked")??;
    Ok(())
}

//! The live dashboard of a running job (`fdl train --dashboard`): a read-only page with the
//! report's charts, updated over server-sent events, and `/metrics` for Prometheus.
//!
//! The training loop hands each record to a [`Feed`] (a bounded channel, never blocking: a
//! record that does not fit is dropped from the dashboard, not from `metrics.jsonl`); the
//! server runs on its own thread and tokio runtime, renders the live record into a snapshot at
//! most twice a second and serves that snapshot until the next one.

mod address;
mod error;
mod live;
mod page;
mod prometheus;
mod server;

// The integration tests' HTTP client and Prometheus reader, one copy for both kinds of test.
#[cfg(test)]
#[path = "../../tests/support/http.rs"]
mod http_client;
#[cfg(test)]
#[path = "../../tests/support/prometheus.rs"]
mod prometheus_text;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

use tokio::sync::mpsc;

use crate::record::Line;

pub(crate) use address::{Bind, DEFAULT_PORT};
pub(crate) use error::DashboardError;
pub(crate) use live::{Ending, Meta};

use address::Access;
use live::LiveRun;
use server::Server;

/// Records the feed holds for the server before it drops new ones.
const FEED_CAPACITY: usize = 4096;

/// A running dashboard.
#[derive(Debug)]
pub(crate) struct Dashboard {
    url: String,
    feed: Feed,
    server: Server,
}

/// The run's side of the dashboard: hands records over without ever waiting.
#[derive(Debug, Clone)]
pub(crate) struct Feed {
    records: mpsc::Sender<Line>,
}

impl Feed {
    /// Passes a record on; when the dashboard is behind by [`FEED_CAPACITY`] records, it
    /// misses this one (training never waits for it).
    pub(crate) fn record(&self, line: &Line) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.records.try_send(line.clone()) {
            tracing::debug!("dashboard behind: a record skipped");
        }
    }
}

impl Dashboard {
    /// Binds `bind` and starts serving the run described by `meta`; `token` is
    /// `--dashboard-token` (a random one is made when the address is not loopback).
    ///
    /// # Errors
    /// The address cannot be bound, the token is unusable, or the server cannot start.
    pub(crate) fn start(
        bind: Bind,
        token: Option<&str>,
        meta: Meta,
    ) -> Result<Self, DashboardError> {
        let access = Access::for_bind(bind, token)?;
        let listener = listen(bind)?;
        let addr = listener.local_addr().map_err(DashboardError::Start)?;
        let url = format!("http://{addr}/{}", access.query());
        let (records, incoming) = mpsc::channel(FEED_CAPACITY);
        let server = Server::spawn(listener, access, LiveRun::new(meta), incoming)?;
        Ok(Self { url, feed: Feed { records }, server })
    }

    /// The page's URL, token included.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// A handle for the training loop.
    pub(crate) fn feed(&self) -> Feed {
        self.feed.clone()
    }

    /// Shows the run as ended and stops serving (within a couple of seconds).
    pub(crate) fn close(self, ending: Ending) {
        self.server.stop(ending);
    }
}

/// Binds the listening socket: a [`Bind::Loopback`] falls back to a free port when
/// [`DEFAULT_PORT`] is taken.
fn listen(bind: Bind) -> Result<TcpListener, DashboardError> {
    let at = |addr: SocketAddr| {
        TcpListener::bind(addr).map_err(|source| DashboardError::Bind { addr, source })
    };
    match bind {
        Bind::At(addr) => at(addr),
        Bind::Loopback => {
            let preferred = SocketAddr::from((Ipv4Addr::LOCALHOST, DEFAULT_PORT));
            match at(preferred) {
                Err(DashboardError::Bind { source, .. })
                    if source.kind() == std::io::ErrorKind::AddrInUse =>
                {
                    at(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
                }
                other => other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    use serde_json::Value;

    use live::tests::{meta, reduce};

    use super::http_client as http;
    use super::prometheus_text;

    type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    fn local() -> Result<Bind> {
        Ok("127.0.0.1:0".parse()?)
    }

    fn next_event(events: &mut http::Events, deadline: Instant) -> Result<Value> {
        let data = events.next(deadline)?.ok_or("the stream ended")?;
        Ok(serde_json::from_str(&data)?)
    }

    /// A new record reaches a connected page; closing shows the run as ended, then ends the
    /// stream and the server.
    #[test]
    fn events_carry_each_new_record_and_end_with_the_run() -> Result {
        let dashboard = Dashboard::start(local()?, None, meta())?;
        let (host, path) = http::split_url(dashboard.url())?;
        assert_eq!(path, "/", "no token on loopback");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut events = http::Events::open(&host, "/events")?;
        let first = next_event(&mut events, deadline)?;
        assert_eq!(first["stage"], "running");
        assert!(first["html"].as_str().is_some_and(|h| h.contains("<svg")), "{first}");
        dashboard.feed().record(&reduce(1, [4, 12]));
        let anchor = ">5</b><span>ElChe anchor";
        let seen = loop {
            let e = next_event(&mut events, deadline)?;
            if e["html"].as_str().is_some_and(|h| h.contains(anchor)) {
                break e;
            }
        };
        assert!(seen["seq"].as_u64() > first["seq"].as_u64(), "{seen}");
        dashboard.close(Ending::Completed);
        let mut last = None;
        while let Some(data) = events.next(deadline)? {
            last = Some(serde_json::from_str::<Value>(&data)?);
        }
        assert_eq!(last.map(|l| l["stage"].clone()), Some(Value::from("completed")));
        assert!(http::get(&host, "/").is_err(), "the server still answers");
        Ok(())
    }

    /// With a token, every route refuses a request without it (401) or with another (403).
    #[test]
    fn a_token_is_asked_of_every_route() -> Result {
        let dashboard = Dashboard::start(local()?, Some("s3cret"), meta())?;
        let (host, path) = http::split_url(dashboard.url())?;
        assert_eq!(path, "/?token=s3cret");
        for route in ["/", "/events", "/metrics", "/elsewhere"] {
            assert_eq!(http::get(&host, route)?.status, 401, "{route}");
            assert_eq!(http::get(&host, &format!("{route}?token=s3cre"))?.status, 403, "{route}");
            assert_eq!(http::get(&host, &format!("{route}?x=1&token="))?.status, 403, "{route}");
        }
        let page = http::get(&host, "/?token=s3cret")?;
        assert_eq!(page.status, 200);
        assert!(page.body.contains("<svg") && page.headers.contains("no-referrer"));
        let metrics = http::get(&host, "/metrics?token=s3cret")?;
        assert_eq!(metrics.status, 200);
        assert!(metrics.headers.contains("text/plain; version=0.0.4"), "{}", metrics.headers);
        let series = prometheus_text::parse(&metrics.body)?;
        assert_eq!(series.get("fdl_run_running"), Some(&1.0));
        assert_eq!(http::get(&host, "/elsewhere?token=s3cret")?.status, 404);
        let mut events = http::Events::open(&host, "/events?token=s3cret")?;
        next_event(&mut events, Instant::now() + Duration::from_secs(30))?;
        dashboard.close(Ending::Completed);
        Ok(())
    }

    /// An address in use is a typed error naming it; `auto` moves to a free port instead.
    #[test]
    fn bind_errors_are_typed_and_auto_finds_a_free_port() -> Result {
        let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = taken.local_addr()?;
        match Dashboard::start(Bind::At(addr), None, meta()) {
            Err(DashboardError::Bind { addr: a, source }) => {
                assert_eq!(a, addr);
                assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
            }
            other => return Err(format!("expected a bind error, got {other:?}").into()),
        }
        // Hold the default port (unless something else already does): `auto` goes elsewhere.
        let _held = std::net::TcpListener::bind(("127.0.0.1", DEFAULT_PORT));
        let dashboard = Dashboard::start(Bind::Loopback, None, meta())?;
        let (host, _) = http::split_url(dashboard.url())?;
        assert!(host.starts_with("127.0.0.1:") && !host.ends_with(&format!(":{DEFAULT_PORT}")));
        assert_eq!(http::get(&host, "/")?.status, 200);
        dashboard.close(Ending::Completed);
        Ok(())
    }
}

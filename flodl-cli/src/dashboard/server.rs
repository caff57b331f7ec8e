//! The HTTP side: an axum router served by hyper's HTTP/1 on its own tokio runtime thread (a
//! deadline on each request head, a cap on connections in all and per address), the task that
//! turns the run's records into snapshots, and the read-only routes (`/`, `/events`,
//! `/metrics`), each behind the guard (the `Host` on loopback, the token) before any work.

use std::convert::Infallible;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use futures_util::Stream;
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot, watch};

use crate::record::Line;

use super::address::{Access, Verdict};
use super::error::DashboardError;
use super::live::{Ending, LiveRun};
use super::{page, prometheus};

/// The shortest time between two renders: records arriving faster are batched.
const MIN_INTERVAL: Duration = Duration::from_millis(500);
/// The pause after a render is at least this many times the render's own time, so the
/// dashboard takes at most a few percent of a core however large the record grows.
const PAUSE_PER_RENDER: u32 = 20;
/// A render at least this often, so the clock moves between records.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long stopping waits for the server's thread.
const STOP_DEADLINE: Duration = Duration::from_secs(2);
/// How long a connection may take to send a request head: a client that holds a socket without
/// asking anything is closed after it.
const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once; one more is closed as soon as it is accepted.
const MAX_CONNECTIONS: usize = 256;
/// Connections served at once from one address, so one client cannot take every slot.
const MAX_PER_ADDRESS: usize = 32;

/// The run as rendered at one moment: what every route serves until the next one.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// Increases with every render.
    seq: u64,
    /// The live part of the page.
    fragment: String,
    /// `/metrics`.
    metrics: String,
    /// The SSE message: `{"seq", "stage", "html"}`.
    event: String,
}

impl Snapshot {
    fn of(live: &LiveRun, seq: u64) -> Self {
        let figures = live.figures();
        let fragment = page::fragment(live, &figures);
        let metrics = prometheus::render(live.meta(), &figures);
        let event = serde_json::json!({
            "seq": seq,
            "stage": figures.stage.label(),
            "html": fragment,
        })
        .to_string();
        Self { seq, fragment, metrics, event }
    }
}

/// What the routes share.
#[derive(Debug, Clone)]
struct App {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    access: Arc<Access>,
    /// Whether the server listens on loopback only: a request's `Host` must then name
    /// loopback too (a page elsewhere cannot reach it by rebinding its own name to 127.0.0.1).
    loopback: bool,
    name: Arc<str>,
}

/// The running server: its thread, and the signals that stop it.
#[derive(Debug)]
pub(crate) struct Server {
    stop: oneshot::Sender<Ending>,
    finished: std::sync::mpsc::Receiver<()>,
    thread: JoinHandle<()>,
}

impl Server {
    /// Serves `live` on `listener` (already bound) from a new thread with its own runtime,
    /// taking the run's records from `records`.
    ///
    /// # Errors
    /// The runtime or the thread cannot be created.
    pub(crate) fn spawn(
        listener: std::net::TcpListener,
        access: Access,
        live: LiveRun,
        records: mpsc::Receiver<Line>,
    ) -> Result<Self, DashboardError> {
        listener.set_nonblocking(true).map_err(DashboardError::Start)?;
        let loopback = listener.local_addr().map_err(DashboardError::Start)?.ip().is_loopback();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("fdl-dashboard")
            .build()
            .map_err(DashboardError::Start)?;
        let (stop, stopped) = oneshot::channel();
        let (finished_tx, finished) = std::sync::mpsc::sync_channel(1);
        let first = Arc::new(Snapshot::of(&live, 0));
        let (publish, snapshots) = watch::channel(first);
        let app = App {
            snapshots,
            access: Arc::new(access),
            loopback,
            name: live.meta().name.as_str().into(),
        };
        let thread = std::thread::Builder::new()
            .name("fdl-dashboard".into())
            .spawn(move || {
                runtime.block_on(serve(listener, app, live, records, stopped, publish));
                runtime.shutdown_timeout(Duration::from_millis(500));
                let _ = finished_tx.send(());
            })
            .map_err(DashboardError::Start)?;
        Ok(Self { stop, finished, thread })
    }

    /// Shows the run as ended, closes the live streams and stops the server (waiting a
    /// bounded time for it).
    pub(crate) fn stop(self, ending: Ending) {
        let _ = self.stop.send(ending);
        match self.finished.recv_timeout(STOP_DEADLINE) {
            Ok(()) => {
                let _ = self.thread.join();
            }
            // Left behind: it ends with the process.
            Err(_) => tracing::warn!("the dashboard server did not stop within {STOP_DEADLINE:?}"),
        }
    }
}

/// The server's life: follow the run, answer requests, and stop once the run has ended and
/// every live stream has closed.
async fn serve(
    listener: std::net::TcpListener,
    app: App,
    live: LiveRun,
    records: mpsc::Receiver<Line>,
    stopped: oneshot::Receiver<Ending>,
    publish: watch::Sender<Arc<Snapshot>>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("dashboard: cannot serve: {e}");
            return;
        }
    };
    // The shutdown signal: the follower is done and has dropped the publisher.
    let mut ended = app.snapshots.clone();
    let closing = app.snapshots.clone();
    tokio::spawn(follow(live, records, stopped, publish));
    let router = Router::new()
        .route("/", get(index))
        .route("/events", get(events))
        .route("/metrics", get(metrics))
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let per_address = flodl_cluster::handshake::AddressSlots::new(MAX_PER_ADDRESS);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            biased;
            () = async { while ended.changed().await.is_ok() {} } => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // E.g. out of file descriptors: wait a little rather than spin.
                    tracing::debug!("dashboard: accepting failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let Some(address_slot) = per_address.take(peer.ip()) else {
            tracing::debug!(%peer, "dashboard: too many connections from its address");
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "dashboard: at its connection cap");
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let mut closing = closing.clone();
        connections.spawn(async move {
            let _slots = (slot, address_slot);
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEAD_DEADLINE);
            let conn = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = async { while closing.changed().await.is_ok() {} } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(STOP_DEADLINE, conn).await;
                }
            }
        });
    }
    // The run has ended: live streams close with the publisher; wait for the connections a
    // bounded time.
    let _ = tokio::time::timeout(STOP_DEADLINE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
}

/// Takes the run's records into `live` and publishes a snapshot after each batch of them (at
/// most every [`MIN_INTERVAL`] or [`PAUSE_PER_RENDER`] render times, and every [`HEARTBEAT`]
/// without records) until the run ends.
async fn follow(
    mut live: LiveRun,
    mut records: mpsc::Receiver<Line>,
    mut stopped: oneshot::Receiver<Ending>,
    publish: watch::Sender<Arc<Snapshot>>,
) {
    let mut seq = 0;
    loop {
        let ending = tokio::select! {
            biased;
            ending = &mut stopped => Some(ending.unwrap_or_else(|_| {
                Ending::Failed("fdl stopped before the run ended".into())
            })),
            record = records.recv() => match record {
                Some(line) => {
                    live.record(line);
                    None
                }
                // Every feed is gone: the run is over without a word.
                None => Some(Ending::Failed("the run stopped reporting".into())),
            },
            () = tokio::time::sleep(HEARTBEAT) => None,
        };
        while let Ok(line) = records.try_recv() {
            live.record(line);
        }
        seq += 1;
        if let Some(ending) = ending {
            live.end(ending);
            publish.send_replace(Arc::new(Snapshot::of(&live, seq)));
            // Dropping the publisher ends every live stream and then the server.
            return;
        }
        let started = std::time::Instant::now();
        publish.send_replace(Arc::new(Snapshot::of(&live, seq)));
        let pause = MIN_INTERVAL.max(started.elapsed() * PAUSE_PER_RENDER);
        tokio::select! {
            biased;
            // Stopping does not wait for the pause.
            ending = &mut stopped => {
                while let Ok(line) = records.try_recv() {
                    live.record(line);
                }
                live.end(ending.unwrap_or_else(|_| {
                    Ending::Failed("fdl stopped before the run ended".into())
                }));
                publish.send_replace(Arc::new(Snapshot::of(&live, seq + 1)));
                return;
            }
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// The `token` query parameter.
#[derive(Debug, Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

/// Refuses requests without the run's token (when it has one) and marks every answer as not
/// to be cached, sniffed, framed or referred (the token travels in the URL).
async fn guard(
    State(app): State<App>,
    Query(query): Query<TokenQuery>,
    request: Request,
    next: Next,
) -> Response {
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok());
    if app.loopback && !host.is_some_and(super::address::names_loopback) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "this dashboard answers to a loopback Host only\n",
        )
            .into_response();
    }
    let mut response = match app.access.admits(query.token.as_deref()) {
        Verdict::Admit => next.run(request).await,
        Verdict::Missing => {
            (StatusCode::UNAUTHORIZED, "this dashboard needs its token: add ?token=...\n")
                .into_response()
        }
        Verdict::Wrong => (StatusCode::FORBIDDEN, "wrong dashboard token\n").into_response(),
    };
    let headers = response.headers_mut();
    let fixed = [
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'",
        ),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// `/`: the page, with the newest snapshot in it.
async fn index(State(app): State<App>) -> Html<String> {
    let snapshot = app.snapshots.borrow().clone();
    Html(page::document(&app.name, snapshot.seq, &snapshot.fragment))
}

/// `/metrics`: the Prometheus text.
async fn metrics(State(app): State<App>) -> impl IntoResponse {
    let snapshot = app.snapshots.borrow().clone();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], snapshot.metrics.clone())
}

/// `/events`: the newest snapshot at once, then each new one, until the run ends.
async fn events(
    State(app): State<App>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + Send + 'static> {
    let stream =
        futures_util::stream::unfold((app.snapshots, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let snapshot = rx.borrow_and_update().clone();
            let event = Event::default().id(snapshot.seq.to_string()).data(&snapshot.event);
            Some((Ok(event), (rx, false)))
        });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

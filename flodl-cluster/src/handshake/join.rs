//! A rank's side of opening a session: connect both lanes to the controller and say hello.

use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::error::NetError;
use crate::identity::ControllerAddr;
use crate::keys::Tls;
use crate::session::{Conn, Lane, Session, SessionConfig, reactor, start};
use crate::wire::{HANDSHAKE_MAX, Hello, LaneHello, Message, codec};

/// The first pause between connection attempts while the controller is not up yet; it doubles up
/// to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A lane in its handshake.
type Joining = Framed<TlsStream<TcpStream>, LengthDelimitedCodec>;

/// Why one attempt to join failed: worth another try (the controller is not listening yet) or not.
enum Failure {
    Retry(NetError),
    Fatal(NetError),
}

/// Joins the controller at `addr` as `hello.rank`, retrying the TCP connection until `wait` has
/// passed (the controller may start after its ranks); each attempt's TCP, TLS and hello must finish
/// within `cfg.handshake`. A refusal comes back as [`NetError::Refused`] with the controller's
/// one-line reason. Call it from a plain thread, not from async code: the session runs on a
/// runtime of its own.
pub fn join(
    addr: &ControllerAddr,
    hello: Hello,
    cfg: SessionConfig,
    wait: Duration,
) -> Result<Session, NetError> {
    cfg.check()?;
    let wants = crate::keys::Role::Rank(hello.rank);
    if cfg.tls.role() != wants {
        return Err(NetError::WrongKey { holds: cfg.tls.role(), wants });
    }
    let reactor = reactor("flodl-session")?;
    let handle =
        reactor.handle().cloned().ok_or_else(|| NetError::Runtime("the runtime is gone".into()))?;
    let lanes = handle.block_on(connect(addr, hello, &cfg, wait))?;
    let session = start(&handle, hello.rank, lanes, cfg.caps, cfg.liveness(), None);
    session.keep(reactor);
    Ok(session)
}

/// Attempts until one succeeds, one fails for good, or `wait` is over.
async fn connect(
    addr: &ControllerAddr,
    hello: Hello,
    cfg: &SessionConfig,
    wait: Duration,
) -> Result<[Conn<TlsStream<TcpStream>>; 2], NetError> {
    let deadline = Instant::now() + wait;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let attempt_deadline = deadline.min(Instant::now() + cfg.handshake);
        let error = match tokio::time::timeout_at(attempt_deadline, attempt(addr, hello, cfg)).await
        {
            Ok(Ok(lanes)) => return Ok(lanes),
            Ok(Err(Failure::Fatal(e))) => return Err(e),
            Ok(Err(Failure::Retry(e))) => e,
            Err(_) => {
                NetError::Handshake(format!("no answer from {addr} within {:?}", cfg.handshake))
            }
        };
        if Instant::now() + backoff >= deadline {
            return Err(error);
        }
        tracing::debug!("joining {addr}: {error}; trying again in {backoff:?}");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One attempt: both TCP connections (retryable), then TLS and hello on both (final).
async fn attempt(
    addr: &ControllerAddr,
    hello: Hello,
    cfg: &SessionConfig,
) -> Result<[Conn<TlsStream<TcpStream>>; 2], Failure> {
    let targets: Vec<SocketAddr> = tokio::net::lookup_host((addr.host.as_str(), addr.port))
        .await
        .map_err(|e| {
            Failure::Retry(NetError::Resolve { addr: addr.to_string(), reason: e.to_string() })
        })?
        .collect();
    let control = TcpStream::connect(&targets[..]).await.map_err(|e| Failure::Retry(e.into()))?;
    let bulk = TcpStream::connect(&targets[..]).await.map_err(|e| Failure::Retry(e.into()))?;
    let token = join_token();
    let connector = TlsConnector::from(cfg.tls.client.clone());
    let name = Tls::server_name(cfg.serving).ok_or_else(|| {
        Failure::Fatal(NetError::Config(format!("{} serves no controller", cfg.serving)))
    })?;
    let mut lanes = Vec::with_capacity(2);
    for (lane, tcp) in [(Lane::Control, control), (Lane::Bulk, bulk)] {
        let _ = tcp.set_nodelay(true);
        let stream = connector
            .connect(name.clone(), tcp)
            .await
            .map_err(|e| Failure::Fatal(NetError::Handshake(format!("TLS: {e}"))))?;
        let mut framed = Framed::new(stream, codec(HANDSHAKE_MAX));
        let message = Message::Hello(LaneHello { hello, app: cfg.app, lane, token }).encode();
        framed.send(message).await.map_err(|e| Failure::Fatal(handshake_error(e)))?;
        lanes.push(framed);
    }
    let mut conns = Vec::with_capacity(2);
    for framed in lanes {
        conns.push(reply(framed).await.map_err(Failure::Fatal)?);
    }
    match <[Conn<TlsStream<TcpStream>>; 2]>::try_from(conns) {
        Ok(pair) => Ok(pair),
        Err(_) => Err(Failure::Fatal(NetError::Handshake("a lane went missing".into()))),
    }
}

/// Waits for the controller's welcome or refusal on one lane.
async fn reply(mut framed: Joining) -> Result<Conn<TlsStream<TcpStream>>, NetError> {
    let message = match framed.next().await {
        None => {
            return Err(NetError::Handshake(
                "the controller closed the connection during the handshake".into(),
            ));
        }
        Some(Err(e)) => return Err(handshake_error(e)),
        Some(Ok(bytes)) => {
            Message::decode(bytes).map_err(|e| NetError::Handshake(e.to_string()))?
        }
    };
    match message {
        Message::Welcome => {
            let parts = framed.into_parts();
            Ok(Conn { stream: parts.io, leftover: parts.read_buf })
        }
        Message::Refused(reason) => Err(match super::refusal::taken_rank(&reason) {
            Some(rank) => NetError::RankTaken { rank, reason },
            None => NetError::Refused { reason },
        }),
        other => Err(NetError::Handshake(format!("an unexpected reply: {other:?}"))),
    }
}

/// An I/O error during the handshake: usually TLS alerts (a certificate the controller rejects).
fn handshake_error(e: std::io::Error) -> NetError {
    NetError::Handshake(e.to_string())
}

/// A number that pairs this join's two lanes at the controller (unique enough; not a secret: both
/// lanes are already authenticated by the rank's own certificate).
fn join_token() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    hasher.write_u128(now.as_nanos());
    hasher.finish()
}

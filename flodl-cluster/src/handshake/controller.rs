//! The controller's listening side: it admits ranks, two lanes each, and hands out their sessions.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;

use super::dropped::Dropped;
use super::refusal::{Refusal, View};
use super::registry::{Offer, Registry};
use super::slots::{AddressSlot, AddressSlots};
use crate::error::NetError;
use crate::keys::Role;
use crate::session::{Conn, Reactor, Session, SessionConfig, reactor, start};
use crate::wire::{HANDSHAKE_MAX, Message, PROTOCOL, WireError, codec};

/// A connection in its handshake.
type Handshaking = Framed<TlsStream<TcpStream>, LengthDelimitedCodec>;

/// Handshakes in progress at once; further connections wait in the listen backlog until one
/// finishes (each is bounded by the handshake deadline). Each source address may hold only a few
/// of them ([`AddressSlots::limit_for`]) and its connections beyond that are closed at once, so a
/// flood from elsewhere cannot keep an honest rank's address out.
const MAX_HANDSHAKES: usize = 256;

/// The server side of a job's control plane: it listens, admits each rank's two lanes (mutual TLS,
/// then a hello that must match this run) and hands out one [`Session`] per rank.
pub struct Controller {
    accepted: flume::Receiver<Session>,
    local_addr: SocketAddr,
    cancel: CancellationToken,
    reactor: Arc<Reactor>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller").field("local_addr", &self.local_addr).finish_non_exhaustive()
    }
}

/// What every admission task shares.
struct Admission {
    run: [u8; 32],
    world: usize,
    cfg: SessionConfig,
    acceptor: TlsAcceptor,
    registry: Arc<Registry<Handshaking>>,
    accepted: flume::Sender<Session>,
    handle: tokio::runtime::Handle,
}

/// Where one connection's handshake got to.
enum Step {
    /// Refused (the reason is logged and, where TLS is up, written back).
    Refused,
    /// The first lane of a join, held for the other.
    Held { rank: usize, token: u64 },
    /// Both lanes of a join.
    Complete { rank: usize, token: u64, lanes: Box<[Handshaking; 2]> },
}

impl Controller {
    /// Listens on `addr` for the `world` ranks of the run whose specification hashes to `run`.
    pub fn bind(
        addr: SocketAddr,
        run: [u8; 32],
        world: usize,
        cfg: SessionConfig,
    ) -> Result<Controller, NetError> {
        Controller::check(&cfg, world)?;
        Controller::serve(std::net::TcpListener::bind(addr)?, run, world, cfg)
    }

    /// Admits on `std_listener`, a socket already bound and listening (e.g. one a launcher bound
    /// and handed down, so nobody can take the port between its choice and its use), the `world`
    /// ranks of the run whose specification hashes to `run`.
    pub fn serve(
        std_listener: std::net::TcpListener,
        run: [u8; 32],
        world: usize,
        cfg: SessionConfig,
    ) -> Result<Controller, NetError> {
        Controller::check(&cfg, world)?;
        let reactor = reactor("flodl-controller")?;
        let handle = reactor
            .handle()
            .cloned()
            .ok_or_else(|| NetError::Runtime("the runtime is gone".into()))?;
        std_listener.set_nonblocking(true)?;
        let local_addr = std_listener.local_addr()?;
        let listener = {
            let _guard = handle.enter();
            TcpListener::from_std(std_listener)?
        };
        let (accepted_tx, accepted) = flume::bounded(world.saturating_mul(2));
        let admission = Arc::new(Admission {
            run,
            world,
            acceptor: TlsAcceptor::from(cfg.tls.server.clone()),
            cfg,
            registry: Arc::new(Registry::new()),
            accepted: accepted_tx,
            handle: handle.clone(),
        });
        let cancel = CancellationToken::new();
        let per_address = AddressSlots::new(AddressSlots::limit_for(world));
        handle.spawn(listen(listener, admission, per_address, cancel.clone()));
        tracing::info!(%local_addr, world, "controller listening");
        Ok(Controller { accepted, local_addr, cancel, reactor })
    }

    /// A configuration and world a controller can serve: the controller's own certificate, at
    /// least one rank.
    fn check(cfg: &SessionConfig, world: usize) -> Result<(), NetError> {
        cfg.check()?;
        if world == 0 {
            return Err(NetError::Config("a world of zero ranks".into()));
        }
        if !cfg.tls.role().serves() {
            return Err(NetError::WrongKey { holds: cfg.tls.role(), wants: Role::Controller });
        }
        Ok(())
    }

    /// The address it listens on (with the port the system chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The next rank whose two lanes are both up and whose hello matched, waiting up to `wait`.
    /// Connections that misbehave (no certificate or one from elsewhere, garbage, an oversize
    /// length, bytes too slow for the handshake deadline, another protocol, run or world, a rank
    /// out of range or already connected) are dropped with a warning in the log, and sent a
    /// one-line refusal where TLS is up; other sessions are not disturbed.
    pub fn accept(&self, wait: Duration) -> Result<Session, NetError> {
        match self.accepted.recv_timeout(wait) {
            Ok(session) => {
                session.keep(self.reactor.clone());
                Ok(session)
            }
            Err(flume::RecvTimeoutError::Timeout) => Err(NetError::Timeout(wait)),
            Err(flume::RecvTimeoutError::Disconnected) => Err(NetError::Gone),
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        // Stops listening and admitting; accepted sessions keep running on their share of the
        // runtime until they are dropped.
        self.cancel.cancel();
    }
}

/// Accepts connections and admits each in its own task, a bounded number at once.
async fn listen(
    listener: TcpListener,
    admission: Arc<Admission>,
    per_address: Arc<AddressSlots>,
    cancel: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let permit = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // E.g. out of file descriptors: wait a little rather than spin.
                tracing::warn!("accepting a connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(address_slot) = per_address.take(peer.ip()) else {
            tracing::warn!(%peer, "connection dropped: too many handshakes under way from its address");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (admission, cancel) = (admission.clone(), cancel.clone());
        tokio::spawn(async move {
            let slots = (permit, address_slot);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {}
                _ = admit(tcp, peer, &admission, slots) => {}
            }
        });
    }
}

/// Runs one connection's handshake under the deadline (holding one of the handshake slots) and
/// acts on where it got to.
async fn admit(
    tcp: TcpStream,
    peer: SocketAddr,
    admission: &Admission,
    slot: (OwnedSemaphorePermit, AddressSlot),
) {
    let limit = admission.cfg.handshake;
    let deadline = Instant::now() + limit;
    let step = tokio::time::timeout_at(deadline, handshake(tcp, peer, admission)).await;
    drop(slot);
    let step = match step {
        Err(_) => {
            tracing::warn!(%peer, "connection dropped: no TLS handshake and hello within {limit:?}");
            return;
        }
        Ok(Err(reason)) => {
            tracing::warn!(%peer, "connection dropped: {reason}");
            return;
        }
        Ok(Ok(step)) => step,
    };
    match step {
        Step::Refused => {}
        Step::Held { rank, token } => {
            tokio::time::sleep_until(deadline).await;
            if admission.registry.expire(rank, token) {
                tracing::warn!(%peer, rank, "join dropped: its second lane did not arrive within {limit:?}");
            }
        }
        Step::Complete { rank, token, mut lanes } => {
            let welcomed = tokio::time::timeout_at(deadline, async {
                for lane in lanes.iter_mut() {
                    lane.send(Message::Welcome.encode()).await?;
                }
                Ok::<(), std::io::Error>(())
            })
            .await;
            if let Err(reason) = welcomed
                .map_err(|_| "timed out".to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
            {
                tracing::warn!(%peer, rank, "join dropped while welcoming it: {reason}");
                admission.registry.release(rank, token);
                return;
            }
            let conns = (*lanes).map(|framed| {
                let parts = framed.into_parts();
                Conn { stream: parts.io, leftover: parts.read_buf }
            });
            let registry = admission.registry.clone();
            let on_end = Box::new(move || registry.release(rank, token));
            let cfg = &admission.cfg;
            let session =
                start(&admission.handle, rank, conns, cfg.caps, cfg.liveness(), Some(on_end));
            tracing::info!(%peer, rank, "rank joined");
            if admission.accepted.send_async(session).await.is_err() {
                tracing::warn!(rank, "join dropped: the controller is closing");
            }
        }
    }
}

/// TLS, then the hello: refused, held or complete; [`Dropped`] for a connection dropped without
/// a refusal (it never got TLS up or sent no readable hello).
async fn handshake(
    tcp: TcpStream,
    peer: SocketAddr,
    admission: &Admission,
) -> Result<Step, Dropped> {
    let tls = admission.acceptor.accept(tcp).await.map_err(Dropped::Tls)?;
    let certified =
        tls.get_ref().1.peer_certificates().and_then(|chain| chain.first()).map(Role::of);
    let mut framed = Framed::new(tls, codec(HANDSHAKE_MAX));
    let first = match framed.next().await {
        None => return Err(Dropped::Closed),
        Some(Err(e)) => return Err(Dropped::Read(e)),
        Some(Ok(first)) => first,
    };
    let hello = match Message::decode(first) {
        Ok(Message::Hello(hello)) => hello,
        Err(WireError::Protocol(joiner)) => {
            let refusal = Refusal::Protocol { joiner, controller: PROTOCOL };
            refuse(framed, peer, None, refusal).await;
            return Ok(Step::Refused);
        }
        _ => {
            refuse(framed, peer, None, Refusal::NotHello).await;
            return Ok(Step::Refused);
        }
    };
    let rank = hello.hello.rank;
    let ours = (PROTOCOL, admission.cfg.app);
    if let Some(refusal) = Refusal::check(&hello, ours, &admission.run, admission.world) {
        refuse(framed, peer, Some(rank), refusal).await;
        return Ok(Step::Refused);
    }
    // The rank is the certificate's, not the hello's: a member holding one rank's key can take
    // that rank's seat and no other.
    match certified {
        Some(Ok(Role::Rank(certified))) if certified == rank => {}
        other => {
            let certified = match other {
                Some(Ok(role)) => role.to_string(),
                Some(Err(e)) => format!("unusable ({e})"),
                None => "missing".to_owned(),
            };
            refuse(framed, peer, Some(rank), Refusal::Seat { claimed: rank, certified }).await;
            return Ok(Step::Refused);
        }
    }
    Ok(match admission.registry.offer(&hello, framed) {
        Offer::Refused(refusal, framed) => {
            refuse(framed, peer, Some(rank), refusal).await;
            Step::Refused
        }
        Offer::Held => Step::Held { rank, token: hello.token },
        Offer::Complete(lanes) => {
            Step::Complete { rank, token: hello.token, lanes: Box::new(lanes) }
        }
    })
}

/// Logs a refusal from the controller's view and writes it, from the joiner's, on the connection.
async fn refuse(mut framed: Handshaking, peer: SocketAddr, rank: Option<usize>, refusal: Refusal) {
    tracing::warn!(%peer, rank, "join refused: {}", refusal.line(View::Controller));
    let _ = framed.send(Message::Refused(refusal.line(View::Joiner)).encode()).await;
    let _ = SinkExt::<bytes::Bytes>::close(&mut framed).await;
}

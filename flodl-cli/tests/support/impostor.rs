//! A job member's key used by hand, past the checks `fdl` makes of its own key: a TLS server
//! presenting a rank's certificate (a controller the ranks must refuse), and a TLS client
//! saying a hello for a seat its certificate is not for (a claim the controller must refuse).
//! rustls as the job uses it: nothing here that a holder of the key could not do.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flodl_cluster::wire::{LaneHello, Message};
use flodl_cluster::{Hello, Lane};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::launched::Result;

/// The rustls provider the job uses.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate chain and key of `seat` (`controller`, `rank-R`) in `keys`.
fn identity(
    keys: &Path,
    seat: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let chain = CertificateDer::pem_file_iter(keys.join(format!("{seat}.pem")))?
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((chain, PrivateKeyDer::from_pem_file(keys.join(format!("{seat}.key")))?))
}

/// A controller served on `listener` with `seat`'s key, until dropped: it completes the TLS
/// handshake with whoever accepts its certificate and reads what they send.
pub(crate) struct FakeController {
    stop: Arc<AtomicBool>,
    /// Connections that came, and those whose TLS handshake completed.
    pub(crate) came: Arc<AtomicUsize>,
    pub(crate) completed: Arc<AtomicUsize>,
    /// Application bytes received after a completed handshake (a hello would be some).
    pub(crate) read: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl FakeController {
    /// Serves on `listener` presenting `seat`'s certificate from `keys`, asking clients for
    /// none (the most a fake can offer: it takes anyone).
    pub(crate) fn serve(listener: TcpListener, keys: &Path, seat: &str) -> Result<FakeController> {
        let (chain, key) = identity(keys, seat)?;
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_single_cert(chain, key)?,
        );
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let came = Arc::new(AtomicUsize::new(0));
        let completed = Arc::new(AtomicUsize::new(0));
        let read = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, came, completed, read) =
                (stop.clone(), came.clone(), completed.clone(), read.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let Ok((mut tcp, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    came.fetch_add(1, Ordering::AcqRel);
                    let _ = tcp.set_nonblocking(false);
                    let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
                    let Ok(mut conn) = rustls::ServerConnection::new(config.clone()) else {
                        continue;
                    };
                    let mut failed = false;
                    while conn.is_handshaking() && !failed {
                        failed = conn.complete_io(&mut tcp).is_err();
                    }
                    if failed {
                        continue;
                    }
                    completed.fetch_add(1, Ordering::AcqRel);
                    let mut buf = [0u8; 4096];
                    let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
                    while let Ok(n @ 1..) = stream.read(&mut buf) {
                        read.fetch_add(n, Ordering::AcqRel);
                    }
                }
            })
        };
        Ok(FakeController { stop, came, completed, read, thread: Some(thread) })
    }

    /// Waits up to `wait` for `n` connections to have come.
    pub(crate) fn wait_for(&self, n: usize, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        while self.came.load(Ordering::Acquire) < n {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}

impl Drop for FakeController {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Says `hello` on a control lane to the controller at `port`, over TLS as the job's ranks
/// open it (the controller's name verified against the job's CA) but presenting `seat`'s
/// certificate: the controller's answer as text (its refusal line is readable in it), `TLS
/// failed: ...` when the connection broke first, or `held open` when the controller kept the
/// lane waiting (as it keeps an admitted rank's first lane).
pub(crate) fn claim(keys: &Path, port: u16, seat: &str, hello: Hello) -> Result<String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(keys.join("ca.pem"))? {
        roots.add(cert?)?;
    }
    let (chain, key) = identity(keys, seat)?;
    let config = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?,
    );
    let name = ServerName::try_from(flodl_cluster::keys::JOB_SERVER_NAME)?;
    let mut conn = rustls::ClientConnection::new(config, name)?;
    let mut tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
    let app = flodl_ddp::WIRE_VERSION;
    let body = Message::Hello(LaneHello { hello, app, lane: Lane::Control, token: 11 }).encode();
    let mut framed = (body.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(&body);
    if let Err(e) = stream.write_all(&framed).and_then(|()| stream.flush()) {
        return Ok(format!("TLS failed: {e}"));
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok("held open".to_owned());
            }
            Err(e) if answer.is_empty() => return Ok(format!("TLS failed: {e}")),
            Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// The run-specification hash the job of `job` (with `extra`) agrees on, as any of its members
/// computes it (`fdl train --dry-run` in rank `rank`'s environment): what a hello must carry.
pub(crate) fn run_hash(keys: &Path, port: u16, rank: usize, job: &[&str]) -> Result<[u8; 32]> {
    let mut command = std::process::Command::new(super::launched::FDL);
    let seat = format!("rank-{rank}");
    let out = super::launched::cluster_env(&mut command, keys, port, rank, &seat)
        .args(["train", "--dry-run"])
        .args(job)
        .output()?;
    if !out.status.success() {
        return Err(format!("dry run: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let all: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let hex = all["spec_hash"].as_str().ok_or("no spec_hash")?;
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or("short hash")?, 16)?;
    }
    Ok(hash)
}

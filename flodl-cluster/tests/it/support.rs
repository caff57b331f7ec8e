//! What the tests share: a job's keys, short timings, a controller with joined ranks.

use std::error::Error;
use std::net::SocketAddr;
use std::path::Path;
use std::thread;
use std::time::Duration;

use flodl_cluster::{
    Caps, Controller, ControllerAddr, Hello, JobKeys, Role, Session, SessionConfig, Tls, TlsFiles,
    join,
};

pub(crate) type TestResult = Result<(), Box<dyn Error>>;

/// A run-specification hash for tests.
pub(crate) const RUN: [u8; 32] = [7; 32];
/// Caps small enough to test, large enough for the order tests' bulk frames.
pub(crate) const CAPS: Caps = Caps { control: 64 * 1024, bulk: 8 * 1024 * 1024 };
/// The longest any single wait in a test may take.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// The ranks the tests' keys are made for.
pub(crate) const KEYS_WORLD: usize = 4;

/// A fresh job's keys in a private directory made under `dir`: the controller's and
/// [`KEYS_WORLD`] ranks'.
pub(crate) fn keys(dir: &Path) -> Result<JobKeys, Box<dyn Error>> {
    Ok(JobKeys::generate(
        &dir.join("keys"),
        KEYS_WORLD,
        &["localhost".to_string(), "127.0.0.1".to_string()],
        false,
    )?)
}

/// A job's session settings: the controller's (what it derefs to; tests change its timings) and,
/// with the same timings, each rank's with its own certificate.
#[derive(Clone)]
pub(crate) struct JobConfig {
    controller: SessionConfig,
    keys: JobKeys,
}

impl JobConfig {
    /// Rank `rank`'s settings: the controller's timings and caps, the rank's own certificate.
    pub(crate) fn rank(&self, rank: usize) -> Result<SessionConfig, Box<dyn Error>> {
        Ok(SessionConfig { tls: Tls::load(&self.keys.rank(rank))?, ..self.controller.clone() })
    }
}

impl std::ops::Deref for JobConfig {
    type Target = SessionConfig;
    fn deref(&self) -> &SessionConfig {
        &self.controller
    }
}

impl std::ops::DerefMut for JobConfig {
    fn deref_mut(&mut self) -> &mut SessionConfig {
        &mut self.controller
    }
}

/// Short timings, so liveness tests finish quickly.
pub(crate) fn config(keys: &JobKeys) -> Result<JobConfig, Box<dyn Error>> {
    Ok(JobConfig {
        controller: SessionConfig {
            tls: Tls::load(&keys.controller())?,
            caps: CAPS,
            heartbeat: Duration::from_millis(100),
            silence: Duration::from_millis(800),
            handshake: Duration::from_secs(2),
            serving: Role::Controller,
            app: 0,
        },
        keys: keys.clone(),
    })
}

/// A controller on an ephemeral loopback port.
pub(crate) fn controller(cfg: &SessionConfig, world: usize) -> Result<Controller, Box<dyn Error>> {
    Ok(Controller::bind("127.0.0.1:0".parse()?, RUN, world, cfg.clone())?)
}

/// The address a joiner dials for `addr`.
pub(crate) fn target(addr: SocketAddr) -> ControllerAddr {
    ControllerAddr { host: addr.ip().to_string(), port: addr.port() }
}

/// Joins `rank` from a thread while the controller accepts it: (controller side, rank side).
pub(crate) fn joined(
    controller: &Controller,
    cfg: &JobConfig,
    rank: usize,
    world: usize,
) -> Result<(Session, Session), Box<dyn Error>> {
    let addr = target(controller.local_addr());
    let cfg = cfg.rank(rank)?;
    let joiner = thread::spawn(move || join(&addr, Hello::new(RUN, rank, world), cfg, WAIT));
    let accepted = controller.accept(WAIT)?;
    let rank_side = joiner.join().map_err(|_| "the joining thread panicked")??;
    Ok((accepted, rank_side))
}

/// Everything the crate logged, from every thread (a global subscriber, installed once).
pub(crate) fn log() -> &'static std::sync::Mutex<Vec<u8>> {
    static LOG: std::sync::OnceLock<std::sync::Mutex<Vec<u8>>> = std::sync::OnceLock::new();
    static INSTALL: std::sync::Once = std::sync::Once::new();
    let log = LOG.get_or_init(|| std::sync::Mutex::new(Vec::new()));
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("flodl_cluster=debug")
            .with_ansi(false)
            .with_writer(|| LogWriter)
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
    log
}

/// Appends to [`log`].
struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        log().lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Waits up to `limit` for a logged line containing every one of `parts`.
pub(crate) fn logged(parts: &[&str], limit: Duration) -> bool {
    let start = std::time::Instant::now();
    loop {
        let text =
            String::from_utf8_lossy(&log().lock().unwrap_or_else(|p| p.into_inner())).into_owned();
        if text.lines().any(|line| parts.iter().all(|p| line.contains(p))) {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// The job CA as a root store, for hand-made TLS clients.
pub(crate) fn roots(files: &TlsFiles) -> Result<rustls::RootCertStore, Box<dyn Error>> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&files.ca)? {
        roots.add(cert?)?;
    }
    Ok(roots)
}

/// A hand-made TLS client that trusts `trust`'s CA and presents `present`'s certificate (or none).
pub(crate) fn client_config(
    trust: &TlsFiles,
    present: Option<&TlsFiles>,
) -> Result<std::sync::Arc<rustls::ClientConfig>, Box<dyn Error>> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots(trust)?);
    let config = match present {
        None => builder.with_no_client_auth(),
        Some(files) => {
            let chain =
                CertificateDer::pem_file_iter(&files.cert)?.collect::<Result<Vec<_>, _>>()?;
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(&files.key)?)?
        }
    };
    Ok(std::sync::Arc::new(config))
}

/// A TLS connection to the controller as a job member would open it.
pub(crate) async fn tls_connect(
    addr: SocketAddr,
    config: std::sync::Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = rustls_pki_types::ServerName::try_from(flodl_cluster::keys::JOB_SERVER_NAME)
        .map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(config).connect(name, tcp).await.map_err(|e| e.to_string())
}

/// Reads until the peer closes (EOF or error) or `limit` passes: the bytes read, and whether it
/// closed in time.
pub(crate) async fn until_closed<S: tokio::io::AsyncRead + Unpin>(
    mut stream: S,
    limit: Duration,
) -> (Vec<u8>, bool) {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return (seen, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (seen, true),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// A lane's hello as framed on the wire.
pub(crate) fn hello_bytes(hello: Hello, lane: flodl_cluster::Lane, token: u64) -> Vec<u8> {
    use flodl_cluster::wire::{LaneHello, Message};
    let body = Message::Hello(LaneHello { hello, app: 0, lane, token }).encode();
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

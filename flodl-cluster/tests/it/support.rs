//! What the tests share: a job's keys, short timings, a controller with joined ranks.

use std::error::Error;
use std::net::SocketAddr;
use std::path::Path;
use std::thread;
use std::time::Duration;

use flodl_cluster::{
    Caps, Controller, ControllerAddr, Hello, JobKeys, Session, SessionConfig, Tls, TlsFiles, join,
};

pub(crate) type TestResult = Result<(), Box<dyn Error>>;

/// A run-specification hash for tests.
pub(crate) const RUN: [u8; 32] = [7; 32];
/// Caps small enough to test, large enough for the order tests' bulk frames.
pub(crate) const CAPS: Caps = Caps { control: 64 * 1024, bulk: 8 * 1024 * 1024 };
/// The longest any single wait in a test may take.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// A fresh job's key files in `dir`.
pub(crate) fn keys(dir: &Path) -> Result<TlsFiles, Box<dyn Error>> {
    Ok(JobKeys::generate(dir, &["localhost".to_string(), "127.0.0.1".to_string()])?)
}

/// Short timings, so liveness tests finish quickly.
pub(crate) fn config(files: &TlsFiles) -> Result<SessionConfig, Box<dyn Error>> {
    Ok(SessionConfig {
        tls: Tls::load(files)?,
        caps: CAPS,
        heartbeat: Duration::from_millis(100),
        silence: Duration::from_millis(800),
        handshake: Duration::from_secs(2),
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
    cfg: &SessionConfig,
    rank: usize,
    world: usize,
) -> Result<(Session, Session), Box<dyn Error>> {
    let addr = target(controller.local_addr());
    let cfg = cfg.clone();
    let joiner = thread::spawn(move || join(&addr, Hello::new(RUN, rank, world), cfg, WAIT));
    let accepted = controller.accept(WAIT)?;
    let rank_side = joiner.join().map_err(|_| "the joining thread panicked")??;
    Ok((accepted, rank_side))
}

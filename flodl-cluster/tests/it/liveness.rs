//! Liveness: an idle session stays up on heartbeats; a stalled, dropped or killed peer is Gone
//! within the silence (or at once).

use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use flodl_cluster::{Caps, Identity, Lane, NetError, SessionConfig, Tls, TlsFiles, join};
use tokio::io::AsyncWriteExt;

use crate::support::{
    RUN, TestResult, WAIT, client_config, config, controller, hello_bytes, joined, keys,
    tls_connect,
};

#[test]
fn an_idle_session_stays_up_for_several_silences() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(&keys(dir.path())?)?;
    let server = controller(&cfg, 1)?;
    let (at_controller, at_rank) = joined(&server, &cfg, 0, 1)?;
    // Nothing but heartbeats for three silences.
    match at_controller.recv(cfg.silence * 3) {
        Err(NetError::Timeout(_)) => {}
        other => return Err(format!("an idle session gave {other:?}").into()),
    }
    at_rank.send(Lane::Control, b"still here".to_vec(), WAIT)?;
    at_controller.send(Lane::Bulk, b"so am I".to_vec(), WAIT)?;
    if at_controller.recv(WAIT)? != b"still here" || at_rank.recv(WAIT)? != b"so am I" {
        return Err("frames after the idle time were garbled".into());
    }
    Ok(())
}

#[test]
fn a_peer_that_stalls_after_joining_is_gone_within_the_silence() -> TestResult {
    let dir = tempfile::tempdir()?;
    let files = keys(dir.path())?;
    let cfg = config(&files)?;
    let server = controller(&cfg, 1)?;
    let addr = server.local_addr();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // A joiner that says hello on both lanes, reads its welcomes, then neither reads nor writes.
    let _stalled = runtime.block_on(async {
        let mut lanes = Vec::new();
        for lane in Lane::BOTH {
            let mut tls = tls_connect(
                addr,
                client_config(&files.rank(0), Some(&files.rank(0))).map_err(|e| e.to_string())?,
            )
            .await?;
            tls.write_all(&hello_bytes(flodl_cluster::Hello::new(RUN, 0, 1), lane, 99))
                .await
                .map_err(|e| e.to_string())?;
            tls.flush().await.map_err(|e| e.to_string())?;
            lanes.push(tls);
        }
        Ok::<_, String>(lanes)
    })?;
    let session = server.accept(WAIT)?;
    let start = Instant::now();
    match session.recv(WAIT) {
        Err(NetError::Gone) => {}
        other => return Err(format!("a stalled peer gave {other:?}").into()),
    }
    let took = start.elapsed();
    if took < cfg.silence / 2 || took > cfg.silence + Duration::from_secs(1) {
        return Err(format!("Gone after {took:?}, silence {:?}", cfg.silence).into());
    }
    Ok(())
}

#[test]
fn a_dropped_peer_is_gone_promptly() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(&keys(dir.path())?)?;
    let server = controller(&cfg, 2)?;
    for side in ["rank", "controller"] {
        let rank = usize::from(side == "controller");
        let (at_controller, at_rank) = joined(&server, &cfg, rank, 2)?;
        let (dropped, survivor) =
            if side == "rank" { (at_rank, at_controller) } else { (at_controller, at_rank) };
        dropped.send(Lane::Bulk, b"last words".to_vec(), WAIT)?;
        drop(dropped);
        let start = Instant::now();
        if survivor.recv(WAIT)? != b"last words" {
            return Err(format!("{side}: the frame sent before dropping was lost").into());
        }
        match survivor.recv(WAIT) {
            Err(NetError::Gone) => {}
            other => return Err(format!("{side}: expected Gone, got {other:?}").into()),
        }
        if start.elapsed() > cfg.silence / 2 {
            return Err(format!("{side}: Gone only after {:?}", start.elapsed()).into());
        }
        match survivor.send(Lane::Control, vec![1], WAIT) {
            Err(NetError::Gone) => {}
            other => return Err(format!("{side}: sending after the end gave {other:?}").into()),
        }
    }
    Ok(())
}

/// Kills the child process when dropped (by its pid, through `Child::kill`).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The variable that marks the child run of [`child_rank_process`].
const CHILD: &str = "FLODL_CLUSTER_TEST_CHILD";

#[test]
fn a_killed_rank_process_is_gone_promptly() -> TestResult {
    let dir = tempfile::tempdir()?;
    let files = keys(dir.path())?;
    let cfg = config(&files)?;
    let server = controller(&cfg, 1)?;
    let mut command = Command::new(std::env::current_exe()?);
    command.args(["--exact", "liveness::child_rank_process", "--test-threads=1"]);
    command
        .env(CHILD, "1")
        .env("FLODL_RANK", "0")
        .env("FLODL_WORLD_SIZE", "1")
        .env("FLODL_LOCAL_RANK", "0");
    command.env("FLODL_CONTROLLER_ADDR", server.local_addr().to_string());
    for (var, path) in files.rank(0).vars() {
        command.env(var, path);
    }
    command.stdout(std::process::Stdio::null());
    let mut child = Killed(command.spawn()?);
    let session = server.accept(WAIT)?;
    if session.recv(WAIT)? != b"alive" {
        return Err("the child's first frame was garbled".into());
    }
    child.0.kill()?;
    let start = Instant::now();
    match session.recv(WAIT) {
        Err(NetError::Gone) => {}
        other => return Err(format!("after the kill: {other:?}").into()),
    }
    if start.elapsed() > Duration::from_secs(1) {
        return Err(format!("Gone only {:?} after the kill", start.elapsed()).into());
    }
    Ok(())
}

/// The rank process of [`a_killed_rank_process_is_gone_promptly`]: it joins from its environment,
/// says it is alive and waits to be killed. In the ordinary test run (no child variable) it
/// skips at run time, saying why; its check runs in the parent test.
#[test]
fn child_rank_process() -> TestResult {
    if std::env::var_os(CHILD).is_none() {
        println!(
            "skipped: the child process of a_killed_rank_process_is_gone_promptly ({CHILD} unset); \
             that test runs it"
        );
        return Ok(());
    }
    let identity = Identity::from_env()?.ok_or("no identity in the environment")?;
    let files = TlsFiles::from_env().ok_or("no TLS files in the environment")?;
    let cfg = SessionConfig::new(Tls::load(&files)?, Caps { control: 1024, bulk: 1024 });
    let hello = flodl_cluster::Hello::new(RUN, identity.rank, identity.world);
    let session = join(&identity.controller, hello, cfg, WAIT)?;
    session.send(Lane::Control, b"alive".to_vec(), WAIT)?;
    // Bounded: the parent kills this process long before.
    thread::sleep(Duration::from_secs(30));
    Err("the parent never killed this process".into())
}

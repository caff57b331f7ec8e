//! Keys, TLS and the handshake's defences: connections that are not members of the job, or that
//! misbehave, are dropped; a healthy session running at the same time does not notice.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use flodl_cluster::{Hello, JobKeys, Lane, NetError, TlsFiles, join};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::{
    RUN, TestResult, WAIT, client_config, config, controller, hello_bytes, joined, keys, log,
    logged, target, tls_connect, until_closed,
};

/// The frame the controller answers a lane with when it lets it in.
const WELCOME: [u8; 5] = [0, 0, 0, 1, 2];

/// One misbehaving connection.
#[derive(Debug, Clone, Copy)]
enum Intruder {
    NoCertificate,
    ForeignCertificate,
    RandomBytes,
    HugePrefixRaw,
    HugePrefixInTls,
    NotAHello,
    OneByteASecond,
}

/// What the controller must do with it.
#[derive(Debug, PartialEq)]
enum Expect {
    /// Close the connection without a welcome.
    Dropped,
    /// Close it after a refusal line containing this text.
    Refused(&'static str),
}

async fn intrude(
    intruder: Intruder,
    addr: SocketAddr,
    job: &TlsFiles,
    other: &TlsFiles,
    limit: Duration,
) -> Result<(Vec<u8>, bool), String> {
    let fail = |e: Box<dyn std::error::Error>| format!("{intruder:?}: {e}");
    let hello = hello_bytes(Hello::new(RUN, 1, 2), Lane::Control, 1);
    Ok(match intruder {
        Intruder::NoCertificate | Intruder::ForeignCertificate => {
            let present = matches!(intruder, Intruder::ForeignCertificate).then_some(other);
            let config = client_config(job, present).map_err(fail)?;
            // TLS 1.3 lets the client finish before the server has checked it: the refusal shows
            // as an alert or a close on the first read.
            match tls_connect(addr, config).await {
                Err(_) => (Vec::new(), true),
                Ok(mut tls) => {
                    let _ = tls.write_all(&hello).await;
                    let _ = tls.flush().await;
                    until_closed(tls, limit).await
                }
            }
        }
        Intruder::RandomBytes | Intruder::HugePrefixRaw => {
            let mut tcp = TcpStream::connect(addr).await.map_err(|e| fail(e.into()))?;
            let bytes: Vec<u8> = match intruder {
                Intruder::HugePrefixRaw => [0xff, 0xff, 0xff, 0xff, 1, 2, 3].to_vec(),
                _ => (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect(),
            };
            let _ = tcp.write_all(&bytes).await;
            until_closed(tcp, limit).await
        }
        Intruder::HugePrefixInTls | Intruder::NotAHello => {
            let config = client_config(job, Some(job)).map_err(fail)?;
            let mut tls =
                tls_connect(addr, config).await.map_err(|e| format!("{intruder:?}: {e}"))?;
            let bytes: Vec<u8> = match intruder {
                Intruder::HugePrefixInTls => vec![0xff, 0xff, 0xff, 0xff, 4],
                _ => vec![0, 0, 0, 1, 5],
            };
            tls.write_all(&bytes).await.map_err(|e| fail(e.into()))?;
            tls.flush().await.map_err(|e| fail(e.into()))?;
            until_closed(tls, limit).await
        }
        Intruder::OneByteASecond => {
            let tcp = TcpStream::connect(addr).await.map_err(|e| fail(e.into()))?;
            let (read, mut write) = tcp.into_split();
            let trickle = tokio::spawn(async move {
                // The start of a TLS ClientHello, one byte a second.
                for byte in [0x16u8, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01] {
                    if write.write_all(&[byte]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            });
            let outcome = until_closed(read, limit).await;
            trickle.abort();
            outcome
        }
    })
}

#[test]
fn intruders_are_dropped_while_a_healthy_session_runs() -> TestResult {
    let _ = log();
    let dir = tempfile::tempdir()?;
    let job = keys(&dir.path().join("job"))?;
    let other = keys(&dir.path().join("other"))?;
    let mut cfg = config(&job)?;
    cfg.handshake = Duration::from_secs(1);
    let server = controller(&cfg, 2)?;
    let (at_controller, at_rank) = joined(&server, &cfg, 0, 2)?;

    // Healthy traffic: the rank sends on control, the controller echoes on bulk.
    let stop = Arc::new(AtomicBool::new(false));
    let pinger = {
        let stop = stop.clone();
        thread::spawn(move || -> Result<(u64, Duration), String> {
            let (mut rounds, mut slowest) = (0u64, Duration::ZERO);
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                at_rank
                    .send(Lane::Control, rounds.to_le_bytes().to_vec(), WAIT)
                    .map_err(|e| e.to_string())?;
                let echo = at_controller.recv(WAIT).map_err(|e| e.to_string())?;
                at_controller.send(Lane::Bulk, echo, WAIT).map_err(|e| e.to_string())?;
                let back = at_rank.recv(WAIT).map_err(|e| e.to_string())?;
                if back != rounds.to_le_bytes() {
                    return Err(format!("round {rounds} came back as {back:?}"));
                }
                slowest = slowest.max(start.elapsed());
                rounds += 1;
                thread::sleep(Duration::from_millis(5));
            }
            Ok((rounds, slowest))
        })
    };

    let cases = [
        (Intruder::NoCertificate, Expect::Dropped),
        (Intruder::ForeignCertificate, Expect::Dropped),
        (Intruder::RandomBytes, Expect::Dropped),
        (Intruder::HugePrefixRaw, Expect::Dropped),
        (Intruder::HugePrefixInTls, Expect::Dropped),
        (Intruder::NotAHello, Expect::Refused("the first message was not a hello")),
        (Intruder::OneByteASecond, Expect::Dropped),
    ];
    let addr = server.local_addr();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let limit = cfg.handshake * 3;
    let outcomes = runtime.block_on(async {
        let tasks: Vec<_> = cases
            .iter()
            .map(|(intruder, _)| {
                let (intruder, job, other) = (*intruder, job.rank(1), other.rank(1));
                tokio::spawn(async move {
                    let start = Instant::now();
                    intrude(intruder, addr, &job, &other, limit).await.map(|o| (o, start.elapsed()))
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.map_err(|e| e.to_string()).and_then(|r| r));
        }
        outcomes
    });
    stop.store(true, Ordering::Relaxed);
    let (rounds, slowest) = pinger.join().map_err(|_| "the pinger panicked")??;

    for ((intruder, expect), outcome) in cases.iter().zip(outcomes) {
        let ((seen, closed), took) = outcome?;
        if !closed {
            return Err(format!("{intruder:?}: still open after {limit:?}").into());
        }
        if seen.starts_with(&WELCOME) {
            return Err(format!("{intruder:?}: was welcomed").into());
        }
        match expect {
            // Raw TCP intruders may get a TLS alert record (content type 21) before the close;
            // a TLS client's reads show nothing but the close; inside TLS, nothing at all.
            Expect::Dropped if !(seen.is_empty() || seen[0] == 21) => {
                return Err(format!("{intruder:?}: expected a drop, read {seen:?}").into());
            }
            Expect::Refused(line) if !String::from_utf8_lossy(&seen).contains(line) => {
                return Err(
                    format!("{intruder:?}: expected the refusal {line:?}, read {seen:?}").into()
                );
            }
            _ => {}
        }
        if matches!(intruder, Intruder::OneByteASecond) && took < cfg.handshake / 2 {
            return Err(format!(
                "{intruder:?}: dropped after {took:?}, before its deadline could have passed"
            )
            .into());
        }
    }
    if rounds < 20 || slowest > Duration::from_secs(1) {
        return Err(format!(
            "the healthy session was disturbed: {rounds} rounds, slowest {slowest:?}"
        )
        .into());
    }
    // None of them became a session, and each drop was logged.
    match server.accept(Duration::from_millis(200)) {
        Err(NetError::Timeout(_)) => {}
        other => return Err(format!("an intruder became a session: {other:?}").into()),
    }
    for line in [
        ["TLS handshake failed"].as_slice(),
        &["no TLS handshake and hello within"],
        &["join refused", "not a hello"],
        &["frame size too big"],
    ] {
        if !logged(line, Duration::from_secs(2)) {
            return Err(format!("no log line with {line:?}").into());
        }
    }
    Ok(())
}

#[test]
fn a_joiner_with_another_jobs_keys_cannot_join() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(&keys(&dir.path().join("job"))?)?;
    let other = config(&keys(&dir.path().join("other"))?)?;
    let server = controller(&cfg, 2)?;
    match join(&target(server.local_addr()), Hello::new(RUN, 1, 2), other.rank(1)?, WAIT) {
        Err(NetError::Handshake(reason)) if reason.contains("TLS") => Ok(()),
        other => Err(format!("expected a TLS handshake failure, got {other:?}").into()),
    }
}

#[cfg(unix)]
#[test]
fn key_files_are_private() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    let keydir = dir.path().join("keys");
    let keys = JobKeys::generate(&keydir, 2, &["node1".to_string()], true)?;
    let (controller, rank1) = (keys.controller(), keys.rank(1));
    let ca_key = keydir.join(JobKeys::CA_KEY_FILE);
    let cases = [
        (&keydir, 0o700),
        (&controller.ca, 0o600),
        (&ca_key, 0o600),
        (&controller.cert, 0o600),
        (&controller.key, 0o600),
        (&rank1.cert, 0o600),
        (&rank1.key, 0o600),
    ];
    for (path, mode) in cases {
        let got = std::fs::metadata(path)?.permissions().mode() & 0o777;
        if got != mode {
            return Err(format!("{}: mode {got:o}, want {mode:o}", path.display()).into());
        }
    }
    Ok(())
}

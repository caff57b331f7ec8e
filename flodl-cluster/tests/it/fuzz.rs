//! The handshake under fuzzing: clients that send garbage, truncated or mutated valid transcripts,
//! before TLS (raw TCP: mutations of a real ClientHello) and after it (job members whose first
//! frames are mutated hellos), and unauthenticated clients (no certificate, or one from another
//! job's CA) sending the same. None is welcomed unless its bytes happen to be a valid hello
//! (counted), none is left open past the handshake deadline, none without a job certificate ever
//! gets an answer to its hello, and a session running alongside keeps working.
//!
//! [`DEFAULT_CASES`] connections in CI (about 20 s on a loaded 2-core machine); `FLODL_FUZZ_HANDSHAKES=N` runs N,
//! `FLODL_FUZZ_SEED=S` another sequence.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use flodl_cluster::wire::{Message, PROTOCOL};
use flodl_cluster::{Hello, Lane, NetError, TlsFiles};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::{
    RUN, TestResult, WAIT, client_config, config, controller, hello_bytes, joined, keys,
    tls_connect, until_closed,
};

/// Connections per run unless `FLODL_FUZZ_HANDSHAKES` says otherwise.
const DEFAULT_CASES: u64 = 1_000;
/// Connections in flight at once.
const IN_FLIGHT: usize = 32;
/// The world of the fuzzed controller.
const WORLD: usize = 2;

/// The frame the controller answers a lane with when it lets it in.
const WELCOME: [u8; 5] = [0, 0, 0, 1, 2];

/// A small deterministic generator (splitmix64), enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// `seed` with 1 to 4 changes: flipped bits, bytes set, inserted or deleted, truncation, random
/// tail, or a hostile 4-byte length at the front.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let i = rng.below(bytes.len() + 1);
        match rng.below(7) {
            0 if i < bytes.len() => bytes[i] ^= 1 << rng.below(8),
            1 if i < bytes.len() => bytes[i] = rng.next() as u8,
            2 => bytes.insert(i, rng.next() as u8),
            3 if i < bytes.len() => {
                bytes.remove(i);
            }
            4 => bytes.truncate(i),
            5 => bytes.extend((0..1 + rng.below(64)).map(|_| rng.next() as u8)),
            _ if bytes.len() >= 4 => {
                let len = [u32::MAX, 1 << 20, 1025, rng.next() as u32][rng.below(4)];
                bytes[..4].copy_from_slice(&len.to_be_bytes());
            }
            _ => {}
        }
    }
    bytes
}

/// How a fuzzing client talks to the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    /// Raw TCP: mutated ClientHellos, or garbage.
    Raw,
    /// A job member over TLS: mutated hello transcripts.
    Member,
    /// TLS without a client certificate.
    NoCertificate,
    /// TLS with a certificate of another job's CA.
    Foreign,
}

/// What a case came to.
#[derive(Debug, Default)]
struct Tally {
    raw: u64,
    member: u64,
    unauthenticated: u64,
    refused: u64,
    valid_by_chance: u64,
    slowest: Duration,
}

/// Whether `bytes` begin with a frame the controller would take as a valid hello of this run.
fn valid_hello(bytes: &[u8]) -> bool {
    let Some(len) = bytes.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    else {
        return false;
    };
    let Some(body) = bytes.get(4..4 + len) else { return false };
    matches!(
        Message::decode(BytesMut::from(body)),
        Ok(Message::Hello(h)) if h.hello.protocol == PROTOCOL && h.hello.run == RUN
            && h.hello.world == WORLD && h.hello.rank < WORLD
    )
}

/// The first flight of a real TLS client of the job: a ClientHello.
fn client_hello(job: &TlsFiles) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let name = rustls_pki_types::ServerName::try_from(flodl_cluster::keys::JOB_SERVER_NAME)?;
    let mut conn = rustls::ClientConnection::new(client_config(job, Some(job))?, name)?;
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out)?;
    }
    Ok(out)
}

/// One connection: sends `bytes` as `client`, half-closes, and reads until the controller
/// closes or `limit` passes; (what it read, whether it closed, whether TLS came up).
async fn connect(
    client: Client,
    addr: SocketAddr,
    configs: &Configs,
    bytes: Vec<u8>,
    limit: Duration,
) -> Result<(Vec<u8>, bool), String> {
    if client == Client::Raw {
        let mut tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let _ = tcp.write_all(&bytes).await;
        let _ = tcp.shutdown().await;
        return Ok(until_closed(tcp, limit).await);
    }
    let config = match client {
        Client::NoCertificate => configs.none.clone(),
        Client::Foreign => configs.foreign.clone(),
        _ => configs.member.clone(),
    };
    // TLS 1.3 lets a client finish before the server has checked its certificate: a refusal
    // shows as an alert or a close on the first read.
    match tls_connect(addr, config).await {
        Err(_) => Ok((Vec::new(), true)),
        Ok(mut tls) => {
            let _ = tls.write_all(&bytes).await;
            let _ = tls.flush().await;
            let _ = tls.shutdown().await;
            Ok(until_closed(tls, limit).await)
        }
    }
}

/// The client configurations of the cases.
struct Configs {
    member: Arc<rustls::ClientConfig>,
    none: Arc<rustls::ClientConfig>,
    foreign: Arc<rustls::ClientConfig>,
}

#[test]
fn fuzzed_handshakes_are_dropped_while_a_session_runs() -> TestResult {
    let cases = match std::env::var("FLODL_FUZZ_HANDSHAKES") {
        Ok(v) => v.parse::<u64>()?,
        Err(_) => DEFAULT_CASES,
    };
    let seed = match std::env::var("FLODL_FUZZ_SEED") {
        Ok(v) => v.parse::<u64>()?,
        Err(_) => 0x5eed,
    };
    let dir = tempfile::tempdir()?;
    let job = keys(&dir.path().join("job"))?;
    let other = keys(&dir.path().join("other"))?;
    let mut cfg = config(&job)?;
    cfg.handshake = Duration::from_secs(1);
    let server = controller(&cfg, WORLD)?;
    let (at_controller, at_rank) = joined(&server, &cfg, 0, WORLD)?;
    let configs = Arc::new(Configs {
        member: client_config(&job.rank(1), Some(&job.rank(1)))?,
        none: client_config(&job.rank(1), None)?,
        foreign: client_config(&job.rank(1), Some(&other.rank(1)))?,
    });
    let hello_seeds: Vec<Vec<u8>> = [(0, Lane::Control), (1, Lane::Control), (1, Lane::Bulk)]
        .into_iter()
        .map(|(rank, lane)| hello_bytes(Hello::new(RUN, rank, WORLD), lane, 7))
        .chain(std::iter::once(
            [hello_bytes(Hello::new(RUN, 1, WORLD), Lane::Control, 8), vec![0, 0, 0, 1, 5]]
                .concat(),
        ))
        .collect();
    let tls_seed = client_hello(&job.rank(1))?;

    let mut rng = Rng(seed);
    let inputs: Vec<(Client, Vec<u8>)> = (0..cases)
        .map(|i| {
            let client = match i % 10 {
                0..=3 => Client::Raw,
                4..=7 => Client::Member,
                8 => Client::NoCertificate,
                _ => Client::Foreign,
            };
            let bytes = match client {
                Client::Raw if rng.below(8) == 0 => {
                    (0..rng.below(600)).map(|_| rng.next() as u8).collect()
                }
                Client::Raw => mutate(&mut rng, &tls_seed),
                _ => {
                    let seed = &hello_seeds[rng.below(hello_seeds.len())];
                    mutate(&mut rng, seed)
                }
            };
            (client, bytes)
        })
        .collect();

    let addr = server.local_addr();
    let limit = cfg.handshake * 3;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let started = Instant::now();
    let tally = runtime.block_on(async {
        let mut tally = Tally::default();
        for batch in inputs.chunks(IN_FLIGHT) {
            let tasks: Vec<_> = batch
                .iter()
                .cloned()
                .map(|(client, bytes)| {
                    let configs = configs.clone();
                    tokio::spawn(async move {
                        let start = Instant::now();
                        let sent = bytes.clone();
                        connect(client, addr, &configs, bytes, limit)
                            .await
                            .map(|out| (client, sent, out, start.elapsed()))
                    })
                })
                .collect();
            for task in tasks {
                let (client, sent, (seen, closed), took) =
                    task.await.map_err(|e| e.to_string())??;
                let case = || format!("{client:?} sending {sent:02x?}");
                if !closed {
                    return Err(format!("{}: still open after {limit:?}", case()));
                }
                tally.slowest = tally.slowest.max(took);
                let welcomed = seen.starts_with(&WELCOME);
                let refused = seen.len() > 5 && seen[4] == 3;
                match client {
                    Client::Raw => {
                        tally.raw += 1;
                        // Nothing but TLS records before the close: an alert (content type 21),
                        // or a server hello (22) when the mutation left a well-formed
                        // ClientHello; never a frame of the protocol.
                        if !(seen.is_empty() || seen[0] == 21 || seen[0] == 22) {
                            return Err(format!("{}: read {seen:02x?}", case()));
                        }
                    }
                    Client::Member => {
                        tally.member += 1;
                        tally.refused += u64::from(refused);
                        if valid_hello(&sent) {
                            tally.valid_by_chance += 1;
                        } else if welcomed {
                            return Err(format!("{}: welcomed", case()));
                        }
                    }
                    Client::NoCertificate | Client::Foreign => {
                        tally.unauthenticated += 1;
                        if !seen.is_empty() {
                            return Err(format!("{}: its hello got an answer {seen:02x?}", case()));
                        }
                    }
                }
            }
        }
        Ok::<Tally, String>(tally)
    })?;
    println!(
        "handshake fuzz: {cases} connections (seed {seed}) in {:.1} s; {tally:?}",
        started.elapsed().as_secs_f64()
    );
    if tally.refused == 0 || tally.raw == 0 || tally.unauthenticated == 0 {
        return Err(format!("the cases missed an outcome: {tally:?}").into());
    }
    // The healthy session still carries frames both ways.
    at_rank.send(Lane::Control, b"still here".to_vec(), WAIT)?;
    let got = at_controller.recv(WAIT)?;
    at_controller.send(Lane::Bulk, got, WAIT)?;
    if at_rank.recv(WAIT)? != b"still here" {
        return Err("the healthy session's frame came back different".into());
    }
    // No intruder became a session, except where two valid hellos paired by chance.
    match server.accept(Duration::from_millis(200)) {
        Err(NetError::Timeout(_)) => Ok(()),
        Ok(session) if tally.valid_by_chance >= 2 => {
            println!("a session from hellos valid by chance: rank {}", session.rank());
            Ok(())
        }
        other => Err(format!("an intruder became a session: {other:?}").into()),
    }
}

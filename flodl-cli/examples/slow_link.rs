//! The controller behind a slow link, measured: the same job of 3 rank processes (host
//! backend, `Cadence`, MLP 784-4096-4096-10: 20M parameters, 80 MB a state) on loopback and
//! across emulated hosts whose link to the controller is shaped, in every wire format, one
//! markdown row per (link, format).
//!
//! ```text
//!  ns A: controller + rank 0 ── veth ── ns B: rank 1 ─┐
//!        shaping proxy (in A) ── veth ── ns C: rank 2 ─┴─ both dial the proxy
//! ```
//! The proxy is the controller's link: one rate per direction shared by every connection
//! through it (ranks 1 and 2, both lanes), plus a one-way delay. Rank 0 hosts the controller
//! and is not behind it. The kernel here has no `tc netem`, so the shaping is a user-space
//! TCP proxy (tokio), as in `tests/hosts.rs`.
//!
//! ```text
//! cargo build --release -p flodl-cli --bin fdl --example slow_link
//! target/release/examples/slow_link [--samples N] [--links loopback,100,1000]
//!     [--wires f32,bf16,int8,q4] [--repeats R] [-- EXTRA FDL FLAGS...]
//! ```
//! Needs root (`ip netns`). Columns: samples/s of the whole job and its ratio to the same
//! format on loopback; each remote rank's exchange (encoding and handing its frame over) and
//! its whole host round trip (exchange + reduce: the time it could not train because of the
//! averaging, as the ranks do not yet overlap it) as shares of its wall; the final training
//! loss at equal samples and its relative gap to loopback f32. Repeats run round-robin.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The added one-way delay of the controller's link.
const LATENCY: Duration = Duration::from_millis(20);
/// How long one job may take.
const JOB_LIMIT: Duration = Duration::from_secs(1800);
/// The addresses on the A–B and A–C links: (A's, the other's).
const AB: (Ipv4Addr, Ipv4Addr) = (Ipv4Addr::new(10, 214, 1, 1), Ipv4Addr::new(10, 214, 1, 2));
const AC: (Ipv4Addr, Ipv4Addr) = (Ipv4Addr::new(10, 214, 2, 1), Ipv4Addr::new(10, 214, 2, 2));

/// The `fdl` binary built beside the example.
fn fdl() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().and_then(Path::parent).ok_or("no target directory")?;
    let fdl = dir.join("fdl");
    if fdl.is_file() { Ok(fdl) } else { Err(format!("{} is missing", fdl.display()).into()) }
}

fn ip(args: &[&str]) -> Result {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("ip {}: {}", args.join(" "), err.trim()).into());
    }
    Ok(())
}

/// Three namespaces (A, B, C), veth pairs A–B and A–C; deleted on drop.
struct Hosts {
    names: Vec<String>,
}

impl Hosts {
    fn make() -> Result<Hosts> {
        let tag = format!("sl{}", std::process::id());
        let mut hosts = Hosts { names: Vec::new() };
        for x in ["a", "b", "c"] {
            let name = format!("{tag}{x}");
            ip(&["netns", "add", &name])?;
            hosts.names.push(name.clone());
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
        }
        let (a, b, c) = (&hosts.names[0], &hosts.names[1], &hosts.names[2]);
        for (peer, (mine, theirs), link) in [(b, AB, "ab"), (c, AC, "ac")] {
            let (end_a, end_p) = (format!("{tag}{link}0"), format!("{tag}{link}1"));
            ip(&["-n", a, "link", "add", &end_a, "type", "veth", "peer", "name", &end_p])?;
            ip(&["-n", a, "link", "set", &end_p, "netns", peer])?;
            ip(&["-n", a, "addr", "add", &format!("{mine}/24"), "dev", &end_a])?;
            ip(&["-n", peer, "addr", "add", &format!("{theirs}/24"), "dev", &end_p])?;
            ip(&["-n", a, "link", "set", &end_a, "up"])?;
            ip(&["-n", peer, "link", "set", &end_p, "up"])?;
        }
        Ok(hosts)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for name in &self.names {
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("cannot delete namespace {name}: {e}");
            }
        }
    }
}

/// One direction of the link: when it is next free (shared by every connection through it).
type Pace = Arc<Mutex<tokio::time::Instant>>;

/// Copies `from` to `to` through one direction of the link: a chunk leaves no earlier than
/// [`LATENCY`] after it arrived, and the direction carries `rate` bytes/s at most in all.
async fn shaped_copy<R, W>(mut from: R, mut to: W, pace: Pace, rate: f64)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(tokio::time::Instant, Vec<u8>)>(256);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let due = tokio::time::Instant::now() + LATENCY;
                    if tx.send((due, buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    while let Some((due, chunk)) = rx.recv().await {
        let done = {
            let mut free = pace.lock().unwrap_or_else(|p| p.into_inner());
            let start = due.max(*free);
            *free = start + Duration::from_secs_f64(chunk.len() as f64 / rate);
            *free
        };
        tokio::time::sleep_until(done).await;
        if to.write_all(&chunk).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
    reader.abort();
}

/// The proxy: every connection accepted on `listener` is dialled on to `upstream` through the
/// shared directions `up` (to the controller) and `down`.
async fn proxy(listener: TcpListener, upstream: SocketAddr, rate: f64) {
    let now = tokio::time::Instant::now();
    let (up, down): (Pace, Pace) = (Arc::new(Mutex::new(now)), Arc::new(Mutex::new(now)));
    loop {
        let Ok((near, _)) = listener.accept().await else { return };
        let (up, down) = (up.clone(), down.clone());
        tokio::spawn(async move {
            let mut tries = 0;
            let far = loop {
                match TcpStream::connect(upstream).await {
                    Ok(s) => break s,
                    Err(_) if tries < 1200 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(_) => return,
                }
            };
            let _ = (near.set_nodelay(true), far.set_nodelay(true));
            let (near_r, near_w) = near.into_split();
            let (far_r, far_w) = far.into_split();
            tokio::join!(
                shaped_copy(near_r, far_w, up, rate),
                shaped_copy(far_r, near_w, down, rate)
            );
        });
    }
}

/// The proxy on a thread inside namespace `ns`, listening on every address of it; stopped on
/// drop.
struct Link {
    port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Link {
    fn start(ns: &str, upstream: SocketAddr, rate: f64) -> Result<Link> {
        let netns = File::open(Path::new("/run/netns").join(ns))?;
        let (ready_tx, ready) = std::sync::mpsc::channel::<std::result::Result<u16, String>>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            if let Err(e) = nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET) {
                let _ = ready_tx.send(Err(format!("setns: {e}")));
                return;
            }
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            runtime.block_on(async move {
                let listener = match TcpListener::bind("0.0.0.0:0").await {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let port = listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string());
                let _ = ready_tx.send(port);
                tokio::select! {
                    _ = proxy(listener, upstream, rate) => {}
                    _ = stopped => {}
                }
            });
        });
        let port = ready.recv_timeout(Duration::from_secs(10))??;
        Ok(Link { port, stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Kills the children still running on drop.
struct Ranks(Vec<Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in &mut self.0 {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Where each rank runs (`None`: this namespace) and the controller's address as it dials it;
/// where the controller listens.
struct Placement {
    ns: [Option<String>; 3],
    dial: [SocketAddr; 3],
    bind: SocketAddr,
}

fn own_key(rank: usize, ext: &str) -> String {
    if rank == 0 { format!("controller.{ext}") } else { format!("rank-{rank}.{ext}") }
}

/// Runs one job; rank 0 writes to `out/rank0`.
fn run_job(fdl: &Path, place: &Placement, keys: &Path, out: &Path, args: &[String]) -> Result {
    let mut ranks = Ranks(Vec::new());
    for rank in 0..3 {
        let mut cmd = match &place.ns[rank] {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(fdl);
                c
            }
            None => Command::new(fdl),
        };
        cmd.arg("train")
            .args(args)
            .arg("--out")
            .arg(out.join(format!("rank{rank}")))
            .env("FLODL_RANK", rank.to_string())
            .env("FLODL_WORLD_SIZE", "3")
            .env("FLODL_LOCAL_RANK", "0")
            .env("FLODL_CONTROLLER_ADDR", place.dial[rank].ip().to_string())
            .env("FLODL_CONTROLLER_PORT", place.dial[rank].port().to_string())
            .env("FLODL_TLS_CA", keys.join("ca.pem"))
            .env("FLODL_TLS_CERT", keys.join(own_key(rank, "pem")))
            .env("FLODL_TLS_KEY", keys.join(own_key(rank, "key")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if rank == 0 {
            cmd.arg("--bind").arg(place.bind.to_string());
        }
        ranks.0.push(cmd.spawn()?);
    }
    let start = Instant::now();
    let mut codes = [None; 3];
    while codes.iter().any(Option::is_none) {
        if start.elapsed() > JOB_LIMIT {
            return Err(format!("the job ran past {JOB_LIMIT:?}; exits {codes:?}").into());
        }
        for (rank, child) in ranks.0.iter_mut().enumerate() {
            if codes[rank].is_none() {
                codes[rank] = child.try_wait()?.map(|s| s.code());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if codes.iter().any(|c| *c != Some(Some(0))) {
        let mut why = String::new();
        for (rank, child) in ranks.0.iter_mut().enumerate() {
            let mut err = String::new();
            if let Some(mut s) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut s, &mut err);
            }
            why.push_str(&format!("\nrank {rank} ({:?}): {}", codes[rank], err.trim()));
        }
        return Err(format!("a rank failed:{why}").into());
    }
    Ok(())
}

/// What one run came to.
struct Outcome {
    rate: f64,
    loss: f64,
    reduces: f64,
    /// Per remote rank (1, 2): (exchange, exchange + reduce) as shares of its wall.
    shares: Vec<(f64, f64)>,
}

fn outcome(dir: &Path) -> Result<Outcome> {
    let s: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json"))?)?;
    let wall = s["train_wall_s"].as_f64().ok_or("no train_wall_s")?;
    let ranks = s["ranks"].as_array().ok_or("no ranks")?;
    let samples: f64 = ranks.iter().filter_map(|r| r["samples"].as_f64()).sum();
    let mut shares = Vec::new();
    for r in ranks.iter().skip(1) {
        let t = r["time"].as_object().ok_or("no time")?;
        let total: f64 = t.values().filter_map(Value::as_f64).sum();
        let get = |k: &str| t.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        let exchange = get("exchange_ms");
        shares.push((exchange / total.max(1e-9), (exchange + get("reduce_ms")) / total.max(1e-9)));
    }
    Ok(Outcome {
        rate: samples / wall,
        loss: s["final_train_loss"].as_f64().unwrap_or(f64::NAN),
        reduces: s["syncs"].as_f64().unwrap_or(f64::NAN),
        shares,
    })
}

fn main() -> Result {
    let fdl = fdl()?;
    let mut samples = "3072".to_string();
    let mut links = "loopback,100,1000".to_string();
    let mut wires = "f32,bf16,int8,q4".to_string();
    let mut repeats = 1usize;
    let mut extra = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--samples" => samples = args.next().ok_or("--samples N")?,
            "--links" => links = args.next().ok_or("--links L,..")?,
            "--wires" => wires = args.next().ok_or("--wires W,..")?,
            "--repeats" => repeats = args.next().ok_or("--repeats R")?.parse()?,
            "--" => extra.extend(args.by_ref()),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let tmp = tempfile::tempdir()?;
    let keys = tmp.path().join("keys");
    let out =
        Command::new(&fdl).args(["cluster", "keys"]).arg(&keys).args(["--world", "3"]).output()?;
    if !out.status.success() {
        return Err(format!("fdl cluster keys: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let hosts = Hosts::make()?;
    let controller = SocketAddr::V4(SocketAddrV4::new(AB.0, 29_600));
    let mut results: Vec<(String, String, Outcome)> = Vec::new();
    for repeat in 0..repeats {
        for link in links.split(',') {
            // The link and where everyone is.
            let (place, _link) = if link == "loopback" {
                let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
                let local = SocketAddr::from(([127, 0, 0, 1], port));
                (Placement { ns: [None, None, None], dial: [local; 3], bind: local }, None)
            } else {
                let mbit: f64 = link.parse()?;
                let shaped = Link::start(&hosts.names[0], controller, mbit * 1e6 / 8.0)?;
                let via = |ip| SocketAddr::V4(SocketAddrV4::new(ip, shaped.port));
                let ns = |i: usize| Some(hosts.names[i].clone());
                let place = Placement {
                    ns: [ns(0), ns(1), ns(2)],
                    dial: [controller, via(AB.0), via(AC.0)],
                    bind: controller,
                };
                (place, Some(shaped))
            };
            for wire in wires.split(',') {
                let job: Vec<String> = [
                    "--backend",
                    "host",
                    "--policy",
                    "cadence",
                    "--hidden",
                    "4096,4096",
                    "--train-subset",
                    &samples,
                    "--test-subset",
                    "500",
                    "--epochs",
                    "1",
                    "--batch-size",
                    "64",
                    "--quiet",
                    "--wire",
                    wire,
                ]
                .iter()
                .map(|s| s.to_string())
                .chain(extra.iter().cloned())
                .collect();
                let dir = tmp.path().join(format!("{link}-{wire}-{repeat}"));
                let started = Instant::now();
                run_job(&fdl, &place, &keys, &dir, &job)?;
                let o = outcome(&dir.join("rank0"))?;
                eprintln!(
                    "{link} {wire} #{repeat}: {:.0} samples/s, {} reduces, {:.0} s",
                    o.rate,
                    o.reduces,
                    started.elapsed().as_secs_f64()
                );
                results.push((link.to_string(), wire.to_string(), o));
            }
        }
    }
    drop(hosts);
    let mean = |link: &str, wire: &str, f: &dyn Fn(&Outcome) -> f64| {
        let v: Vec<f64> =
            results.iter().filter(|r| r.0 == link && r.1 == wire).map(|r| f(&r.2)).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let base_loss = mean("loopback", "f32", &|o| o.loss);
    println!(
        "| link | wire | samples/s | × loopback | reduces | exchange % of wall (r1, r2) | \
         exchange+reduce % of wall (r1, r2) | final loss | loss vs loopback f32 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for link in links.split(',') {
        for wire in wires.split(',') {
            let rate = mean(link, wire, &|o| o.rate);
            let share = |i: usize, j: bool| {
                mean(link, wire, &|o| {
                    o.shares.get(i).map_or(f64::NAN, |s| if j { s.1 } else { s.0 })
                })
            };
            let loss = mean(link, wire, &|o| o.loss);
            println!(
                "| {link} | {wire} | {rate:.0} | {:.2} | {:.1} | {:.1}, {:.1} | {:.1}, {:.1} | {loss:.4} | {:+.2}% |",
                rate / mean("loopback", wire, &|o| o.rate),
                mean(link, wire, &|o| o.reduces),
                100.0 * share(0, false),
                100.0 * share(1, false),
                100.0 * share(0, true),
                100.0 * share(1, true),
                100.0 * (loss / base_loss - 1.0),
            );
        }
    }
    Ok(())
}

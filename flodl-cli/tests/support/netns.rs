//! Emulated hosts for `tests/hosts.rs` and `examples/slow_link.rs` (each includes this file
//! with `#[path]`): three network namespaces joined by veth pairs, a shaping TCP proxy (the
//! kernel here has no `tc netem`) running inside one of them, and the three rank processes of a
//! host-backend job placed across them.
//!
//! ```text
//!  ns A: controller + rank 0 ── veth ── ns B
//!        shaping proxy (in A) ── veth ── ns C
//! ```

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

pub(crate) fn ip(args: &[&str]) -> Result {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("ip {}: {}", args.join(" "), err.trim()).into());
    }
    Ok(())
}

/// Three namespaces (A, B, C) with veth pairs A–B and A–C, deleted (with their links) on drop.
pub(crate) struct Hosts {
    pub(crate) names: [String; 3],
}

impl Hosts {
    /// Makes them, named `{prefix}{pid}a` .. `c`, with the addresses `ab` on the A–B link and
    /// `ac` on the A–C link, each (A's, the other's); `Err` when this machine does not let us.
    pub(crate) fn make(
        prefix: &str,
        ab: (Ipv4Addr, Ipv4Addr),
        ac: (Ipv4Addr, Ipv4Addr),
    ) -> Result<Hosts> {
        let tag = format!("{prefix}{}", std::process::id());
        let names = [format!("{tag}a"), format!("{tag}b"), format!("{tag}c")];
        let mut hosts = Hosts { names: [String::new(), String::new(), String::new()] };
        for (i, name) in names.iter().enumerate() {
            ip(&["netns", "add", name])?;
            hosts.names[i] = name.clone();
            ip(&["-n", name, "link", "set", "lo", "up"])?;
        }
        let [a, b, c] = &names;
        for (peer, (mine, theirs), link) in [(b, ab, "ab"), (c, ac, "ac")] {
            let (end_a, end_p) = (format!("{tag}{link}0"), format!("{tag}{link}1"));
            ip(&[
                "-n", a, "link", "add", &end_a, "type", "veth", "peer", "name", &end_p, "netns",
                peer,
            ])?;
            ip(&["-n", a, "addr", "add", &format!("{mine}/24"), "dev", &end_a])?;
            ip(&["-n", peer, "addr", "add", &format!("{theirs}/24"), "dev", &end_p])?;
            ip(&["-n", a, "link", "set", &end_a, "up"])?;
            ip(&["-n", peer, "link", "set", &end_p, "up"])?;
        }
        Ok(hosts)
    }

    pub(crate) fn a(&self) -> &str {
        &self.names[0]
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for name in self.names.iter().filter(|n| !n.is_empty()) {
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("cannot delete namespace {name}: {e}");
            }
        }
    }
}

/// How the proxy shapes the link.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// Added one-way delay.
    pub(crate) latency: Duration,
    /// Bytes per second, per direction.
    pub(crate) rate: f64,
    /// `true`: one rate per direction shared by every connection through the proxy (one
    /// link); `false`: each connection's directions have the rate to themselves.
    pub(crate) shared: bool,
    /// Bytes read at a time: a chunk is delayed and paced whole.
    pub(crate) chunk: usize,
}

/// One direction of the link: when it is next free.
type Pace = Arc<Mutex<tokio::time::Instant>>;

fn pace() -> Pace {
    Arc::new(Mutex::new(tokio::time::Instant::now()))
}

/// Copies `from` to `to` through one direction of the link: a chunk leaves no earlier than the
/// latency after it arrived, and the direction (`pace`) carries the rate at most (a delay
/// queue feeding a paced writer, through a bounded queue).
async fn shaped_copy<R, W>(mut from: R, mut to: W, pace: Pace, shape: Shape)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(tokio::time::Instant, Vec<u8>)>(256);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; shape.chunk];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let due = tokio::time::Instant::now() + shape.latency;
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
            *free = start + Duration::from_secs_f64(chunk.len() as f64 / shape.rate);
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

/// The proxy: every connection accepted on `listener` is dialled on to `upstream` and copied
/// both ways through the shaped link.
async fn proxy(listener: TcpListener, upstream: SocketAddr, shape: Shape) {
    let (up, down) = (pace(), pace());
    loop {
        let Ok((near, _)) = listener.accept().await else { return };
        let (up, down) = if shape.shared { (up.clone(), down.clone()) } else { (pace(), pace()) };
        tokio::spawn(async move {
            // Through a real link the connection would reach the controller once it listens:
            // dial until it does (a minute at most).
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
                shaped_copy(near_r, far_w, up, shape),
                shaped_copy(far_r, near_w, down, shape)
            );
        });
    }
}

/// The proxy on a thread of its own inside namespace `ns`: it listens on `listen` (port 0: any)
/// and dials `upstream`; stopped on drop.
pub(crate) struct Link {
    pub(crate) addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Link {
    pub(crate) fn start(
        ns: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
        shape: Shape,
    ) -> Result<Link> {
        let netns = File::open(Path::new("/run/netns").join(ns))?;
        let (ready_tx, ready) =
            std::sync::mpsc::channel::<std::result::Result<SocketAddr, String>>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            // The network namespace is per thread: this one's sockets live in `ns`.
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
                let listener = match TcpListener::bind(listen).await {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("bind {listen}: {e}")));
                        return;
                    }
                };
                let _ = ready_tx.send(listener.local_addr().map_err(|e| e.to_string()));
                tokio::select! {
                    _ = proxy(listener, upstream, shape) => {}
                    _ = stopped => {}
                }
            });
        });
        let addr = ready.recv_timeout(Duration::from_secs(10))??;
        Ok(Link { addr, stop: Some(stop), thread: Some(thread) })
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

/// Where each rank runs and how it reaches the controller.
pub(crate) struct Placement {
    /// The namespace of each rank (`None`: this one).
    pub(crate) ns: [Option<String>; 3],
    /// The controller's address as each rank dials it.
    pub(crate) dial: [SocketAddr; 3],
    /// Where the controller listens.
    pub(crate) bind: SocketAddr,
}

/// Kills the children still running on drop (by pid, through `Child`).
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

/// The file of rank `rank`'s process's own certificate (`pem`) or key (`key`): the
/// controller's for rank 0, whose process hosts it.
fn own_key(rank: usize, ext: &str) -> String {
    if rank == 0 { format!("controller.{ext}") } else { format!("rank-{rank}.{ext}") }
}

/// Runs `fdl train ARGS` as 3 rank processes placed by `place` (TLS keys from `fdl cluster
/// keys` in `keys`), rank r writing to `out/rank{r}`; fails unless every rank exits 0 within
/// `limit`.
pub(crate) fn run_job(
    fdl: &Path,
    place: &Placement,
    keys: &Path,
    out: &Path,
    args: &[String],
    limit: Duration,
) -> Result {
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
            // Each process its own key: rank 0's hosts the controller.
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
        if start.elapsed() > limit {
            return Err(format!("the job ran past {limit:?}; exits so far {codes:?}").into());
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

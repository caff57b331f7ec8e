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
//! TCP proxy (tokio), shared with `tests/hosts.rs` (`tests/support/netns.rs`).
//!
//! ```text
//! cargo build --release -p flodl-cli --bin fdl --example slow_link
//! target/release/examples/slow_link [--samples N] [--links loopback,100,1000]
//!     [--wires f32,bf16,int8,q4] [--repeats R] [--keep] [-- EXTRA FDL FLAGS...]
//! ```
//! Needs root (`ip netns`). Columns: samples/s of the whole job and its ratio to the same
//! format on loopback ("—" without that loopback job); each remote rank's exchange (encoding and handing its frame over) and
//! its whole host round trip (exchange + reduce: the time it waited for or spent on the
//! averaging) as shares of its wall; the final training loss at equal samples (the last
//! epoch's mean of the ranks' local losses), the returned model's loss on the first 5,000
//! training samples (`--train-eval`) and on the test subset, each with its relative gap to
//! loopback f32 ("—" without a loopback f32 job); the job's whole wall (start-up, training,
//! the evaluations and the end: what a user waits for). Repeats run round-robin; each cell is their median
//! (the upper one of an even count), and each job's line gives its own figures. `--keep`
//! keeps the jobs' output directories and prints where.

mod bench_kit;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../tests/support/netns.rs"]
mod netns;

use netns::{Hosts, Link, Placement, Shape, run_job};

use bench_kit::{BIG_MLP, Result, fdl};

/// The added one-way delay of the controller's link.
const LATENCY: Duration = Duration::from_millis(20);
/// The training samples the returned model is scored on after each job.
const TRAIN_EVAL: &str = "5000";
/// How long one job may take.
const JOB_LIMIT: Duration = Duration::from_secs(1800);
/// The addresses on the A–B and A–C links: (A's, the other's).
const AB: (Ipv4Addr, Ipv4Addr) = (Ipv4Addr::new(10, 214, 1, 1), Ipv4Addr::new(10, 214, 1, 2));
const AC: (Ipv4Addr, Ipv4Addr) = (Ipv4Addr::new(10, 214, 2, 1), Ipv4Addr::new(10, 214, 2, 2));

/// What one run came to.
struct Outcome {
    rate: f64,
    /// The job's wall, start to end (`run_wall_s`).
    job_wall: f64,
    loss: f64,
    /// The returned model's loss on the test subset (`test.loss`).
    test_loss: f64,
    /// The returned model's loss on the first training samples (`train_eval.loss`).
    train_eval_loss: f64,
    reduces: f64,
    /// Per remote rank (1, 2): (exchange, exchange + reduce) as shares of its wall.
    shares: Vec<(f64, f64)>,
    /// Samples each rank trained, by rank.
    samples: Vec<f64>,
    /// Ranks declared dead during the run: each one's rank and cause.
    faults: Vec<String>,
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
        samples: ranks.iter().map(|r| r["samples"].as_f64().unwrap_or(0.0)).collect(),
        faults: s["faults"]
            .as_array()
            .map(|f| f.iter().map(|f| format!("rank {} {}", f["rank"], f["cause"])).collect())
            .unwrap_or_default(),
        rate: samples / wall,
        job_wall: s["run_wall_s"].as_f64().unwrap_or(f64::NAN),
        loss: s["final_train_loss"].as_f64().unwrap_or(f64::NAN),
        test_loss: s["test"]["loss"].as_f64().unwrap_or(f64::NAN),
        train_eval_loss: s["train_eval"]["loss"].as_f64().unwrap_or(f64::NAN),
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
    let mut keep = false;
    let mut extra = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--samples" => samples = args.next().ok_or("--samples N")?,
            "--links" => links = args.next().ok_or("--links L,..")?,
            "--wires" => wires = args.next().ok_or("--wires W,..")?,
            "--repeats" => repeats = args.next().ok_or("--repeats R")?.parse()?,
            "--keep" => keep = true,
            "--" => extra.extend(args.by_ref()),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let tmp = tempfile::tempdir()?;
    let tmp = std::mem::ManuallyDrop::new(tmp);
    if keep {
        eprintln!("the jobs' directories are kept in {}", tmp.path().display());
    }
    let keys = tmp.path().join("keys");
    let out =
        Command::new(&fdl).args(["cluster", "keys"]).arg(&keys).args(["--world", "3"]).output()?;
    if !out.status.success() {
        return Err(format!("fdl cluster keys: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let hosts = Hosts::make("sl", AB, AC)?;
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
                // One link: its rate per direction shared by every connection through it.
                let shape = Shape {
                    latency: LATENCY,
                    rate: mbit * 1e6 / 8.0,
                    shared: true,
                    chunk: 64 * 1024,
                };
                let any = SocketAddr::from(([0, 0, 0, 0], 0));
                let shaped = Link::start(hosts.a(), any, controller, shape)?;
                let via = |ip| SocketAddr::V4(SocketAddrV4::new(ip, shaped.addr.port()));
                let ns = |i: usize| Some(hosts.names[i].clone());
                let place = Placement {
                    ns: [ns(0), ns(1), ns(2)],
                    dial: [controller, via(AB.0), via(AC.0)],
                    bind: controller,
                };
                (place, Some(shaped))
            };
            for wire in wires.split(',') {
                let flags = [
                    "--train-subset",
                    &samples,
                    "--test-subset",
                    "500",
                    "--train-eval",
                    TRAIN_EVAL,
                    "--epochs",
                    "1",
                    "--batch-size",
                    "64",
                    "--quiet",
                    "--wire",
                    wire,
                ];
                let job: Vec<String> = BIG_MLP
                    .iter()
                    .chain(&flags)
                    .map(|s| s.to_string())
                    .chain(extra.iter().cloned())
                    .collect();
                let dir = tmp.path().join(format!("{link}-{wire}-{repeat}"));
                let started = Instant::now();
                run_job(&fdl, &place, &keys, &dir, &job, JOB_LIMIT)?;
                let o = outcome(&dir.join("rank0"))?;
                eprintln!(
                    "{link} {wire} #{repeat}: {:.0} samples/s, {} reduces, final loss {:.4}, \
                     returned model's train loss {:.4}, test loss {:.4}, {:.0} s, samples by \
                     rank {:?}, ranks declared dead: {:?}",
                    o.rate,
                    o.reduces,
                    o.loss,
                    o.train_eval_loss,
                    o.test_loss,
                    started.elapsed().as_secs_f64(),
                    o.samples,
                    o.faults
                );
                results.push((link.to_string(), wire.to_string(), o));
            }
        }
    }
    drop(hosts);
    if !keep {
        std::mem::ManuallyDrop::into_inner(tmp).close()?;
    }
    // The median of the repeats (the upper one of an even count).
    let median = |link: &str, wire: &str, f: &dyn Fn(&Outcome) -> f64| {
        let mut v: Vec<f64> =
            results.iter().filter(|r| r.0 == link && r.1 == wire).map(|r| f(&r.2)).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let base_loss = median("loopback", "f32", &|o| o.loss);
    let base_test = median("loopback", "f32", &|o| o.test_loss);
    let base_train_eval = median("loopback", "f32", &|o| o.train_eval_loss);
    // Without a loopback f32 job there is nothing to compare a loss with.
    let gap = |loss: f64, base: f64| match base.is_nan() {
        true => "—".to_string(),
        false => format!("{:+.2}%", 100.0 * (loss / base - 1.0)),
    };
    println!(
        "| link | wire | samples/s | × loopback | reduces | exchange % of wall (r1, r2) | \
         exchange+reduce % of wall (r1, r2) | final loss | loss vs loopback f32 | returned \
         model's train loss | vs loopback f32 | test loss | test loss vs loopback f32 | job wall \
         (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for link in links.split(',') {
        for wire in wires.split(',') {
            let rate = median(link, wire, &|o| o.rate);
            let share = |i: usize, j: bool| {
                median(link, wire, &|o| {
                    o.shares.get(i).map_or(f64::NAN, |s| if j { s.1 } else { s.0 })
                })
            };
            let loss = median(link, wire, &|o| o.loss);
            let test = median(link, wire, &|o| o.test_loss);
            let train_eval = median(link, wire, &|o| o.train_eval_loss);
            // Without a loopback job of the same format there is no ratio either.
            let own_loopback = median("loopback", wire, &|o| o.rate);
            let ratio = match own_loopback.is_nan() {
                true => "—".to_string(),
                false => format!("{:.2}", rate / own_loopback),
            };
            println!(
                "| {link} | {wire} | {rate:.0} | {ratio} | {:.1} | {:.1}, {:.1} | {:.1}, {:.1} | {loss:.4} | {} | {train_eval:.4} | {} | {test:.4} | {} | {:.1} |",
                median(link, wire, &|o| o.reduces),
                100.0 * share(0, false),
                100.0 * share(1, false),
                100.0 * share(0, true),
                100.0 * share(1, true),
                gap(loss, base_loss),
                gap(train_eval, base_train_eval),
                gap(test, base_test),
                median(link, wire, &|o| o.job_wall),
            );
        }
    }
    Ok(())
}

//! Skews and rank counts as rank processes: the MNIST workload (MLP 784-256-128-10, batch 64)
//! with rank 0 at full speed and the others spread evenly up to each skew, on N in-process
//! ranks (`fdl train --ranks N`) and on N rank processes over mutual TLS on loopback
//! (`fdl launch --nproc N`), each policy, against the co-run ceiling of processes: the same N
//! ranks as N single-rank `fdl train` processes side by side, never averaging, rank r on the
//! share of the samples its solo speed covers in rank 0's time, and the solo sum (each factor
//! trained alone). With `--speed-change`, it also runs the mixed job (one rank slowed for part of
//! the run) as rank processes and prints its plan around each change, from `metrics.jsonl`.
//!
//! ```text
//! cargo build --release -p flodl-cli --bin fdl --example skew_bench
//! target/release/examples/skew_bench [--skews 1.5,2.5,5,10] [--ranks 2,3,4]
//!     [--policies cadence,async,sync] [--backend host] [--repeats 1]
//!     [--speed-change 1:3@0.3-0.6] [-- EXTRA FDL FLAGS...]
//! ```
//! Throughput is samples trained / training wall time, from each run's summary.json; medians
//! over the repeats, which run round-robin. Extra flags (after `--`) go to every run, e.g.
//! `-- --epochs 1 --train-subset 12000 --test-subset 1000`. A policy may add `/fF`
//! (`--fragments F`) and `/o` (`--overlap`) for its jobs only, not the solo and co-run ones:
//! `--policies cadence,cadence/f4` runs the plain and the fragmented job against one ceiling.

mod bench_kit;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use bench_kit::{Result, fdl};

struct Args {
    skews: Vec<f64>,
    ranks: Vec<usize>,
    policies: Vec<String>,
    backend: String,
    repeats: usize,
    speed_change: Option<String>,
    extra: Vec<String>,
}

fn list<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<Vec<T>> {
    let v = v.ok_or(format!("{flag} needs a value"))?;
    v.split(',').map(|x| x.parse().map_err(|_| format!("{flag}: bad value {x}").into())).collect()
}

fn parse() -> Result<Args> {
    let mut args = Args {
        skews: vec![1.5, 2.5, 5.0, 10.0],
        ranks: vec![2, 3, 4],
        policies: vec!["cadence".into(), "async".into(), "sync".into()],
        backend: "host".into(),
        repeats: 1,
        speed_change: None,
        extra: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--skews" => args.skews = list(&a, it.next())?,
            "--ranks" => args.ranks = list(&a, it.next())?,
            "--policies" => args.policies = list(&a, it.next())?,
            "--backend" => args.backend = it.next().ok_or("--backend needs a value")?,
            "--repeats" => args.repeats = it.next().ok_or("--repeats needs a value")?.parse()?,
            "--speed-change" => args.speed_change = Some(it.next().ok_or("needs a value")?),
            "--" => args.extra = it.by_ref().collect(),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(args)
}

/// A `--policies` entry: the policy, and the flags its `/fF` and `/o` suffixes stand for.
fn policy_flags(entry: &str) -> Result<(&str, Vec<String>)> {
    let mut parts = entry.split('/');
    let policy = parts.next().unwrap_or_default();
    let mut flags = Vec::new();
    for part in parts {
        match (part, part.strip_prefix('f')) {
            ("o", _) => flags.push("--overlap".to_string()),
            (_, Some(f)) if f.parse::<usize>().is_ok() => {
                flags.extend(["--fragments".to_string(), f.to_string()])
            }
            _ => return Err(format!("--policies {entry}: unknown suffix /{part}").into()),
        }
    }
    Ok((policy, flags))
}

/// `n` ranks at skew `skew`: rank 0 at full speed, the others spread evenly up to `skew`.
fn spread(n: usize, skew: f64) -> Vec<f64> {
    (0..n).map(|i| 1.0 + (skew - 1.0) * i as f64 / (n - 1).max(1) as f64).collect()
}

fn factors(f: &[f64]) -> String {
    f.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(",")
}

/// One finished run: samples per second of training and each rank's time shares
/// (waiting, reduce, exchange, data) of its training wall.
struct Figures {
    throughput: f64,
    shares: Vec<[f64; 4]>,
    /// The last epoch's mean training loss, the test accuracy (%) and the reduces.
    loss: f64,
    accuracy: f64,
    syncs: u64,
}

fn figures(dir: &Path) -> Result<Figures> {
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json"))?)?;
    let wall = s["train_wall_s"].as_f64().ok_or("no train_wall_s")?;
    let ranks = s["ranks"].as_array().ok_or("no ranks")?;
    let samples: f64 = ranks.iter().filter_map(|r| r["samples"].as_f64()).sum();
    let shares = ranks
        .iter()
        .map(|r| {
            let t = &r["time"];
            let ms = |k: &str| t[k].as_f64().unwrap_or(0.0);
            let total = t.as_object().map_or(0.0, |m| m.values().filter_map(|v| v.as_f64()).sum());
            let of = |k: &str| 100.0 * ms(k) / total.max(1e-9);
            [of("waiting_ms"), of("reduce_ms"), of("exchange_ms"), of("data_ms")]
        })
        .collect();
    let loss = s["final_train_loss"].as_f64().unwrap_or(f64::NAN);
    let accuracy = 100.0 * s["test"]["accuracy"].as_f64().unwrap_or(f64::NAN);
    let syncs = s["syncs"].as_u64().unwrap_or(0);
    Ok(Figures { throughput: samples / wall, shares, loss, accuracy, syncs })
}

/// Starts `fdl ARGS --out DIR --quiet` with the extra flags.
fn start(fdl: &Path, args: &[String], extra: &[String], out: &Path) -> Result<Child> {
    Ok(Command::new(fdl)
        .args(args)
        .arg("--quiet")
        .args(extra)
        .arg("--out")
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?)
}

fn finish(child: Child, what: &str, out: &Path) -> Result<Figures> {
    let run = child.wait_with_output()?;
    if !run.status.success() {
        return Err(format!(
            "{what}: fdl {}: {}\n{}",
            run.status,
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        )
        .into());
    }
    figures(out)
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// The median of `v` (NaN when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The training samples of a run with these extra flags (`--train-subset`, else MNIST's 60k).
fn train_samples(extra: &[String]) -> usize {
    extra
        .iter()
        .position(|a| a == "--train-subset")
        .and_then(|i| extra.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(60_000)
}

/// One repeat's figures of a row: aggregate / co-run, aggregate / solo sum, co-run / solo sum,
/// the fast and the slowest rank's shares.
type Cell = (f64, f64, f64, [f64; 4], [f64; 4]);

/// A measured row: (ranks, skew, policy, placement) and its figures per repeat.
type Row = ((usize, f64, String, &'static str), Vec<Cell>);

fn main() -> Result {
    let args = parse()?;
    let fdl = fdl()?;
    let tmp = tempfile::tempdir()?;
    let mut rows: Vec<Row> = Vec::new();
    let mut seq = 0usize;
    let mut dir = |name: &str| {
        seq += 1;
        tmp.path().join(format!("{seq}-{name}"))
    };
    let common = strings(&["--backend", &args.backend, "--batch-size", "64"]);
    for repeat in 0..args.repeats {
        println!("-- repeat {}/{}", repeat + 1, args.repeats);
        let mut solos: Vec<(f64, f64)> = Vec::new();
        for &n in &args.ranks {
            for &skew in &args.skews {
                let slowdown = spread(n, skew);
                let mut solo = Vec::new();
                for &f in &slowdown {
                    let rate = match solos.iter().find(|(g, _)| *g == f) {
                        Some(&(_, rate)) => rate,
                        None => {
                            let out = dir("solo");
                            let mut a = strings(&["train", "--ranks", "1", "--policy", "sync"]);
                            a.extend(common.clone());
                            a.extend(strings(&["--slowdown", &format!("{f:.3}")]));
                            let rate = finish(start(&fdl, &a, &args.extra, &out)?, "solo", &out)?
                                .throughput;
                            println!("solo x{f:.2}: {rate:.0} samples/s");
                            solos.push((f, rate));
                            rate
                        }
                    };
                    solo.push(rate);
                }
                let solo_sum: f64 = solo.iter().sum();
                // The co-run: the ranks as single-rank processes side by side.
                let samples = train_samples(&args.extra);
                let mut children = Vec::new();
                for (&f, &rate) in slowdown.iter().zip(&solo) {
                    let part = ((samples as f64 * rate / solo[0]).round() as usize).max(64);
                    let out = dir("corun");
                    let mut a = strings(&["train", "--ranks", "1", "--policy", "sync"]);
                    a.extend(common.clone());
                    a.extend(strings(&["--slowdown", &format!("{f:.3}")]));
                    // Its share of the samples in place of the extra flags' subset.
                    let mut extra = args.extra.clone();
                    if let Some(i) = extra.iter().position(|a| a == "--train-subset") {
                        extra.drain(i..(i + 2).min(extra.len()));
                    }
                    extra.extend(strings(&["--train-subset", &part.to_string()]));
                    children.push((start(&fdl, &a, &extra, &out)?, out));
                }
                let mut corun = 0.0;
                for (child, out) in children {
                    corun += finish(child, "co-run", &out)?.throughput;
                }
                println!(
                    "{n} ranks x{skew}: solo sum {solo_sum:.0}, co-run ceiling {corun:.0} samples/s"
                );
                for policy in &args.policies {
                    for (placement, how) in [
                        ("in-process", strings(&["train", "--ranks", &n.to_string()])),
                        ("processes", strings(&["launch", "--nproc", &n.to_string()])),
                    ] {
                        let out = dir(placement);
                        let mut a = how;
                        a.extend(common.clone());
                        let (name, flags) = policy_flags(policy)?;
                        a.extend(strings(&["--policy", name, "--slowdown", &factors(&slowdown)]));
                        a.extend(flags);
                        let what = format!("{n} ranks x{skew} {policy} {placement}");
                        let f = finish(start(&fdl, &a, &args.extra, &out)?, &what, &out)?;
                        println!(
                            "{what}: {:.0} samples/s, {:.3} of co-run, {:.3} of the solo sum; {} reduces, final train loss {:.4}, test accuracy {:.2}%; waiting/reduce/exchange/data % per rank {:?}",
                            f.throughput,
                            f.throughput / corun,
                            f.throughput / solo_sum,
                            f.syncs,
                            f.loss,
                            f.accuracy,
                            f.shares
                                .iter()
                                .map(|s| s.map(|x| (x * 10.0).round() / 10.0))
                                .collect::<Vec<_>>()
                        );
                        let key = (n, skew, policy.clone(), placement);
                        let fig = (
                            f.throughput / corun,
                            f.throughput / solo_sum,
                            corun / solo_sum,
                            f.shares.first().copied().unwrap_or_default(),
                            f.shares.last().copied().unwrap_or_default(),
                        );
                        match rows.iter_mut().find(|(k, _)| *k == key) {
                            Some((_, v)) => v.push(fig),
                            None => rows.push((key, vec![fig])),
                        }
                    }
                }
            }
        }
    }
    println!(
        "\n| ranks | skew | policy | placement | aggregate / co-run | aggregate / solo sum | co-run / solo sum | fast rank waiting / reduce / exchange % | slowest rank waiting / reduce / exchange % |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for ((n, skew, policy, placement), v) in &rows {
        let med = |f: &dyn Fn(&Cell) -> f64| median(v.iter().map(f).collect());
        println!(
            "| {n} | {skew}x | {policy} | {placement} | {:.3} | {:.3} | {:.3} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} / {:.1} |",
            med(&|x| x.0),
            med(&|x| x.1),
            med(&|x| x.2),
            med(&|x| x.3[0]),
            med(&|x| x.3[1]),
            med(&|x| x.3[2]),
            med(&|x| x.4[0]),
            med(&|x| x.4[1]),
            med(&|x| x.4[2]),
        );
    }
    if let Some(change) = &args.speed_change {
        mixed(&fdl, &args, change, &common, tmp.path())?;
    }
    Ok(())
}

/// The mixed job as rank processes: the first rank count and skew, each policy, with the speed
/// change; prints each window's plan (the reduce records of `metrics.jsonl`).
fn mixed(fdl: &Path, args: &Args, change: &str, common: &[String], tmp: &Path) -> Result {
    let n = args.ranks[0];
    let slowdown = spread(n, args.skews[0]);
    for policy in &args.policies {
        let out = tmp.join(format!("mixed-{policy}"));
        let mut a = strings(&["launch", "--nproc", &n.to_string()]);
        a.extend(common.iter().cloned());
        a.extend(strings(&["--policy", policy, "--slowdown", &factors(&slowdown)]));
        a.extend(strings(&["--speed-change", change]));
        let what = format!("mixed {n} processes {policy} [{change}]");
        let f = finish(start(fdl, &a, &args.extra, &out)?, &what, &out)?;
        println!("{what}: {:.0} samples/s", f.throughput);
        let text = std::fs::read_to_string(out.join("metrics.jsonl"))?;
        let plans: Vec<String> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| {
                let r = v.get("reduce").unwrap_or(&v);
                let counts = r.get("counts")?.as_array()?;
                let steps: u64 =
                    r.get("steps")?.as_array()?.iter().filter_map(|s| s.as_u64()).sum();
                Some(format!(
                    "{:?}:{steps}",
                    counts.iter().filter_map(|c| c.as_u64()).collect::<Vec<_>>()
                ))
            })
            .collect();
        println!("    plans per window (counts:steps trained): {}", plans.join(" "));
    }
    Ok(())
}

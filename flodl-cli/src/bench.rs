//! `fdl bench`: the A/B matrix — solo per device, then every policy × backend — on one seed.

use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result};
use flodl_data::Eviction;
use flodl_ddp::{Activity, Backend, CacheTally, Policy, Staging, TimeBreakdown};
use serde::{Deserialize, Serialize};

use crate::args::{BenchArgs, RunFlags};
use crate::config::{self, TrainConfig};
use crate::progress::Display;
use crate::record::Entry;
use crate::report;
use crate::run_dir::{self, RunDir};
use crate::train::{self, Data, Outcome};

/// One row of the bench table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Row {
    /// `solo-<rank> (<device>)` or `<backend>-<policy>`.
    pub(crate) mode: String,
    /// Device of each rank.
    pub(crate) devices: Vec<String>,
    /// Mean training loss of the last epoch.
    pub(crate) loss: Option<f64>,
    /// Test accuracy after the last epoch, in [0, 1].
    pub(crate) eval_accuracy: Option<f64>,
    /// Training wall time in seconds (first batch to last epoch done).
    pub(crate) wall_s: f64,
    /// Reduces performed.
    pub(crate) syncs: u64,
    /// Mean reduce time in milliseconds.
    pub(crate) avg_sync_ms: Option<f64>,
    /// Per rank: where its training wall time went (all epochs summed).
    pub(crate) time: Vec<TimeBreakdown>,
    /// Samples trained per second of training wall, all ranks together.
    #[serde(default)]
    pub(crate) samples_per_s: f64,
    /// Per rank: its staging cache's hit ratio over the run, when it staged.
    #[serde(default)]
    pub(crate) hit_ratio: Vec<Option<f64>>,
}

/// `bench.json`: the configuration and the rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct BenchReport {
    /// Start time, UTC, RFC 3339.
    pub(crate) started_at: String,
    /// The shared configuration of every row.
    pub(crate) config: TrainConfig,
    /// The rows, solo runs first.
    pub(crate) rows: Vec<Row>,
}

/// `fdl bench`.
///
/// # Errors
/// Bad configuration, missing data, an unwritable output directory, a failed run.
pub(crate) fn run(args: &BenchArgs) -> Result<()> {
    let (cfg, _) = config::resolve(&args.flags, &RunFlags::default())?;
    // Solo modes renumber the ranks, and a table of runs that lose ranks compares nothing.
    anyhow::ensure!(cfg.fail_rank().is_empty(), "fail-rank is for fdl train, not fdl bench");
    // Every mode evaluates once, at the end, on the test set, and saves nothing.
    let train_only = [
        ("eval-every", cfg.run.eval_every.is_some() && args.flags.settings.eval_every.is_some()),
        ("checkpoint-dir", cfg.run.checkpoint_dir.is_some()),
        ("train-eval", cfg.local.train_eval.is_some()),
    ];
    if let Some((key, _)) = train_only.iter().find(|(_, given)| *given) {
        anyhow::bail!("{key} is for fdl train, not fdl bench");
    }
    let devices = cfg.devices()?;
    let data = Data::load(&cfg)?;
    // Checked before anything is written: the library's rules, in the flags' names.
    train::trainer(&cfg, &devices, &data, None)?
        .spec()
        .map_err(|e| train::explain(e, &cfg, None))?;
    let (started_at, stamp) = run_dir::utc_now();
    let out =
        args.out.clone().unwrap_or_else(|| PathBuf::from("runs").join(format!("bench-{stamp}")));
    fs::create_dir_all(&out)
        .with_context(|| format!("cannot create output directory {}", out.display()))?;
    let display = Display::detect(args.quiet);

    let mut modes: Vec<(String, TrainConfig)> = Vec::new();
    if !args.no_solo {
        for (rank, device) in devices.iter().enumerate() {
            let mut solo = cfg.clone();
            solo.run.slowdown =
                Some(cfg.slowdown().get(rank).map(|f| vec![*f]).unwrap_or_default());
            (solo.run.ranks, solo.run.devices) = (None, Some(vec![*device]));
            modes.push((format!("solo-{rank} ({device})"), solo));
        }
    }
    if args.staging_ab {
        let Some(Staging::Budget { bytes, .. }) = cfg.run.staging else {
            anyhow::bail!("--staging-ab needs a --staging budget, such as --staging 64M");
        };
        for (name, staging) in [
            ("staging-off", Staging::Off),
            ("staging-next-use", Staging::Budget { bytes, eviction: Eviction::NextUse }),
            ("staging-lru", Staging::Budget { bytes, eviction: Eviction::Lru }),
        ] {
            let mut mode_cfg = cfg.clone();
            (mode_cfg.run.ranks, mode_cfg.run.devices) = (None, Some(devices.clone()));
            mode_cfg.run.staging = Some(staging);
            modes.push((name.to_owned(), mode_cfg));
        }
    } else {
        for policy in Policy::ALL {
            for backend in Backend::ALL {
                let mut mode_cfg = cfg.clone();
                (mode_cfg.run.ranks, mode_cfg.run.devices) = (None, Some(devices.clone()));
                (mode_cfg.run.policy, mode_cfg.run.backend) = (Some(policy), Some(backend));
                modes.push((format!("{backend}-{policy}"), mode_cfg));
            }
        }
    }

    let mut rows = Vec::new();
    let count = modes.len();
    for (i, (mode, mut mode_cfg)) in modes.into_iter().enumerate() {
        if display != Display::Silent {
            println!("[{}/{count}] {mode} ...", i + 1);
        }
        // Each mode gets a run directory of its own (metrics, summary, report).
        let slug: String = mode
            .chars()
            .filter_map(|c| match c {
                'a'..='z' | '0'..='9' | '-' => Some(c),
                ' ' | ':' => Some('-'),
                _ => None,
            })
            .collect();
        let mut dir = RunDir::create(&out.join(&slug))?;
        // Only the last epoch is evaluated: the table compares end states.
        mode_cfg.run.eval_every = mode_cfg.run.epochs;
        let opts = RunFlags { out: Some(dir.path().to_owned()), ..RunFlags::default() };
        let outcome = (|| {
            let trainer = train::trainer(&mode_cfg, &mode_cfg.devices()?, &data, None)?;
            let spec = trainer.spec()?;
            train::execute(trainer, spec, None, Display::Silent, |l| dir.append(l))
        })()
        .with_context(|| format!("bench mode {mode}"))?;
        let summary = train::summarise(slug, started_at.clone(), &mode_cfg, &opts, &outcome);
        dir.write_summary(&summary)?;
        run_dir::write_report(dir.path(), &report::render(&summary, &outcome.lines))?;
        let row = row(mode, &outcome);
        if display != Display::Silent {
            println!("      {}", row_summary(&row));
        }
        rows.push(row);
    }

    let report = BenchReport { started_at, config: cfg, rows };
    let table = markdown(&report);
    let md = out.join("bench.md");
    fs::write(&md, &table).with_context(|| format!("cannot write {}", md.display()))?;
    let json = out.join("bench.json");
    fs::write(&json, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("cannot write {}", json.display()))?;
    println!("{table}");
    println!("bench: {} and {}", md.display(), json.display());
    Ok(())
}

fn row(mode: String, outcome: &Outcome) -> Row {
    let state = &outcome.state;
    let sync: Vec<f64> = outcome
        .lines
        .iter()
        .filter_map(|l| match &l.entry {
            Entry::Reduce(r) => Some(r.sync_ms),
            Entry::Epoch(_) | Entry::Fault(_) | Entry::Rejoin(_) | Entry::Guard(_) => None,
        })
        .collect();
    let (time, hit_ratio) = (0..outcome.spec.world())
        .map(|rank| {
            let mut t = TimeBreakdown::default();
            let mut cache: Option<CacheTally> = None;
            for r in state.epochs.iter().filter_map(|e| e.ranks.get(rank)) {
                t.merge(&r.time);
                if let Some(c) = &r.cache {
                    cache.get_or_insert_with(CacheTally::default).merge(c);
                }
            }
            (t, cache.map(|c| c.hit_ratio()))
        })
        .unzip();
    let samples: usize = state.epochs.iter().map(|e| e.samples).sum();
    Row {
        mode,
        devices: outcome.spec.devices.iter().map(ToString::to_string).collect(),
        loss: state.epochs.last().map(|e| e.avg_loss),
        eval_accuracy: state.final_eval().map(|v| v.accuracy),
        wall_s: state.train_ms / 1000.0,
        syncs: state.reduces,
        avg_sync_ms: (!sync.is_empty()).then(|| sync.iter().sum::<f64>() / sync.len() as f64),
        time,
        samples_per_s: if state.train_ms > 0.0 {
            samples as f64 * 1000.0 / state.train_ms
        } else {
            0.0
        },
        hit_ratio,
    }
}

fn row_summary(row: &Row) -> String {
    format!(
        "loss {}  eval {}  wall {:.1} s  {:.0} samples/s  syncs {}",
        opt(row.loss, |l| format!("{l:.4}")),
        opt(row.eval_accuracy, |a| format!("{:.2}%", a * 100.0)),
        row.wall_s,
        row.samples_per_s,
        row.syncs
    )
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "–".to_owned(), f)
}

/// The bench table in Markdown, with a line saying what was run.
pub(crate) fn markdown(report: &BenchReport) -> String {
    let c = &report.config;
    let mut out = String::new();
    let slowdown = if c.slowdown().is_empty() {
        "none".to_owned()
    } else {
        c.slowdown().iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    };
    let shown = |v: Option<String>| v.unwrap_or_else(|| "default".to_owned());
    let r = &c.run;
    let _ = writeln!(
        out,
        "fdl bench, {}: {} epochs, batch {}, lr {} ({}), seed {}, slowdown {slowdown}\n",
        report.started_at,
        shown(r.epochs.map(|v| v.to_string())),
        shown(r.batch_size.map(|v| v.to_string())),
        shown(r.lr.map(|v| v.to_string())),
        shown(r.schedule.map(|v| v.to_string())),
        shown(r.seed.map(|v| v.to_string()))
    );
    out.push_str("| mode | loss | eval | wall (s) | samples/s | syncs | avg sync (ms) |");
    for a in Activity::ALL {
        let _ = write!(out, " {a} |");
    }
    out.push_str(" cache hit ratio |");
    out.push_str("\n|---|---|---|---|---|---|---|");
    out.push_str(&"---|".repeat(Activity::ALL.len() + 1));
    out.push('\n');
    for r in &report.rows {
        let _ = write!(
            out,
            "| {} | {} | {} | {:.1} | {:.0} | {} | {} |",
            r.mode,
            opt(r.loss, |l| format!("{l:.4}")),
            opt(r.eval_accuracy, |a| format!("{:.2}%", a * 100.0)),
            r.wall_s,
            r.samples_per_s,
            r.syncs,
            opt(r.avg_sync_ms, |m| format!("{m:.2}")),
        );
        for a in Activity::ALL {
            let shares: Vec<String> =
                r.time.iter().map(|t| format!("{:.1}%", t.share(a) * 100.0)).collect();
            let _ = write!(out, " {} |", shares.join(" / "));
        }
        let hits: Vec<String> =
            r.hit_ratio.iter().map(|h| opt(*h, |h| format!("{:.1}%", h * 100.0))).collect();
        let hits = if hits.is_empty() { "–".to_owned() } else { hits.join(" / ") };
        let _ = write!(out, " {hits} |");
        out.push('\n');
    }
    out.push_str(
        "\nActivity and hit-ratio columns: per rank (rank 0 / rank 1 / ...); an activity's share of \
         the rank's training wall (data: starved for data). samples/s: all ranks over the wall.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_has_a_header_and_one_line_per_row() {
        let row = |mode: &str, syncs| Row {
            mode: mode.into(),
            devices: vec!["cpu".into(); 2],
            loss: Some(0.25),
            eval_accuracy: Some(0.975),
            wall_s: 12.345,
            syncs,
            avg_sync_ms: (syncs > 0).then_some(1.5),
            time: [[9.0, 1.0], [6.0, 2.0]]
                .iter()
                .map(|[compute, waiting]| {
                    let mut t = TimeBreakdown::default();
                    t.add(Activity::Compute, *compute);
                    t.add(Activity::Waiting, *waiting);
                    t
                })
                .collect(),
            samples_per_s: 1234.4,
            hit_ratio: vec![None, Some(0.5)],
        };
        let report = BenchReport {
            started_at: "2026-01-01T00:00:00Z".into(),
            config: config::defaults(),
            rows: vec![row("solo-0 (cpu)", 0), row("collective-sync", 100)],
        };
        let md = markdown(&report);
        let table: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(table.len(), 4);
        assert!(table.iter().all(|l| l.matches('|').count() == 17));
        assert!(table[2].contains("97.50%") && table[2].contains("| – |"));
        // compute, data, reduce, exchange, waiting: rank 0 9 of 10 ms computing, rank 1 6 of 8.
        assert!(
            table[3].contains(
                "| 1234 | 100 | 1.50 | 90.0% / 75.0% | 0.0% / 0.0% | 0.0% / 0.0% | 0.0% / 0.0% \
                 | 10.0% / 25.0% |"
            ),
            "{}",
            table[3]
        );
    }
}

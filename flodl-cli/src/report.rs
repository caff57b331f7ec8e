//! The self-contained `report.html` of a run: key figures, tables and inline SVG charts.

use std::fmt::Write as _;

use std::path::Path;

use flodl_ddp::{Activity, EpochMetrics, FaultEvent, ReduceEvent, Straggler, Verdict};

use crate::chart::{LineChart, Series, Style, escape};
use crate::record::{Entry, Line, Summary};
use crate::swimlane::{colour, swimlane};

/// An epoch with the time it ended, in seconds since training started, and whether it was
/// restored from a checkpoint.
pub(crate) type TimedEpoch<'a> = (f64, &'a EpochMetrics, bool);

/// A reduce with the time it completed, in seconds since training started.
pub(crate) type TimedReduce<'a> = (f64, &'a ReduceEvent);

/// A run's epochs and reduces on one time axis, as the charts and tables show them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Timeline<'a> {
    /// Epochs in order, restored ones first.
    pub(crate) epochs: Vec<TimedEpoch<'a>>,
    /// Reduces in order.
    pub(crate) reduces: Vec<TimedReduce<'a>>,
    /// The divergence guard's verdicts other than `Stable`, with their reduce's time and anchor.
    pub(crate) held: Vec<(f64, usize, Verdict)>,
}

impl<'a> Timeline<'a> {
    /// The timeline of a run's records.
    ///
    /// Epochs restored from a checkpoint come first, at the times their own run took (from
    /// their durations); the times of this run's reports are shifted past them.
    pub(crate) fn of(lines: &'a [Line]) -> Self {
        let restored_s: f64 = lines
            .iter()
            .filter(|l| l.restored)
            .filter_map(|l| match &l.entry {
                Entry::Epoch(e) => Some(e.epoch_ms / 1000.0),
                Entry::Reduce(_) | Entry::Fault(_) | Entry::Rejoin(_) | Entry::Guard(_) => None,
            })
            .sum();
        let mut timeline = Timeline::default();
        let mut cumulative_s = 0.0;
        for line in lines {
            let shifted = line.time_s().map(|t| t + restored_s);
            match &line.entry {
                Entry::Epoch(e) => {
                    cumulative_s += e.epoch_ms / 1000.0;
                    let t = if line.restored { None } else { shifted };
                    timeline.epochs.push((t.unwrap_or(cumulative_s), e, line.restored));
                }
                Entry::Reduce(r) => timeline.reduces.push((shifted.unwrap_or(cumulative_s), r)),
                // Deaths are listed in their own table; the guard's verdicts are placed below.
                Entry::Fault(_) | Entry::Rejoin(_) | Entry::Guard(_) => {}
            }
        }
        // A verdict is marked at its reduce (whose line may follow the guard's).
        for line in lines {
            if let Entry::Guard(g) = &line.entry
                && g.verdict != Verdict::Stable
                && let Some((t, r)) = timeline.reduces.iter().find(|(_, r)| r.round == g.round)
            {
                timeline.held.push((*t, r.anchor, g.verdict));
            }
        }
        timeline
    }
}

impl Timeline<'_> {
    /// The same timeline with at most `max` reduces, evenly picked (the newest always kept):
    /// a long run's live charts stay light to render and to send.
    pub(crate) fn thinned(mut self, max: usize) -> Self {
        let n = self.reduces.len();
        if n > max && max > 0 {
            let stride = n.div_ceil(max);
            let last = n - 1;
            let mut i = 0;
            self.reduces.retain(|_| {
                let keep = (last - i).is_multiple_of(stride);
                i += 1;
                keep
            });
        }
        self
    }
}

/// Renders the report of one run.
pub(crate) fn render(summary: &Summary, lines: &[Line]) -> String {
    let timeline = Timeline::of(lines);
    let mut html = String::new();
    let title = format!("fdl run {}", summary.name);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{}</style></head><body>",
        escape(&title),
        CSS
    );
    let _ = write!(html, "<h1>{}</h1>", escape(&title));
    let _ = write!(
        html,
        "<p class=\"meta\">started {} · fdl {} · {} rank(s): {}</p>",
        escape(&summary.started_at),
        escape(&summary.fdl_version),
        summary.devices.len(),
        escape(&summary.devices.join(", "))
    );
    key_figures(&mut html, summary);
    rank_table(&mut html, summary);
    held_back(&mut html, summary);
    activity_section(&mut html, summary, &timeline);
    chart_section(&mut html, &summary.devices, &timeline);
    epoch_table(&mut html, &timeline.epochs);
    data_table(&mut html, &timeline.epochs);
    resume_note(&mut html, summary.resumed_from.as_deref(), summary.epochs_restored);
    fault_table(&mut html, &summary.faults);
    config_table(&mut html, summary);
    html.push_str("</body></html>\n");
    html
}

/// Renders the report of a run that ended without its `summary.json` (stopped by a signal or a
/// crash): what its `metrics.jsonl` holds, under a line saying the run did not finish. `name`
/// is the run directory's name; the devices come from the epoch reports.
pub(crate) fn render_unfinished(name: &str, lines: &[Line]) -> String {
    let timeline = Timeline::of(lines);
    let mut devices: Vec<String> = Vec::new();
    for (_, e, _) in &timeline.epochs {
        for r in &e.ranks {
            if devices.len() <= r.rank {
                devices.resize(r.rank + 1, String::new());
            }
            if devices[r.rank].is_empty() {
                devices[r.rank].clone_from(&r.device);
            }
        }
    }
    let faults: Vec<FaultEvent> = lines
        .iter()
        .filter_map(|l| match &l.entry {
            Entry::Fault(f) => Some(f.clone()),
            Entry::Epoch(_) | Entry::Reduce(_) | Entry::Rejoin(_) | Entry::Guard(_) => None,
        })
        .collect();
    let mut html = String::new();
    let title = format!("fdl run {name} (unfinished)");
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{}</style></head><body>",
        escape(&title),
        CSS
    );
    let _ = write!(html, "<h1>{}</h1>", escape(&title));
    let _ = write!(
        html,
        "<p class=\"meta\">The run ended before it wrote its summary (stopped by a signal or a \
         crash): this is what its metrics.jsonl holds, {} epoch(s) and {} reduce(s) on {} \
         rank(s).</p>",
        timeline.epochs.len(),
        timeline.reduces.len(),
        devices.len()
    );
    chart_section(&mut html, &devices, &timeline);
    epoch_table(&mut html, &timeline.epochs);
    data_table(&mut html, &timeline.epochs);
    fault_table(&mut html, &faults);
    html.push_str("</body></html>\n");
    html
}

/// The per-rank swimlane of what each rank was doing over the run, with the reduces as ticks.
fn activity_section(html: &mut String, summary: &Summary, timeline: &Timeline<'_>) {
    let lanes: Vec<(f64, &EpochMetrics)> = timeline
        .epochs
        .iter()
        .filter(|(_, _, restored)| !restored)
        .map(|(t, e, _)| (*t, *e))
        .collect();
    let first = lanes.first().map_or(0.0, |(t, e)| t - e.epoch_ms / 1000.0).max(0.0);
    let lanes: Vec<(f64, &EpochMetrics)> = lanes.iter().map(|(t, e)| (t - first, *e)).collect();
    let ticks: Vec<f64> = timeline.reduces.iter().map(|(t, _)| t - first).collect();
    let names: Vec<String> = (0..summary.devices.len().max(summary.ranks.len()))
        .map(|r| match summary.devices.get(r) {
            Some(d) => format!("rank {r} ({d})"),
            None => format!("rank {r}"),
        })
        .collect();
    let _ = write!(
        html,
        "<h2>Rank activity</h2><figure class=\"wide\">{}</figure>",
        swimlane(&lanes, &ticks, &names)
    );
}

/// The style sheet of the report (and of the live dashboard).
pub(crate) const CSS: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1200px}\
h1{font-size:22px}h2{font-size:17px;margin-top:28px}.meta{color:#555}\
.figures{display:flex;flex-wrap:wrap;gap:12px}.figure{border:1px solid #ddd;border-radius:6px;padding:8px 14px}\
.figure b{display:block;font-size:20px}.figure span{color:#666;font-size:12px}\
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}\
th{background:#f4f4f4}td.l,th.l{text-align:left}\
.charts{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0;border:1px solid #eee}\
figure.wide{display:inline-block}.swatch{display:inline-block;width:10px;height:10px;margin-right:4px}";

fn key_figures(html: &mut String, s: &Summary) {
    let acc = s.test.map_or("–".to_owned(), |t| format!("{:.2}%", t.accuracy * 100.0));
    let test_loss = s.test.map_or("–".to_owned(), |t| format!("{:.4}", t.loss));
    let train_loss = s.final_train_loss.map_or("–".to_owned(), |l| format!("{l:.4}"));
    let avg_sync = s.avg_sync_ms.map_or("–".to_owned(), |m| format!("{m:.2} ms"));
    let mut figures = vec![
        ("test accuracy", acc),
        ("test loss", test_loss),
        ("final train loss", train_loss),
        ("training wall", format!("{:.1} s", s.train_wall_s)),
        ("epochs", s.epochs_completed.to_string()),
        ("syncs", s.syncs.to_string()),
        ("average sync", avg_sync),
        (
            "policy / backend",
            format!("{} / {}", text(&s.config["policy"]), text(&s.config["backend"])),
        ),
    ];
    if let Some(t) = s.train_eval {
        figures.insert(3, ("returned model's train loss", format!("{:.4}", t.loss)));
    }
    figure_cards(html, &figures);
}

/// A row of key figures: each value in large type over its label.
pub(crate) fn figure_cards(html: &mut String, figures: &[(&str, String)]) {
    html.push_str("<div class=\"figures\">");
    for (label, value) in figures {
        let _ = write!(
            html,
            "<div class=\"figure\"><b>{}</b><span>{}</span></div>",
            escape(value),
            escape(label)
        );
    }
    html.push_str("</div>");
}

/// A byte count in B, KB, MB or GB (powers of 1000).
pub(crate) fn bytes(b: f64) -> String {
    match b {
        b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.2} MB", b / 1e6),
        b if b >= 1e3 => format!("{:.1} KB", b / 1e3),
        b => format!("{b:.0} B"),
    }
}

fn rank_table(html: &mut String, s: &Summary) {
    html.push_str("<h2>Ranks</h2><table><tr><th>rank</th><th class=\"l\">device</th><th>slowdown</th><th>samples</th><th>samples/s</th><th>share</th>");
    for a in Activity::ALL {
        let _ = write!(
            html,
            "<th><span class=\"swatch\" style=\"background:{}\"></span>{a}</th>",
            colour(a)
        );
    }
    html.push_str("<th>sent/reduce</th><th>received/reduce</th></tr>");
    for r in &s.ranks {
        let slowdown = s.config["slowdown"].get(r.rank).map_or("1".to_owned(), text);
        let _ = write!(
            html,
            "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{:.1}%</td>",
            r.rank,
            escape(&r.device),
            escape(&slowdown),
            r.samples,
            r.samples_per_s,
            r.share * 100.0,
        );
        for a in Activity::ALL {
            if r.time.wall_ms() > 0.0 {
                let _ = write!(html, "<td>{:.1}%</td>", r.time.share(a) * 100.0);
            } else {
                html.push_str("<td>–</td>");
            }
        }
        let _ = match r.wire {
            Some(w) => write!(
                html,
                "<td>{}</td><td>{}</td>",
                bytes(w.sent_per_reduce),
                bytes(w.received_per_reduce)
            ),
            None => write!(html, "<td>–</td><td>–</td>"),
        };
        html.push_str("</tr>");
    }
    html.push_str("</table><p class=\"meta\">Per rank: the share of its training wall time spent in each activity, and the bytes of its snapshot and of its consensus update per reduce on the wire (– in memory).</p>");
}

/// The sentence naming the rank that held the run back most, and why.
fn held_back(html: &mut String, s: &Summary) {
    let Some(Straggler { rank, activity, share, others_waiting }) = s.held_back else { return };
    let device = s.devices.get(rank).map_or(String::new(), |d| format!(" ({d})"));
    let why = match activity {
        Activity::Compute => {
            format!("it is the slowest at computing ({:.1}% of its wall)", share * 100.0)
        }
        a => format!("it lost {:.1}% of its wall to {a}", share * 100.0),
    };
    let _ = write!(
        html,
        "<p class=\"held\">Held the run back most: <b>rank {rank}{}</b>: {}; the other ranks waited up to {:.1}% of theirs.</p>",
        escape(&device),
        escape(&why),
        others_waiting * 100.0
    );
}

/// The table of epochs: time, duration, losses, accuracy.
pub(crate) fn epoch_table(html: &mut String, epochs: &[TimedEpoch<'_>]) {
    html.push_str("<h2>Epochs</h2><table><tr><th>epoch</th><th>t (s)</th><th>epoch (ms)</th><th>train loss</th><th>test loss</th><th>test accuracy</th></tr>");
    for (t, e, restored) in epochs {
        let (tl, ta) = e.eval.map_or(("–".to_owned(), "–".to_owned()), |v| {
            (format!("{:.4}", v.loss), format!("{:.2}%", v.accuracy * 100.0))
        });
        let mark = if *restored { " (restored)" } else { "" };
        let _ = write!(
            html,
            "<tr><td>{}{mark}</td><td>{:.2}</td><td>{:.0}</td><td>{:.4}</td><td>{}</td><td>{}</td></tr>",
            e.epoch + 1,
            t,
            e.epoch_ms,
            e.avg_loss,
            tl,
            ta
        );
    }
    html.push_str("</table>");
}

/// The data plane per epoch and rank: time starved for data (and its share of the rank's wall)
/// and, when the rank staged its data, its cache's hit ratio. Nothing when no rank waited for
/// data nor staged.
pub(crate) fn data_table(html: &mut String, epochs: &[TimedEpoch<'_>]) {
    let shown = epochs
        .iter()
        .flat_map(|(_, e, _)| &e.ranks)
        .any(|r| r.data_starve_ms > 0.0 || r.cache.is_some());
    if !shown {
        return;
    }
    html.push_str("<h2>Data plane</h2><table><tr><th>epoch</th><th>rank</th><th>data-starve (ms)</th><th>share of wall</th><th>cache hit ratio</th></tr>");
    for (_, e, _) in epochs {
        for r in &e.ranks {
            let wall = r.time.wall_ms();
            let share = if wall > 0.0 {
                format!("{:.1}%", 100.0 * r.data_starve_ms / wall)
            } else {
                "–".into()
            };
            let hits = r.hit_ratio.map_or("–".to_owned(), |h| format!("{:.1}%", 100.0 * h));
            let _ = write!(
                html,
                "<tr><td>{}</td><td>{}</td><td>{:.0}</td><td>{share}</td><td>{hits}</td></tr>",
                e.epoch + 1,
                r.rank,
                r.data_starve_ms,
            );
        }
    }
    html.push_str("</table>");
}

/// A line naming the bundle the run resumed from, when it did.
pub(crate) fn resume_note(html: &mut String, resumed_from: Option<&Path>, restored: usize) {
    if let Some(path) = resumed_from {
        let _ = write!(
            html,
            "<p>Resumed from <code>{}</code>: {restored} epoch(s) restored.</p>",
            escape(&path.display().to_string()),
        );
    }
}

/// The table of rank deaths (nothing when none died).
pub(crate) fn fault_table(html: &mut String, faults: &[FaultEvent]) {
    if faults.is_empty() {
        return;
    }
    html.push_str("<h2>Rank deaths</h2><table><tr><th>rank</th><th>t (s)</th><th class=\"l\">cause</th><th class=\"l\">survivors</th></tr>");
    for f in faults {
        let survivors: Vec<String> = f.survivors.iter().map(ToString::to_string).collect();
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{:.2}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
            f.rank,
            f.at_ms / 1000.0,
            escape(&f.cause.to_string()),
            escape(&survivors.join(", "))
        );
    }
    html.push_str("</table>");
}

/// A value of the configuration as the flag would spell it (a string without its quotes).
fn text(value: &serde_json::Value) -> String {
    value.as_str().map_or_else(|| value.to_string(), str::to_owned)
}

fn config_table(html: &mut String, s: &Summary) {
    html.push_str("<h2>Configuration</h2><table>");
    let mut rows = Vec::new();
    if let Ok(serde_json::Value::Object(map)) = serde_json::to_value(&s.config) {
        rows.extend(map);
    }
    if let Ok(serde_json::Value::Object(map)) = serde_json::to_value(&s.options) {
        rows.extend(map);
    }
    for (key, value) in rows {
        let text = match value {
            serde_json::Value::String(s) => s,
            serde_json::Value::Null => "–".to_owned(),
            other => other.to_string(),
        };
        let _ = write!(
            html,
            "<tr><th class=\"l\">{}</th><td class=\"l\">{}</td></tr>",
            escape(&key),
            escape(&text)
        );
    }
    html.push_str("</table>");
}

/// The charts of a run whose ranks ran on `devices`, as a section of inline SVG figures.
pub(crate) fn chart_section(html: &mut String, devices: &[String], timeline: &Timeline<'_>) {
    html.push_str("<h2>Charts</h2><div class=\"charts\">");
    for chart in charts(devices, timeline) {
        let _ = write!(html, "<figure>{}</figure>", chart.to_svg());
    }
    html.push_str("</div>");
}

/// The report's charts, in display order.
fn charts(devices: &[String], timeline: &Timeline<'_>) -> Vec<LineChart> {
    let (epochs, reduces) = (&timeline.epochs, &timeline.reduces);
    let world = devices.len().max(epochs.iter().map(|(_, e, _)| e.ranks.len()).max().unwrap_or(0));
    let rank_name = |r: usize| match devices.get(r) {
        Some(d) => format!("rank {r} ({d})"),
        None => format!("rank {r}"),
    };

    let train_loss = epochs.iter().map(|(t, e, _)| (*t, e.avg_loss)).collect();
    let test_loss = epochs.iter().filter_map(|(t, e, _)| e.eval.map(|v| (*t, v.loss))).collect();
    let loss = LineChart::new("Loss", "wall time (s)", "loss")
        .series(Series::new("train loss", train_loss, Style::Line))
        .series(Series::new("test loss", test_loss, Style::Line));

    let acc_points = epochs.iter().filter_map(|(t, e, _)| e.eval.map(|v| (*t, v.accuracy * 100.0)));
    let accuracy = LineChart::new("Test accuracy", "wall time (s)", "accuracy (%)")
        .series(Series::new("test accuracy", acc_points.collect(), Style::Line));

    let mut throughput =
        LineChart::new("Per-rank throughput", "wall time (s)", "samples/s").y_from_zero();
    for r in 0..world {
        let pts = epochs
            .iter()
            .filter_map(|(t, e, _)| {
                e.ranks.iter().find(|x| x.rank == r).map(|x| (*t, x.throughput))
            })
            .collect();
        throughput = throughput.series(Series::new(rank_name(r), pts, Style::Line));
    }

    // Batch share per reduce window when there are reduces (finer), else per epoch.
    let mut share =
        LineChart::new("Batch share", "wall time (s)", "share of batches").y_from_zero();
    for r in 0..world {
        let pts: Vec<(f64, f64)> = if reduces.is_empty() {
            epochs
                .iter()
                .filter_map(|(t, e, _)| {
                    e.ranks.iter().find(|x| x.rank == r).map(|x| (*t, x.batch_share))
                })
                .collect()
        } else {
            reduces
                .iter()
                .filter_map(|(t, red)| {
                    let total: usize = red.steps.iter().sum();
                    let mine = *red.steps.get(r)?;
                    (total > 0).then(|| (*t, mine as f64 / total as f64))
                })
                .collect()
        };
        share = share.series(Series::new(rank_name(r), pts, Style::Step));
    }

    let anchor_pts = reduces.iter().map(|(t, r)| (*t, r.anchor as f64)).collect();
    let mut anchor = LineChart::new("ElChe anchor", "wall time (s)", "anchor (batches)")
        .y_from_zero()
        .series(Series::new("anchor", anchor_pts, Style::Step));
    // Why the anchor stopped growing or fell: the guard's verdicts, at their reduce.
    let verdicts = |nudge: bool| -> Vec<(f64, f64)> {
        // `held` has no `Stable` verdict: any other is growth held or a nudge down.
        let marks = timeline
            .held
            .iter()
            .filter(|(_, _, v)| matches!(v, Verdict::NudgeDown { .. }) == nudge);
        marks.map(|(t, a, _)| (*t, *a as f64)).collect()
    };
    for (name, nudge) in [("guard: growth held", false), ("guard: window shrunk", true)] {
        let marks = verdicts(nudge);
        if !marks.is_empty() {
            anchor = anchor.series(Series::new(name, marks, Style::Dots));
        }
    }

    let sync_pts = reduces.iter().map(|(t, r)| (*t, r.sync_ms)).collect();
    let syncs = LineChart::new("Sync events", "wall time (s)", "sync time (ms)")
        .y_from_zero()
        .series(Series::new("reduce", sync_pts, Style::Dots));

    vec![loss, accuracy, throughput, share, anchor, syncs]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RankSummary;
    use flodl_ddp::{EvalMetrics, FaultCause, FaultEvent, RankEpochMetrics, TimeBreakdown};

    /// A rank's epoch: 900 ms computing, and `data` ms fetching (rank 1) or waiting (rank 0).
    fn rank_time(rank: usize, data: f64) -> TimeBreakdown {
        let mut t = TimeBreakdown::default();
        t.add(Activity::Compute, 900.0);
        t.add(if rank == 1 { Activity::Data } else { Activity::Waiting }, data);
        t
    }

    fn sample(epochs: usize, reduces_per_epoch: usize) -> (Summary, Vec<Line>) {
        let mut lines = Vec::new();
        let mut round = 0;
        let eval = |e: usize| EvalMetrics { loss: 0.5 / e as f64, accuracy: 0.9, samples: 10 };
        for e in 1..=epochs {
            for k in 0..reduces_per_epoch {
                round += 1;
                let entry = Entry::Reduce(ReduceEvent {
                    round,
                    epoch: e - 1,
                    at_ms: 1000.0 * (e as f64 - 1.0 + k as f64 / reduces_per_epoch as f64),
                    anchor: 10 + k,
                    counts: vec![10, 25],
                    steps: vec![10, 26],
                    walls_ms: vec![20.0, 52.0],
                    exposed_ms: vec![Some(3.5), None],
                    sync_ms: 1.0 + k as f64,
                    wire: Vec::new(),
                    ordered_ahead: Vec::new(),
                });
                lines.push(Line { entry, t_s: None, restored: false });
            }
            let ranks = (0..2)
                .map(|r| RankEpochMetrics {
                    rank: r,
                    device: "cpu".into(),
                    batches: 10,
                    samples: 100,
                    avg_loss: 1.0,
                    compute_ms: 900.0,
                    throughput: 111.0,
                    batch_share: 0.5,
                    time: rank_time(r, 100.0),
                    data_starve_ms: rank_time(r, 100.0).data_ms,
                    cache: (r == 1).then_some(flodl_ddp::CacheTally { hits: 90, misses: 10 }),
                    hit_ratio: (r == 1).then_some(0.9),
                })
                .collect();
            let entry = Entry::Epoch(EpochMetrics {
                epoch: e - 1,
                avg_loss: 1.0 / e as f64,
                epoch_ms: 1000.0,
                samples: 200,
                throughput: 200.0,
                ranks,
                scalars: Default::default(),
                reduces: reduces_per_epoch,
                sync_ms: 3.0,
                eval: Some(eval(e)),
                at_ms: e as f64 * 1000.0,
            });
            lines.push(Line { entry, t_s: Some(e as f64), restored: false });
        }
        let summary = Summary {
            name: "t<1>".into(),
            fdl_version: "0".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            config: serde_json::to_value(crate::config::defaults()).unwrap_or_default(),
            options: crate::args::RunFlags::default(),
            devices: vec!["cpu".into(), "cpu".into()],
            epochs_completed: epochs,
            train_wall_s: epochs as f64,
            run_wall_s: epochs as f64 + 0.5,
            final_train_loss: Some(0.1),
            test: Some(eval(1)),
            train_eval: None,
            syncs: round,
            avg_sync_ms: Some(1.5),
            ranks: (0..2)
                .map(|r| RankSummary {
                    rank: r,
                    device: "cpu".into(),
                    samples: 100,
                    samples_per_s: 50.0,
                    share: 0.5,
                    idle: Some(0.1),
                    time: rank_time(r, 100.0),
                    data_starve_ms: rank_time(r, 100.0).data_ms,
                    hit_ratio: None,
                    wire: None,
                })
                .collect(),
            held_back: None,
            resumed_from: None,
            epochs_restored: 0,
            checkpoint: None,
            faults: Vec::new(),
            rejoins: Vec::new(),
            spec: None,
        };
        (summary, lines)
    }

    #[test]
    fn report_has_six_charts_and_a_swimlane_with_lines_and_escaped_name() {
        for (epochs, reduces) in [(3, 4), (1, 0), (0, 0)] {
            let (summary, lines) = sample(epochs, reduces);
            let html = render(&summary, &lines);
            assert_eq!(html.matches("<svg").count(), 7, "{epochs}/{reduces}");
            assert_eq!(html.matches("</svg>").count(), 7);
            // Two lanes per epoch, two activities each.
            assert_eq!(html.matches("<title>rank ").count(), 4 * epochs, "{epochs}/{reduces}");
            assert!(html.contains("t&lt;1&gt;") && !html.contains("t<1>"));
            assert!(!html.contains("NaN") && !html.contains("inf"));
            if epochs > 1 && reduces > 0 {
                // loss (2) + accuracy + throughput (2) + share (2) + anchor = 8 polylines.
                assert_eq!(html.matches("<polyline").count(), 8);
            }
        }
    }

    #[test]
    fn metrics_lines_round_trip_with_the_kind_tag() -> Result<(), serde_json::Error> {
        let (_, mut lines) = sample(2, 2);
        let restored = lines.iter().find(|l| matches!(l.entry, Entry::Epoch(_))).cloned();
        if let Some(mut r) = restored {
            (r.t_s, r.restored) = (None, true);
            lines.insert(0, r);
        }
        lines.push(Line { entry: Entry::Fault(death()), t_s: None, restored: false });
        let mut kinds = Vec::new();
        for line in &lines {
            let text = serde_json::to_string(line)?;
            let value: serde_json::Value = serde_json::from_str(&text)?;
            let kind = value["kind"].as_str().unwrap_or_default().to_owned();
            assert!(["epoch", "reduce", "fault"].contains(&kind.as_str()), "{text}");
            let timed = kind == "epoch" && !line.restored;
            assert_eq!(value.get("t_s").is_some(), timed, "{text}");
            assert_eq!(value.get("restored").is_some(), line.restored, "{text}");
            assert_eq!(&serde_json::from_str::<Line>(&text)?, line);
            kinds.push(kind);
        }
        assert_eq!(kinds.first().map(String::as_str), Some("epoch"));
        assert_eq!(kinds.last().map(String::as_str), Some("fault"));
        Ok(())
    }

    #[test]
    fn thinning_keeps_at_most_the_limit_and_the_newest_reduce() {
        for (epochs, per_epoch, max) in [(5, 100, 40), (3, 4, 100), (2, 7, 1), (4, 50, 199)] {
            let (_, lines) = sample(epochs, per_epoch);
            let all = Timeline::of(&lines);
            let newest = all.reduces.last().map(|(_, r)| r.round);
            let thin = Timeline::of(&lines).thinned(max);
            assert!(thin.reduces.len() <= max.max(1), "{epochs}x{per_epoch} -> {max}");
            assert!(thin.reduces.len() >= (epochs * per_epoch).min(max) / 2, "too few");
            assert_eq!(thin.reduces.last().map(|(_, r)| r.round), newest);
            assert_eq!(thin.epochs.len(), all.epochs.len());
        }
    }

    /// The guard's verdicts other than `Stable` are marked on the anchor chart at their reduce's
    /// time and anchor, whichever of the two lines came first; `Stable` ones are not.
    #[test]
    fn guard_verdicts_mark_the_anchor_chart_at_their_reduce() {
        let guard = |round: u64, verdict: Verdict| Line {
            entry: Entry::Guard(flodl_ddp::GuardEvent {
                round,
                divergence: 0.1,
                k_max: 7,
                verdict,
            }),
            t_s: None,
            restored: false,
        };
        let nudge = Verdict::NudgeDown { factor: 0.5 };
        // (round, verdict) lines; the marks (time, anchor); whether each legend shows.
        type Case = (Vec<(u64, Verdict)>, Vec<(f64, usize)>, [bool; 2]);
        let cases: [Case; 3] = [
            (vec![(1, Verdict::Stable), (2, Verdict::Stable)], vec![], [false, false]),
            (vec![(2, Verdict::SuppressGrowth)], vec![(0.25, 11)], [true, false]),
            (
                vec![(3, Verdict::SuppressGrowth), (6, nudge)],
                vec![(0.5, 12), (1.25, 11)],
                [true, true],
            ),
        ];
        for (verdicts, marks, shown) in cases {
            let (summary, mut lines) = sample(2, 4);
            for (i, &(round, verdict)) in verdicts.iter().enumerate() {
                // The first guard line before every reduce, the others at the end.
                let at = if i == 0 { 0 } else { lines.len() };
                lines.insert(at, guard(round, verdict));
            }
            let timeline = Timeline::of(&lines);
            let got: Vec<(f64, usize)> = timeline.held.iter().map(|(t, a, _)| (*t, *a)).collect();
            assert_eq!(got, marks, "{verdicts:?}");
            let html = render(&summary, &lines);
            assert_eq!(html.contains("guard: growth held"), shown[0], "{verdicts:?}");
            assert_eq!(html.contains("guard: window shrunk"), shown[1], "{verdicts:?}");
        }
    }

    /// The report names the rank that held the run back and the activity it lost its time
    /// to (from the summary's ranks, by flodl-ddp's rule), and says nothing without one.
    #[test]
    fn report_names_the_rank_that_held_the_run_back() {
        let (mut summary, lines) = sample(2, 1);
        let times: Vec<TimeBreakdown> = summary.ranks.iter().map(|r| r.time).collect();
        summary.held_back = flodl_ddp::straggler(&times);
        let html = render(&summary, &lines);
        assert!(
            html.contains(
                "Held the run back most: <b>rank 1 (cpu)</b>: it lost 10.0% of its wall to data"
            ),
            "{}",
            html.split("<h2>Rank activity").next().unwrap_or_default()
        );
        summary.held_back = None;
        assert!(!render(&summary, &lines).contains("Held the run back"));
    }

    fn death() -> FaultEvent {
        FaultEvent {
            rank: 1,
            at_ms: 1500.0,
            cause: FaultCause::Failed { error: "<gone>".into() },
            survivors: vec![0],
            requeued_samples: 0,
        }
    }

    /// A resumed run with a death: restored epochs come first and this run's times are shifted
    /// past them (the charts' x values only grow); the deaths table lists the death, escaped.
    #[test]
    fn restored_epochs_precede_and_deaths_are_listed() {
        let (mut summary, mut lines) = sample(2, 1);
        let mut first = lines.clone();
        for l in &mut first {
            l.restored = true;
            l.t_s = None;
        }
        let first: Vec<Line> =
            first.into_iter().filter(|l| matches!(l.entry, Entry::Epoch(_))).collect();
        lines.splice(0..0, first);
        summary.faults = vec![death()];
        summary.resumed_from = Some("ck/latest.fdlck".into());
        summary.epochs_restored = 2;
        let html = render(&summary, &lines);
        assert!(html.contains("Rank deaths") && html.contains("&lt;gone&gt;"));
        assert!(html.contains("<h2>Data plane</h2>") && html.contains("90.0%"), "no data table");
        assert!(html.contains("ck/latest.fdlck") && html.contains("1 (restored)"));
        let times: Vec<f64> = html
            .split("<h2>Epochs</h2>")
            .nth(1)
            .and_then(|rest| rest.split("<h2>").next())
            .unwrap_or_default()
            .split("<tr><td>")
            .skip(1)
            .filter_map(|row| row.split("</td><td>").nth(1)?.parse().ok())
            .collect();
        assert_eq!(times.len(), 4, "{times:?}");
        assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    }
}

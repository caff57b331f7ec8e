//! The dashboard's page: a self-contained HTML document (inline style and script, no external
//! resource) whose live part the server re-renders from the record and pushes over SSE.

use std::fmt::Write as _;

use crate::chart::escape;
use crate::report::{self, Timeline};

use super::live::{Figures, LiveRun, Stage};

/// Reduces drawn in the live charts at most (a long run's are evenly thinned to this many).
const MAX_REDUCES: usize = 2000;

/// The live part of the page: status, key figures, ranks, the report's charts, epochs, deaths.
pub(crate) fn fragment(live: &LiveRun, f: &Figures) -> String {
    let meta = live.meta();
    let mut html = String::new();
    let status = match &f.stage {
        Stage::Running => "running".to_owned(),
        Stage::Ended { ending: super::live::Ending::Completed, .. } => "completed".to_owned(),
        Stage::Ended { ending: super::live::Ending::Failed(why), .. } => format!("failed: {why}"),
    };
    let _ = write!(
        html,
        "<p class=\"meta\" id=\"status\" data-stage=\"{}\"><b>{}</b> · epoch {}/{} · {:.1} s · {} / {} · started {}</p>",
        f.stage.label(),
        escape(&status),
        f.epochs_done,
        meta.epochs,
        f.elapsed_s,
        meta.policy,
        meta.backend,
        escape(&meta.started_at),
    );
    let dash = || "–".to_owned();
    let alive = f.ranks.iter().filter(|r| r.alive).count();
    let figures = [
        ("epochs", format!("{}/{}", f.epochs_done, meta.epochs)),
        ("elapsed", format!("{:.1} s", f.elapsed_s)),
        ("train loss (last epoch)", f.train_loss.map_or_else(dash, |l| format!("{l:.4}"))),
        ("test loss", f.eval.map_or_else(dash, |e| format!("{:.4}", e.loss))),
        ("test accuracy", f.eval.map_or_else(dash, |e| format!("{:.2}%", e.accuracy * 100.0))),
        ("syncs", f.reduces.to_string()),
        (
            "average sync",
            if f.reduces > 0 {
                format!("{:.2} ms", f.sync_ms_total / f.reduces as f64)
            } else {
                dash()
            },
        ),
        ("ElChe anchor", f.last_reduce.as_ref().map_or_else(dash, |r| r.anchor.to_string())),
        ("ranks alive", format!("{alive}/{}", f.ranks.len())),
    ];
    report::figure_cards(&mut html, &figures);

    html.push_str(
        "<h2>Ranks</h2><table id=\"ranks\"><tr><th>rank</th><th class=\"l\">device</th>\
         <th class=\"l\">state</th><th>samples</th><th>samples/s</th><th>compute samples/s</th>\
         <th>share</th><th>window (planned)</th><th>window (trained)</th><th>window share</th>\
         <th>link bytes/s</th></tr>",
    );
    for r in &f.ranks {
        let opt = |v: Option<usize>| v.map_or_else(dash, |v| v.to_string());
        let _ = write!(
            html,
            "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l {}\">{}</td><td>{}</td><td>{:.0}</td><td>{}</td><td>{:.1}%</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            r.rank,
            escape(&r.device),
            if r.alive { "alive" } else { "dead" },
            if r.alive { "alive" } else { "dead" },
            r.samples,
            r.samples_per_s,
            r.compute_per_s.map_or_else(dash, |v| format!("{v:.0}")),
            r.share * 100.0,
            opt(r.window_planned),
            opt(r.window_trained),
            r.window_share.map_or_else(dash, |s| format!("{:.1}%", s * 100.0)),
            r.link_bytes_per_s.map_or_else(dash, |b| format!("{}/s", report::bytes(b))),
        );
    }
    html.push_str("</table>");

    let timeline = Timeline::of(live.lines()).thinned(MAX_REDUCES);
    report::chart_section(&mut html, &meta.devices, &timeline);
    report::fault_table(&mut html, &f.deaths);
    report::epoch_table(&mut html, &timeline.epochs);
    report::resume_note(&mut html, meta.resumed_from.as_deref(), meta.epochs_restored);
    html
}

/// Extra style of the live page, on top of the report's.
const LIVE_CSS: &str = "#conn{float:right;font-size:13px;color:#555}\
#conn.live{color:#08783e}#conn.lost{color:#b00020}\
td.dead{color:#b00020;font-weight:bold}td.alive{color:#08783e}";

/// The page's script: follow `events` (with the page's own token) and swap the live part in.
/// Each update leaves its sequence number, and any script error, on `<body>` (what the browser
/// test reads).
const SCRIPT: &str = r#"(function () {
  "use strict";
  var body = document.body, live = document.getElementById("live"), conn = document.getElementById("conn");
  var errors = 0, updates = 0;
  window.addEventListener("error", function () { errors += 1; body.setAttribute("data-errors", String(errors)); });
  if (!window.EventSource) { conn.textContent = "this browser cannot follow live updates"; return; }
  var token = new URLSearchParams(window.location.search).get("token");
  var source = new EventSource("events" + (token ? "?token=" + encodeURIComponent(token) : ""));
  source.onopen = function () { conn.textContent = "live"; conn.className = "live"; };
  source.onmessage = function (event) {
    var update = JSON.parse(event.data);
    live.innerHTML = update.html;
    updates += 1;
    body.setAttribute("data-updates", String(updates));
    body.setAttribute("data-seq", String(update.seq));
    if (update.stage !== "running") {
      source.close();
      conn.textContent = "run " + update.stage;
      conn.className = "";
    }
  };
  source.onerror = function () { conn.textContent = "connection lost, retrying"; conn.className = "lost"; };
})();"#;

/// The whole page around a live part rendered by [`fragment`].
pub(crate) fn document(name: &str, seq: u64, fragment: &str) -> String {
    let title = format!("fdl live: {name}");
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>{css}{live_css}</style></head><body data-seq=\"{seq}\" data-updates=\"0\">\
         <h1>{t}<span id=\"conn\">connecting</span></h1><main id=\"live\">{fragment}</main>\
         <script>{SCRIPT}</script></body></html>\n",
        t = escape(&title),
        css = report::CSS,
        live_css = LIVE_CSS,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dashboard::live::tests::{death, epoch, meta, reduce};

    /// The page is self-contained, escapes the run's name, and carries the report's six
    /// charts, the ranks (a dead one marked) and the deaths.
    #[test]
    fn the_page_is_self_contained_with_the_report_charts() {
        let mut live = LiveRun::new(meta());
        for line in [reduce(1, [4, 12]), epoch(0, [40, 120], false), reduce(2, [4, 11]), death(1)] {
            live.record(line);
        }
        let html = document(&live.meta().name, 3, &fragment(&live, &live.figures()));
        assert_eq!(html.matches("<svg").count(), 6, "the report's charts");
        assert!(html.contains("live&lt;run&gt;") && !html.contains("live<run>"));
        assert!(html.contains("Rank deaths") && html.contains("class=\"l dead\""));
        for external in ["src=", "href=", "@import", "url(", "http://", "https://"] {
            // The SVG namespace is an identifier, not a fetch.
            let count = html.matches(external).count()
                - html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count()
                    * usize::from(external == "http://");
            assert_eq!(count, 0, "{external} in the page");
        }
        assert!(!html.contains("NaN") && !html.contains("inf"));
    }
}

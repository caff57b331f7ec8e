//! The bench dashboard: index.html (tables and SVG charts per group), summary.md, summary.json.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::baseline::{Baseline, Comparison, Status};
use crate::chart::{Bar, bar_chart, escape};
use crate::criterion_result::BenchResult;
use crate::quantity::{RateUnit, format_time, time_scale};

/// One benchmark in the summary: its result, throughput and comparison.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Entry {
    /// The result.
    #[serde(flatten)]
    pub(crate) result: BenchResult,
    /// Its throughput, if declared.
    pub(crate) rate: Option<RateOut>,
    /// Against the baseline.
    #[serde(flatten)]
    pub(crate) comparison: Comparison,
}

/// A throughput rate as the summary reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct RateOut {
    /// What is counted.
    pub(crate) unit: RateUnit,
    /// How many per second.
    pub(crate) per_second: f64,
    /// Readable form (`12.3 GB/s`).
    pub(crate) display: String,
}

/// Everything the dashboard shows.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Dashboard {
    /// When it was made (UTC).
    pub(crate) generated: String,
    /// The machine the benches ran on.
    pub(crate) host: String,
    /// The regression threshold, in percent.
    pub(crate) threshold_pct: f64,
    /// Where the baseline was read.
    pub(crate) baseline_path: String,
    /// The machine the baseline came from (empty when there is none).
    pub(crate) baseline_host: String,
    /// Every benchmark.
    pub(crate) benchmarks: Vec<Entry>,
    /// Ids of regressed benchmarks.
    pub(crate) regressions: Vec<String>,
    /// Baseline ids this run did not produce.
    pub(crate) absent: Vec<String>,
}

impl Dashboard {
    /// Compares `results` with `baseline` and gathers the dashboard.
    pub(crate) fn new(
        results: Vec<BenchResult>,
        baseline: &Baseline,
        baseline_path: &Path,
        threshold_pct: f64,
        host: &str,
        generated: &str,
    ) -> Dashboard {
        let absent = baseline.absent_from(&results);
        let benchmarks: Vec<Entry> = results
            .into_iter()
            .map(|result| {
                let rate = result.rate().map(|r| RateOut {
                    unit: r.unit,
                    per_second: r.per_second,
                    display: r.unit.format(r.per_second),
                });
                let comparison = baseline.compare(&result.id, result.time_ns, threshold_pct);
                Entry { result, rate, comparison }
            })
            .collect();
        let regressions = benchmarks
            .iter()
            .filter(|e| e.comparison.status == Status::Regressed)
            .map(|e| e.result.id.clone())
            .collect();
        Dashboard {
            generated: generated.to_string(),
            host: host.to_string(),
            threshold_pct,
            baseline_path: baseline_path.display().to_string(),
            baseline_host: baseline.host.clone(),
            benchmarks,
            regressions,
            absent,
        }
    }

    /// Writes index.html, summary.md and summary.json into `dir`.
    ///
    /// # Errors
    /// When the folder or a file cannot be written.
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        fs::write(dir.join("index.html"), self.html())?;
        fs::write(dir.join("summary.md"), self.markdown())?;
        fs::write(dir.join("summary.json"), serde_json::to_string_pretty(self)? + "\n")?;
        Ok(())
    }

    /// The groups in order of appearance, each with its entries.
    fn groups(&self) -> Vec<(&str, Vec<&Entry>)> {
        let mut groups: Vec<(&str, Vec<&Entry>)> = Vec::new();
        for entry in &self.benchmarks {
            match groups.iter_mut().find(|(name, _)| *name == entry.result.group) {
                Some((_, entries)) => entries.push(entry),
                None => groups.push((&entry.result.group, vec![entry])),
            }
        }
        groups
    }

    fn verdict(&self) -> String {
        match self.regressions.len() {
            0 => format!("no regression beyond {}%", self.threshold_pct),
            n => format!(
                "{n} regression(s) beyond {}%: {}",
                self.threshold_pct,
                self.regressions.join(", ")
            ),
        }
    }

    fn baseline_line(&self) -> String {
        if self.baseline_host.is_empty() {
            format!(
                "none yet ({}); `cargo xtask bench-report --save-baseline` records one",
                self.baseline_path
            )
        } else {
            format!("{} (measured on {})", self.baseline_path, self.baseline_host)
        }
    }

    /// The Markdown summary: a table per group.
    pub(crate) fn markdown(&self) -> String {
        let mut md = String::from("# flodl benchmarks\n\n");
        md.push_str(&format!(
            "- generated: {}\n- host: {}\n- baseline: {}\n- verdict: {}\n",
            self.generated,
            self.host,
            self.baseline_line(),
            self.verdict()
        ));
        if !self.absent.is_empty() {
            md.push_str(&format!(
                "- in the baseline but not in this run: {}\n",
                self.absent.join(", ")
            ));
        }
        for (group, entries) in self.groups() {
            md.push_str(&format!("\n## {group}\n\n| benchmark | parameter | time | throughput | baseline | change | status |\n|---|---|---:|---:|---:|---:|---|\n"));
            for entry in entries {
                let cells = cells(entry);
                md.push_str(&format!("| {} |\n", cells.join(" | ")));
            }
        }
        md
    }

    /// The self-contained HTML page: per group, charts then a table.
    pub(crate) fn html(&self) -> String {
        let mut html = String::from(concat!(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>flodl benchmarks</title>\n<style>\n",
            "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0 2em}\n",
            "th,td{border:1px solid #ccc;padding:3px 8px;font-size:14px;white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}\n",
            "tr.regressed td{background:#fde0dc}tr.improved td{background:#e0f5e0}svg{display:block;margin:.5em 0}\n",
            "svg text{font-size:12px;font-family:system-ui,sans-serif}svg text.title{font-size:14px;font-weight:600}\n",
            ".bar{fill:#4c78a8}.bar.flagged{fill:#d62728}.reference{stroke:#111;stroke-width:2}\n",
            "</style></head><body>\n<h1>flodl benchmarks</h1>\n",
        ));
        html.push_str(&format!(
            "<p>Generated {} on {}.<br>Baseline: {}.<br><strong>{}</strong></p>\n",
            escape(&self.generated),
            escape(&self.host),
            escape(&self.baseline_line()),
            escape(&self.verdict())
        ));
        if !self.absent.is_empty() {
            html.push_str(&format!(
                "<p>In the baseline but not in this run: {}</p>\n",
                escape(&self.absent.join(", "))
            ));
        }
        for (group, entries) in self.groups() {
            html.push_str(&format!("<h2>{}</h2>\n", escape(group)));
            for chart in charts(group, &entries) {
                html.push_str(&chart);
                html.push('\n');
            }
            html.push_str("<table><tr><th>benchmark</th><th>parameter</th><th>time (95% CI)</th><th>throughput</th><th>baseline</th><th>change</th><th>status</th></tr>\n");
            for entry in entries {
                let class = match entry.comparison.status {
                    Status::Regressed => " class=\"regressed\"",
                    Status::Improved => " class=\"improved\"",
                    Status::New | Status::Unchanged => "",
                };
                let cells = cells(entry);
                html.push_str(&format!("<tr{class}>"));
                for (i, cell) in cells.iter().enumerate() {
                    let numeric = if (2..=5).contains(&i) { " class=\"n\"" } else { "" };
                    html.push_str(&format!("<td{numeric}>{}</td>", escape(cell)));
                }
                html.push_str("</tr>\n");
            }
            html.push_str("</table>\n");
        }
        html.push_str("</body></html>\n");
        html
    }
}

/// A row's cells: benchmark, parameter, time with interval, throughput, baseline, change, status.
fn cells(entry: &Entry) -> [String; 7] {
    let r = &entry.result;
    let c = &entry.comparison;
    [
        shown_name(&r.function).to_string(),
        r.parameter.clone().unwrap_or_default(),
        format!(
            "{} [{} – {}]",
            format_time(r.time_ns),
            format_time(r.low_ns),
            format_time(r.high_ns)
        ),
        entry.rate.as_ref().map(|rate| rate.display.clone()).unwrap_or_default(),
        c.baseline_ns.map(format_time).unwrap_or_default(),
        c.change_pct.map(|p| format!("{p:+.1}%")).unwrap_or_default(),
        match c.status {
            Status::New => "new",
            Status::Unchanged => "ok",
            Status::Improved => "improved",
            Status::Regressed => "REGRESSED",
        }
        .to_string(),
    ]
}

/// A function id without its `@unit` suffix (the throughput column names the unit).
fn shown_name(function: &str) -> &str {
    function.split_once('@').map_or(function, |(name, _)| name)
}

/// The charts of one group: one per throughput unit, and one of times for entries without one.
fn charts(group: &str, entries: &[&Entry]) -> Vec<String> {
    let label = |e: &Entry| match &e.result.parameter {
        Some(p) => format!("{} / {p}", shown_name(&e.result.function)),
        None => shown_name(&e.result.function).to_string(),
    };
    let mut units: Vec<RateUnit> =
        entries.iter().filter_map(|e| e.rate.as_ref().map(|r| r.unit)).collect();
    units.sort();
    units.dedup();
    let mut charts = Vec::new();
    for unit in units {
        let with_unit: Vec<&&Entry> =
            entries.iter().filter(|e| e.rate.as_ref().is_some_and(|r| r.unit == unit)).collect();
        let max = with_unit
            .iter()
            .filter_map(|e| e.rate.as_ref())
            .map(|r| r.per_second)
            .fold(0.0, f64::max);
        let (divisor, unit_label) = unit.scale_for(max);
        let bars: Vec<Bar> = with_unit
            .iter()
            .filter_map(|e| {
                let rate = e.rate.as_ref()?;
                let reference = e
                    .comparison
                    .baseline_ns
                    .and_then(|ns| e.result.rate_at(ns))
                    .map(|r| r.per_second / divisor);
                Some(Bar {
                    label: label(e),
                    value: rate.per_second / divisor,
                    reference,
                    caption: rate.display.clone(),
                    flagged: e.comparison.status == Status::Regressed,
                })
            })
            .collect();
        charts.push(bar_chart(
            &format!("{group}: throughput ({unit_label}, higher is better)"),
            &bars,
        ));
    }
    let timed: Vec<&&Entry> = entries.iter().filter(|e| e.rate.is_none()).collect();
    if !timed.is_empty() {
        let max = timed.iter().map(|e| e.result.time_ns).fold(0.0, f64::max);
        let (divisor, unit) = time_scale(max);
        let bars: Vec<Bar> = timed
            .iter()
            .map(|e| Bar {
                label: label(e),
                value: e.result.time_ns / divisor,
                reference: e.comparison.baseline_ns.map(|ns| ns / divisor),
                caption: format_time(e.result.time_ns),
                flagged: e.comparison.status == Status::Regressed,
            })
            .collect();
        charts.push(bar_chart(
            &format!("{group}: time per iteration ({unit}, lower is better)"),
            &bars,
        ));
    }
    charts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::criterion_result::tests::{benchmark_json, estimates_json};

    fn result(
        group: &str,
        function: &str,
        value: &str,
        throughput: &str,
        mean: f64,
    ) -> Result<BenchResult> {
        BenchResult::parse(
            &benchmark_json(group, function, value, throughput),
            &estimates_json(mean, None),
        )
    }

    fn fixture() -> Result<Dashboard> {
        let old = vec![
            result("kernels", "cpu_axpy", "1024", r#"{"BytesDecimal":12288}"#, 1000.0)?,
            result("kernels", "cpu_gemm@flop", "64", r#"{"Elements":524288}"#, 50_000.0)?,
            result("dispatch", "cpu_plan", "8", "null", 300.0)?,
            result("dispatch", "cpu_gone", "8", "null", 300.0)?,
        ];
        let baseline =
            Baseline::default().updated(&old, "2 cores, Test CPU", "2026-12-01T00:00:00Z");
        let new = vec![
            result("kernels", "cpu_axpy", "1024", r#"{"BytesDecimal":12288}"#, 1200.0)?,
            result("kernels", "cpu_gemm@flop", "64", r#"{"Elements":524288}"#, 40_000.0)?,
            result("dispatch", "cpu_plan", "8", "null", 305.0)?,
            result("ddp", "cpu_step@step", "mlp", r#"{"Elements":1}"#, 2.0e6)?,
        ];
        Ok(Dashboard::new(
            new,
            &baseline,
            Path::new("benches/baseline.json"),
            10.0,
            "2 cores, Test CPU",
            "2026-12-02T10:00:00Z",
        ))
    }

    #[test]
    fn summary_flags_regressions_and_absent_benchmarks() -> Result<()> {
        let dashboard = fixture()?;
        assert_eq!(dashboard.regressions, ["kernels/cpu_axpy/1024"]);
        assert_eq!(dashboard.absent, ["dispatch/cpu_gone/8"]);
        let json: serde_json::Value = serde_json::to_value(&dashboard)?;
        let benchmarks = json["benchmarks"].as_array().map(Vec::as_slice).unwrap_or_default();
        assert_eq!(benchmarks.len(), 4);
        let axpy = &benchmarks[0];
        assert_eq!(axpy["id"], "kernels/cpu_axpy/1024");
        assert_eq!(axpy["status"], "regressed");
        assert_eq!(axpy["rate"]["unit"], "bytes");
        assert_eq!(axpy["rate"]["display"], "10.2 GB/s");
        assert_eq!(benchmarks[1]["status"], "improved");
        assert_eq!(benchmarks[1]["rate"]["display"], "13.1 GFLOP/s");
        assert_eq!(benchmarks[2]["status"], "unchanged");
        assert_eq!(benchmarks[3]["status"], "new");
        assert_eq!(benchmarks[3]["rate"]["display"], "500 steps/s");
        Ok(())
    }

    #[test]
    fn unit_suffixes_are_hidden_in_names() {
        let cases = [
            ("cuda0_gemm@flop", "cuda0_gemm"),
            ("cpu_axpy", "cpu_axpy"),
            ("cpu_x@sample", "cpu_x"),
        ];
        for (function, want) in cases {
            assert_eq!(shown_name(function), want);
        }
    }

    #[test]
    fn markdown_and_html_show_every_group_and_row() -> Result<()> {
        let dashboard = fixture()?;
        let md = dashboard.markdown();
        for want in [
            "## kernels",
            "## dispatch",
            "## ddp",
            "| cpu_axpy | 1024 |",
            "REGRESSED",
            "+20.0%",
            "-20.0%",
            "1 regression(s) beyond 10%",
            "dispatch/cpu_gone/8",
        ] {
            assert!(md.contains(want), "summary.md lacks {want}\n{md}");
        }
        let html = dashboard.html();
        assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
        assert_eq!(html.matches("<h2>").count(), 3);
        // kernels: a GB/s chart and a GFLOP/s chart; dispatch: a time chart; ddp: a steps/s chart.
        assert_eq!(html.matches("<svg").count(), 4);
        for want in [
            "throughput (GB/s",
            "throughput (GFLOP/s",
            "time per iteration (ns",
            "throughput (steps/s",
            "class=\"regressed\"",
            "class=\"improved\"",
        ] {
            assert!(html.contains(want), "index.html lacks {want}");
        }
        assert!(!html.contains("<script"), "the page must stand alone");
        Ok(())
    }
}

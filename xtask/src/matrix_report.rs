//! The matrix's results as a table (matrix.txt) and as JSON (matrix.json).

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::gpu_inventory::GpuInventory;
use crate::row_runner::{Outcome, RowResult};
use crate::table::{Align, Table};

/// The widest filter shown in the table (matrix.json has them whole).
const FILTER_WIDTH: usize = 40;

/// Everything one matrix run found.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct MatrixReport {
    /// The GPUs the run saw.
    pub(crate) gpus: GpuInventory,
    /// Whether `FLODL_REQUIRE_GPU=1` was set.
    pub(crate) require_gpu: bool,
    /// One result per row, in run order.
    pub(crate) rows: Vec<RowResult>,
    /// Rows that failed, timed out, were missing or not built, or (with `require_gpu`) did not
    /// run.
    pub(crate) failures: usize,
    /// No failures.
    pub(crate) ok: bool,
}

impl MatrixReport {
    /// Gathers the rows' results.
    pub(crate) fn new(gpus: GpuInventory, require_gpu: bool, rows: Vec<RowResult>) -> MatrixReport {
        let failures = rows.iter().filter(|r| r.outcome.fails(require_gpu)).count();
        MatrixReport { gpus, require_gpu, rows, failures, ok: failures == 0 }
    }

    /// The report as text: the GPUs, then one line per row (case × result × time).
    pub(crate) fn render(&self) -> String {
        let mut text = String::new();
        let names = if self.gpus.names.is_empty() {
            String::new()
        } else {
            format!(": {}", self.gpus.names.join(", "))
        };
        text.push_str(&format!("GPUs: {}{names}\n", self.gpus.count));
        for line in &self.gpus.evidence {
            text.push_str(&format!("  {line}\n"));
        }
        let require = if self.require_gpu { "1" } else { "unset" };
        text.push_str(&format!("FLODL_REQUIRE_GPU: {require}\n\n"));
        let mut table = Table::new(&[
            ("case", Align::Left),
            ("binary", Align::Left),
            ("filter", Align::Left),
            ("gpus", Align::Right),
            ("result", Align::Left),
            ("tests", Align::Right),
            ("skips", Align::Right),
            ("time", Align::Right),
        ]);
        for result in &self.rows {
            let ran = result.passed + result.failed > 0;
            let tests = if ran {
                format!("{}/{}", result.passed, result.passed + result.failed)
            } else {
                String::new()
            };
            let time = if ran || result.seconds > 0.0 {
                format!("{:.1} s", result.seconds)
            } else {
                String::new()
            };
            table.push(vec![
                result.row.label.clone(),
                result.row.binary.clone(),
                shorten(&result.row.filters.join("|"), FILTER_WIDTH),
                result.row.gpus.to_string(),
                result.outcome.word(),
                tests,
                if ran { result.skips.to_string() } else { String::new() },
                time,
            ]);
        }
        text.push_str(&table.render());
        let measured: Vec<&RowResult> =
            self.rows.iter().filter(|r| !r.figures.is_empty()).collect();
        if !measured.is_empty() {
            text.push_str("\nfigures (run directories under out/jobs/):\n");
            for result in measured {
                text.push_str(&format!("  {}: {}\n", result.row.label, result.figures.join("; ")));
            }
        }
        let not_run = self.rows.iter().filter(|r| matches!(r.outcome, Outcome::NotRun { .. }));
        let not_run = not_run.count();
        if not_run > 0 {
            let counted = if self.require_gpu { "counted as failures" } else { "not counted" };
            text.push_str(&format!("\nnot run: {not_run} row(s), {counted}\n"));
        }
        let verdict =
            if self.ok { "ok".to_string() } else { format!("{} row(s) failed", self.failures) };
        text.push_str(&format!("\nmatrix: {verdict}\n"));
        for result in self.rows.iter().filter(|r| !r.log_tail.is_empty()) {
            text.push_str(&format!(
                "\n--- {} ({}): why it failed\n",
                result.row.label, result.row.binary
            ));
            for line in &result.log_tail {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    /// Writes matrix.txt and matrix.json into `dir`.
    ///
    /// # Errors
    /// When the folder or the files cannot be written.
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        fs::write(dir.join("matrix.txt"), self.render())?;
        fs::write(dir.join("matrix.json"), serde_json::to_string_pretty(self)? + "\n")?;
        Ok(())
    }
}

/// `text` cut to `width` characters, ending in `…` when cut.
fn shorten(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        text.chars().take(width.saturating_sub(1)).chain(std::iter::once('…')).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_inventory::Probes;
    use crate::matrix::{Row, RowKind};

    fn result(
        label: &str,
        gpus: usize,
        outcome: Outcome,
        passed: usize,
        failed: usize,
    ) -> RowResult {
        let failing = outcome.fails(true);
        RowResult {
            row: Row {
                label: label.into(),
                binary: "flodl-nccl/nccl".into(),
                filters: vec!["world_1".into(), "cuda".into()],
                gpus,
                serial: true,
                kind: RowKind::Case,
            },
            outcome,
            passed,
            failed,
            skips: 0,
            seconds: if passed + failed > 0 { 2.5 } else { 0.0 },
            log_tail: if failing { vec!["thread panicked".into()] } else { Vec::new() },
            figures: Vec::new(),
        }
    }

    #[test]
    fn long_filters_are_shortened() {
        let cases = [("abc", 3, "abc"), ("abcd", 3, "ab…"), ("", 5, ""), ("ééééé", 4, "ééé…")];
        for (text, width, want) in cases {
            assert_eq!(shorten(text, width), want, "{text}");
            assert!(shorten(text, width).chars().count() <= width);
        }
    }

    #[test]
    fn table_and_json_show_every_row() -> Result<()> {
        let gpus = GpuInventory::from_probes(Probes {
            smi_names: Some(vec!["NVIDIA H200".into()]),
            ..Probes::default()
        });
        let rows = vec![
            result("nccl world 1", 1, Outcome::Passed, 4, 0),
            result("nccl multi-GPU", 2, Outcome::needs_gpus(2, 1), 0, 0),
            result("pinned prefetch", 1, Outcome::Failed { code: Some(101) }, 2, 1),
            result("stale case", 1, Outcome::Missing, 0, 0),
        ];
        let mut job = result("fdl train cpu + cuda:0, host", 1, Outcome::Passed, 1, 0);
        job.figures = vec!["rank 0 (cpu): 2100 samples/s".into()];
        let mut rows = rows;
        rows.push(job);
        let loose = MatrixReport::new(gpus.clone(), false, rows.clone());
        assert_eq!(loose.failures, 2, "without FLODL_REQUIRE_GPU a row not run is no failure");
        assert!(loose.render().contains("not run: 1 row(s), not counted"));
        let report = MatrixReport::new(gpus, true, rows);
        assert_eq!(report.failures, 3, "under FLODL_REQUIRE_GPU a row not run fails");
        assert!(!report.ok);
        let text = report.render();
        assert!(text.starts_with("GPUs: 1: NVIDIA H200\n"), "{text}");
        for want in [
            "nccl world 1",
            "passed",
            "4/4",
            "2.5 s",
            "not run (needs 2 GPUs, 1 visible)",
            "FAILED (exit 101)",
            "2/3",
            "MISSING",
            "world_1|cuda",
            "fdl train cpu + cuda:0, host: rank 0 (cpu): 2100 samples/s",
            "not run: 1 row(s), counted as failures",
            "matrix: 3 row(s) failed",
            "thread panicked",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
        let json: serde_json::Value = serde_json::to_value(&report)?;
        assert_eq!(json["rows"].as_array().map(Vec::len), Some(5));
        assert_eq!(json["rows"][1]["result"], "not_run");
        assert_eq!(json["rows"][4]["figures"][0], "rank 0 (cpu): 2100 samples/s");
        assert_eq!(json["rows"][0]["result"], "passed");
        assert_eq!(json["rows"][0]["label"], "nccl world 1");
        assert_eq!(json["rows"][2]["result"], "failed");
        assert_eq!(json["rows"][2]["code"], 101);
        assert_eq!(json["gpus"]["count"], 1);
        assert_eq!(json["ok"], false);
        Ok(())
    }
}

//! `/metrics`: the run's figures in the Prometheus text exposition format (version 0.0.4).

use std::fmt::Write as _;

use super::live::{Figures, Meta, Stage};

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// A total that only grows (its name ends in `_total`).
    Counter,
}

/// Exposition text being written: families of samples, each after its `HELP` and `TYPE`.
#[derive(Debug, Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    /// Starts a family.
    fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = match kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample of the current family.
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (key, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let _ = write!(self.text, "{key}=\"{v}\"");
            }
            self.text.push('}');
        }
        let value = if value.is_nan() {
            "NaN".to_owned()
        } else if value.is_infinite() {
            if value > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
        } else {
            format!("{value}")
        };
        let _ = writeln!(self.text, " {value}");
    }

    /// A family with a single unlabelled sample.
    fn single(&mut self, name: &str, kind: Kind, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

/// The exposition text of a run's figures. Values not known yet (no evaluation, no reduce)
/// are left out rather than exported as zeros.
pub(crate) fn render(meta: &Meta, f: &Figures) -> String {
    let mut e = Exposition::default();
    let policy = meta.policy.to_string();
    let backend = meta.backend.to_string();
    e.family("fdl_run_info", Kind::Gauge, "The running job (always 1), described by its labels.");
    e.sample(
        "fdl_run_info",
        &[("name", &meta.name), ("policy", &policy), ("backend", &backend)],
        1.0,
    );
    e.single(
        "fdl_run_running",
        Kind::Gauge,
        "1 while the run trains, 0 once it has ended.",
        f64::from(u8::from(f.stage == Stage::Running)),
    );
    e.single("fdl_elapsed_seconds", Kind::Gauge, "Seconds since training started.", f.elapsed_s);
    e.single("fdl_epochs", Kind::Gauge, "Epochs the run trains to.", meta.epochs as f64);
    e.single(
        "fdl_epochs_completed",
        Kind::Gauge,
        "Epochs finished (restored ones included).",
        f.epochs_done as f64,
    );
    if let Some(loss) = f.train_loss {
        e.single("fdl_train_loss", Kind::Gauge, "Mean training loss of the last epoch.", loss);
    }
    if let Some(eval) = f.eval {
        e.single("fdl_test_loss", Kind::Gauge, "Loss of the newest evaluation.", eval.loss);
        e.single(
            "fdl_test_accuracy",
            Kind::Gauge,
            "Accuracy (0-1) of the newest evaluation.",
            eval.accuracy,
        );
    }
    e.single("fdl_reduces_total", Kind::Counter, "Reduces (averagings) so far.", f.reduces as f64);
    e.single(
        "fdl_sync_seconds_total",
        Kind::Counter,
        "Time spent in reduces so far, in seconds.",
        f.sync_ms_total / 1000.0,
    );
    if let Some(r) = &f.last_reduce {
        e.single(
            "fdl_elche_anchor_batches",
            Kind::Gauge,
            "ElChe's anchor (batches of the slowest rank per window) in the newest window.",
            r.anchor as f64,
        );
        e.single(
            "fdl_last_sync_seconds",
            Kind::Gauge,
            "Duration of the newest reduce, in seconds.",
            r.sync_ms / 1000.0,
        );
    }
    e.single("fdl_rank_deaths_total", Kind::Counter, "Ranks declared dead.", f.deaths.len() as f64);

    let ranks: Vec<(String, &super::live::RankFigures)> =
        f.ranks.iter().map(|r| (r.rank.to_string(), r)).collect();
    let per_rank = |e: &mut Exposition,
                    name: &str,
                    kind: Kind,
                    help: &str,
                    value: &dyn Fn(&super::live::RankFigures) -> Option<f64>| {
        let values: Vec<(&str, &str, f64)> = ranks
            .iter()
            .filter_map(|(rank, r)| value(r).map(|v| (rank.as_str(), r.device.as_str(), v)))
            .collect();
        if values.is_empty() {
            return;
        }
        e.family(name, kind, help);
        for (rank, device, v) in values {
            e.sample(name, &[("rank", rank), ("device", device)], v);
        }
    };
    per_rank(&mut e, "fdl_rank_alive", Kind::Gauge, "1 while the rank is alive.", &|r| {
        Some(f64::from(u8::from(r.alive)))
    });
    per_rank(
        &mut e,
        "fdl_rank_samples_total",
        Kind::Counter,
        "Samples the rank trained in this run.",
        &|r| Some(r.samples as f64),
    );
    per_rank(
        &mut e,
        "fdl_rank_samples_per_second",
        Kind::Gauge,
        "Samples the rank trained per second of wall time.",
        &|r| Some(r.samples_per_s),
    );
    per_rank(
        &mut e,
        "fdl_rank_compute_samples_per_second",
        Kind::Gauge,
        "Samples per second of the rank's compute in the last finished epoch.",
        &|r| r.compute_per_s,
    );
    per_rank(
        &mut e,
        "fdl_rank_sample_share",
        Kind::Gauge,
        "The rank's fraction of all samples trained in this run.",
        &|r| Some(r.share),
    );
    per_rank(
        &mut e,
        "fdl_rank_window_planned_batches",
        Kind::Gauge,
        "Batches ElChe planned for the rank in the newest window.",
        &|r| r.window_planned.map(|w| w as f64),
    );
    per_rank(
        &mut e,
        "fdl_rank_window_batches",
        Kind::Gauge,
        "Batches the rank trained in the newest window.",
        &|r| r.window_trained.map(|w| w as f64),
    );
    per_rank(
        &mut e,
        "fdl_rank_batch_share",
        Kind::Gauge,
        "The rank's fraction of the newest window's batches.",
        &|r| r.window_share,
    );
    e.text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dashboard::live::LiveRun;
    use crate::dashboard::live::tests::{death, epoch, meta, reduce};
    use crate::dashboard::prometheus_text as parser;
    use std::time::Duration;

    /// Every stage of a run exports text that a strict parser accepts, with the figures.
    #[test]
    fn metrics_parse_as_prometheus_text() -> Result<(), String> {
        let mut m = meta();
        m.name = "quote\" back\\slash\nline".into();
        let mut live = LiveRun::new(m);
        let empty = render(live.meta(), &live.figures_at(Duration::ZERO));
        let series = parser::parse(&empty)?;
        assert!(!series.contains_key("fdl_test_accuracy"), "{empty}");
        assert_eq!(series.get("fdl_reduces_total"), Some(&0.0));
        for line in [reduce(1, [4, 12]), epoch(0, [40, 120], false), death(1)] {
            live.record(line);
        }
        let text = render(live.meta(), &live.figures_at(Duration::from_secs(2)));
        let series = parser::parse(&text)?;
        let want = [
            ("fdl_reduces_total", 1.0),
            ("fdl_elche_anchor_batches", 5.0),
            ("fdl_test_accuracy", 0.8),
            ("fdl_rank_deaths_total", 1.0),
            ("fdl_rank_alive{rank=\"1\",device=\"cpu\"}", 0.0),
            ("fdl_rank_batch_share{rank=\"1\",device=\"cpu\"}", 0.75),
            ("fdl_rank_samples_total{rank=\"0\",device=\"cpu\"}", 40.0),
            ("fdl_rank_samples_per_second{rank=\"1\",device=\"cpu\"}", 60.0),
            ("fdl_run_running", 1.0),
        ];
        for (key, value) in want {
            assert_eq!(series.get(key), Some(&value), "{key} in\n{text}");
        }
        assert!(text.contains(r#"name="quote\" back\\slash\nline""#), "{text}");
        Ok(())
    }

    #[test]
    fn the_parser_refuses_malformed_text() {
        let bad = [
            "fdl_x 1\n",                                                  // no TYPE
            "# TYPE fdl_x gauge\nfdl_x one\n",                            // value
            "# TYPE fdl_x gauge\nfdl_x{a=\"1\" 1\n",                      // label set
            "# TYPE fdl_x gauge\nfdl_x 1\nfdl_x 2\n",                     // duplicate
            "# TYPE fdl_x gauge\n# TYPE fdl_x gauge\n",                   // declared twice
            "# TYPE fdl_x gauge\nfdl_x 1",                                // no final newline
            "# TYPE fdl_x gauge\n# TYPE fdl_y gauge\nfdl_y 1\nfdl_x 1\n", // family split
            "# TYPE fdl_x histogrm\n",                                    // type
            "# TYPE 1x gauge\n",                                          // name
        ];
        for text in bad {
            assert!(parser::parse(text).is_err(), "accepted {text:?}");
        }
    }
}

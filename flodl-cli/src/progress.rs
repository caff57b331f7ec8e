//! Live progress of a run: one bar per rank and an epoch line on a terminal, plain lines otherwise.

use std::io::IsTerminal;
use std::time::Duration;

use flodl_ddp::{EpochMetrics, ReduceEvent};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::tally::RankTally;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Display {
    /// Bars redrawn in place (stdout is a terminal).
    Bars,
    /// One plain line per epoch (stdout is a file or a pipe).
    Lines,
    /// Nothing.
    Silent,
}

impl Display {
    /// Bars on a terminal, lines otherwise, nothing when `quiet`.
    pub(crate) fn detect(quiet: bool) -> Self {
        if quiet {
            Display::Silent
        } else if std::io::stdout().is_terminal() {
            Display::Bars
        } else {
            Display::Lines
        }
    }
}

/// The bars of a running training.
#[derive(Debug)]
pub(crate) struct Progress {
    display: Display,
    bars: Option<Bars>,
    epochs: usize,
    /// Samples per rank so far.
    tally: RankTally,
    /// The first epoch this run trained (a resumed run starts past 0).
    first_epoch: Option<usize>,
}

#[derive(Debug)]
struct Bars {
    multi: MultiProgress,
    ranks: Vec<ProgressBar>,
    epoch: ProgressBar,
}

impl Progress {
    /// Progress for `devices.len()` ranks over `epochs` epochs of `samples_per_epoch` samples.
    pub(crate) fn new(
        display: Display,
        devices: &[String],
        samples_per_epoch: u64,
        epochs: usize,
        batch_size: usize,
    ) -> Self {
        let bars = (display == Display::Bars).then(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
            let total = samples_per_epoch * epochs as u64;
            let rank_style = ProgressStyle::with_template(
                "{prefix:>16} [{bar:30.cyan/blue}] {pos:>9} samples  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            let ranks = devices
                .iter()
                .enumerate()
                .map(|(r, d)| {
                    multi.add(
                        ProgressBar::new(total)
                            .with_style(rank_style.clone())
                            .with_prefix(format!("rank {r} {d}")),
                    )
                })
                .collect();
            let epoch_style =
                ProgressStyle::with_template("{prefix:>16} [{bar:30.green/white}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> ");
            let epoch = multi.add(
                ProgressBar::new(epochs as u64)
                    .with_style(epoch_style)
                    .with_prefix("epochs")
                    .with_message(format!("epoch 0/{epochs}")),
            );
            Bars { multi, ranks, epoch }
        });
        Self {
            display,
            bars,
            epochs,
            tally: RankTally::new(devices.len(), batch_size),
            first_epoch: None,
        }
    }

    /// Counts a reduce's steps into the rank bars.
    pub(crate) fn reduce(&mut self, event: &ReduceEvent, elapsed: Duration) {
        self.tally.reduce(event);
        self.redraw_ranks(elapsed);
    }

    /// Shows a finished epoch.
    pub(crate) fn epoch(&mut self, m: &EpochMetrics, elapsed: Duration) {
        self.tally.epoch(m);
        self.redraw_ranks(elapsed);
        let done = m.epoch + 1;
        let first = *self.first_epoch.get_or_insert(m.epoch);
        let trained = done.saturating_sub(first).max(1);
        let eta = elapsed.as_secs_f64() / trained as f64 * self.epochs.saturating_sub(done) as f64;
        let line = format!("{}  {:.1}s  ETA {:.0}s", self.describe(m), elapsed.as_secs_f64(), eta);
        match (&self.bars, self.display) {
            (Some(b), _) => {
                b.epoch.set_position(done as u64);
                b.epoch.set_message(line);
            }
            (None, Display::Lines) => println!("{line}"),
            _ => {}
        }
    }

    /// Shows an epoch restored from the checkpoint the run resumed from.
    pub(crate) fn restored_epoch(&self, m: &EpochMetrics) {
        self.note(&format!("{}  (restored from the checkpoint)", self.describe(m)));
    }

    /// Prints a line above the bars (or as a plain line); nothing when silent.
    pub(crate) fn note(&self, line: &str) {
        if self.display != Display::Silent {
            self.alert(line);
        }
    }

    /// Prints a line above the bars (or as a plain line), even when silent: something went
    /// wrong that the run survived (a rank died).
    pub(crate) fn alert(&self, line: &str) {
        let printed = self.bars.as_ref().is_some_and(|b| b.multi.println(line).is_ok());
        if !printed {
            println!("{line}");
        }
    }

    /// `epoch i/n  loss ...  test loss ... accuracy ...`.
    fn describe(&self, m: &EpochMetrics) -> String {
        let acc = m.eval.map_or(String::new(), |e| {
            format!("  test loss {:.4}  accuracy {:.2}%", e.loss, e.accuracy * 100.0)
        });
        // An epoch whose every sample was trained before this run resumed (a checkpoint's or a
        // takeover's cut at its very end) has no loss of this run's to show.
        let loss = if m.samples == 0 {
            "trained before the resume".to_owned()
        } else {
            format!("loss {:.4}", m.avg_loss)
        };
        format!("epoch {}/{}  {loss}{acc}", m.epoch + 1, self.epochs)
    }

    fn redraw_ranks(&self, elapsed: Duration) {
        let Some(b) = &self.bars else { return };
        let counts = self.tally.counts();
        let total: u64 = counts.iter().sum();
        let secs = elapsed.as_secs_f64().max(1e-3);
        for (bar, &n) in b.ranks.iter().zip(&counts) {
            bar.set_position(n);
            let share = if total > 0 { n as f64 / total as f64 * 100.0 } else { 0.0 };
            bar.set_message(format!("{:>7.0}/s  share {share:>5.1}%", n as f64 / secs));
        }
    }

    /// Removes the bars (the final figures are printed by the caller).
    pub(crate) fn finish(self) {
        if let Some(b) = self.bars {
            for bar in &b.ranks {
                // `finish` would fill the bar; a rank's bar stops at its share of the work.
                bar.abandon();
            }
            b.epoch.finish();
        }
    }
}

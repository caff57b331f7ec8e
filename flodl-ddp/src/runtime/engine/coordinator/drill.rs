//! A failover drill: the first controller of a run holds once, for a while, at a chosen point
//! of its work, so that a test can kill it exactly there. Chosen by the hidden variable
//! [`DRILL`] (`reduce:MS`: every snapshot of a host round in, its ranks waiting for the
//! update; `checkpoint:MS`: a checkpoint captured, its bundle about to be written). It holds
//! after the run's first epoch, once, and never in a controller that took over (term > 0).

use std::time::Duration;

/// The variable naming the point and the hold: `reduce:MS` or `checkpoint:MS`.
pub(crate) const DRILL: &str = "FLODL_CONTROLLER_DRILL";

/// Where the controller holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldAt {
    /// A host round's snapshots all in, before the average.
    Reduce,
    /// A checkpoint captured, before its bundle is written.
    Checkpoint,
}

impl HoldAt {
    fn words(self) -> &'static str {
        match self {
            HoldAt::Reduce => "with a reduce in flight (every snapshot in, no update sent)",
            HoldAt::Checkpoint => "with a checkpoint captured and not yet written",
        }
    }
}

/// The drill a controller runs: where, how long, and whether it has held already.
#[derive(Debug)]
pub(crate) struct Drill {
    at: HoldAt,
    hold: Duration,
    held: bool,
}

impl Drill {
    /// The drill [`DRILL`] asks of the controller of `term`; `None` when unset, for a later
    /// term, or when the value does not read (it is warned about and ignored).
    pub(crate) fn from_env(term: u64) -> Option<Drill> {
        let text = std::env::var(DRILL).ok()?;
        if term > 0 {
            return None;
        }
        let drill = Drill::parse(&text);
        if drill.is_none() {
            tracing::warn!("{DRILL}={text} is not reduce:MS or checkpoint:MS: ignored");
        }
        drill
    }

    fn parse(text: &str) -> Option<Drill> {
        let (at, ms) = text.trim().split_once(':')?;
        let at = match at {
            "reduce" => HoldAt::Reduce,
            "checkpoint" => HoldAt::Checkpoint,
            _ => return None,
        };
        let hold = Duration::from_millis(ms.parse().ok()?);
        Some(Drill { at, hold, held: false })
    }

    /// Holds the calling controller here when `at` is the drill's point, `epochs_done` epochs
    /// are done (at least one) and it has not held yet.
    pub(crate) fn reach(&mut self, at: HoldAt, epochs_done: usize) {
        if self.held || at != self.at || epochs_done == 0 {
            return;
        }
        self.held = true;
        tracing::warn!("controller drill: holding {:?} {} ({DRILL})", self.hold, self.at.words());
        std::thread::sleep(self.hold);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each value reads as its point and hold or not at all; a drill holds once, at its point,
    /// after an epoch.
    #[test]
    fn a_drill_reads_and_holds_once_at_its_point() -> Result<(), String> {
        let cases = [
            ("reduce:5", Some((HoldAt::Reduce, 5))),
            ("checkpoint:0", Some((HoldAt::Checkpoint, 0))),
            (" reduce:7 ", Some((HoldAt::Reduce, 7))),
            ("reduce", None),
            ("reduce:-1", None),
            ("elsewhere:5", None),
            ("", None),
        ];
        for (text, want) in cases {
            let got = Drill::parse(text).map(|d| (d.at, d.hold.as_millis() as u64));
            if got != want {
                return Err(format!("{text:?}: {got:?}, expected {want:?}"));
            }
        }
        let mut d = Drill::parse("reduce:0").ok_or("no drill")?;
        for (at, epochs, held) in [
            (HoldAt::Reduce, 0, false),
            (HoldAt::Checkpoint, 1, false),
            (HoldAt::Reduce, 1, true),
            (HoldAt::Reduce, 2, true),
        ] {
            d.reach(at, epochs);
            if d.held != held {
                return Err(format!("{at:?} after {epochs} epochs: held {}", d.held));
            }
        }
        Ok(())
    }
}

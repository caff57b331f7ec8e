//! A rank's time ledger: the open span since its last report and the activities timed in it.

use std::time::Instant;

use crate::control::breakdown::{Activity, TimeBreakdown};

/// The rank's time since its last report, as a wall clock started once and the activities
/// timed inside it; [`close`](Ledger::close) hands the span over (its parts sum to its wall)
/// and opens the next one at the same instant, so no time falls between two spans.
///
/// Instrumentation only: what it holds leaves the rank in its next
/// [`WorkTally`](crate::control::metrics::WorkTally).
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// When the open span started; `None` until the rank starts training.
    since: Option<Instant>,
    parts: TimeBreakdown,
    /// The ms charged to the reduce and the exchange since the last
    /// [`take_exposed`](Ledger::take_exposed) (`None`: none charged).
    exposed: Option<f64>,
}

impl Ledger {
    /// Starts the first span now, unless one is open.
    pub(crate) fn start(&mut self) {
        if self.since.is_none() {
            self.since = Some(Instant::now());
        }
    }

    /// Charges the time since `from` to `activity` (nothing before the first span starts).
    pub(crate) fn charge(&mut self, activity: Activity, from: Instant) {
        self.charge_ms(activity, from.elapsed().as_secs_f64() * 1000.0);
    }

    /// Charges `ms` to `activity` (measured elsewhere: a step's compute time).
    pub(crate) fn charge_ms(&mut self, activity: Activity, ms: f64) {
        if self.since.is_none() {
            return;
        }
        self.parts.add(activity, ms);
        if matches!(activity, Activity::Reduce | Activity::Exchange) {
            *self.exposed.get_or_insert(0.0) += ms;
        }
    }

    /// The ms the rank spent on reduces instead of training since the last call (the
    /// exchange it could not train through, [`crate::control::exposure::Exposure`]), `None`
    /// when it spent none; the count starts again.
    pub(crate) fn take_exposed(&mut self) -> Option<f64> {
        self.exposed.take()
    }

    /// Runs `f`, charging its time to `activity`.
    pub(crate) fn time<T>(&mut self, activity: Activity, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let r = f();
        self.charge(activity, t0);
        r
    }

    /// The open span, closed now (what no activity claimed is `other`), and the next one opened.
    pub(crate) fn close(&mut self) -> TimeBreakdown {
        let now = Instant::now();
        let Some(since) = self.since.replace(now) else { return TimeBreakdown::default() };
        let wall = now.saturating_duration_since(since).as_secs_f64() * 1000.0;
        std::mem::take(&mut self.parts).closed(wall)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Consecutive spans cover the time between them and each sums to its wall; nothing is
    /// charged before the ledger starts.
    #[test]
    fn spans_are_contiguous_and_closed() -> Result<(), String> {
        let mut ledger = Ledger::default();
        ledger.charge_ms(Activity::Compute, 5.0);
        if ledger.close() != TimeBreakdown::default() {
            return Err("a ledger that never started reported time".into());
        }
        let t0 = Instant::now();
        ledger.start();
        ledger.time(Activity::Data, || std::thread::sleep(Duration::from_millis(4)));
        let a = ledger.close();
        std::thread::sleep(Duration::from_millis(3));
        ledger.charge_ms(Activity::Compute, 1.0);
        let b = ledger.close();
        let total = t0.elapsed().as_secs_f64() * 1000.0;
        let sum = a.wall_ms() + b.wall_ms();
        // Clock reads on different cores of a virtual machine can disagree by microseconds (seen:
        // the spans 4 µs longer than `t0`'s elapsed time read after them).
        if a.data_ms < 4.0 || b.compute_ms != 1.0 || b.other_ms < 2.0 || sum > total + 0.05 {
            return Err(format!("{a:?} {b:?}: {sum} ms of {total} ms"));
        }
        // The spans cover all but the instant before `start` (a few microseconds).
        if total - sum > 1.0 {
            return Err(format!("spans cover {sum} ms of {total} ms"));
        }
        Ok(())
    }

    /// What is taken as exposed is the reduce's and the exchange's charges since the last take,
    /// whatever spans they fell in; other activities and charges before the start are not.
    #[test]
    fn the_exposed_exchange_is_the_reduce_and_exchange_charges() -> Result<(), String> {
        let mut ledger = Ledger::default();
        ledger.charge_ms(Activity::Reduce, 7.0);
        ledger.start();
        // The charges of a case, whether its span is closed after them, and what is taken.
        type Case<'a> = (&'a [(Activity, f64)], bool, Option<f64>);
        let cases: [Case<'_>; 4] = [
            (&[], false, None),
            (&[(Activity::Compute, 3.0), (Activity::Waiting, 2.0)], false, None),
            (
                &[(Activity::Reduce, 1.5), (Activity::Exchange, 0.25), (Activity::Data, 9.0)],
                true,
                Some(1.75),
            ),
            (&[(Activity::Reduce, 2.0), (Activity::Checkpoint, 4.0)], false, Some(2.0)),
        ];
        for (i, (charges, close, want)) in cases.into_iter().enumerate() {
            for &(activity, ms) in charges {
                ledger.charge_ms(activity, ms);
            }
            if close {
                ledger.close();
            }
            let got = ledger.take_exposed();
            if got != want {
                return Err(format!("case {i}: exposed {got:?}, want {want:?}"));
            }
        }
        Ok(())
    }
}

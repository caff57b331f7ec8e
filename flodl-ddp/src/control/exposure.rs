//! What of a reduce's exchange the ranks cannot train through: the cost ElChe's overhead target
//! bounds ([`crate::control::elche::ElChe::report_exchange`]).

/// The sync times of the reduces a window is sized by, and whether the ranks train through them.
///
/// A sync time is the coordinator's, from the order to send the snapshots to the update sent.
/// Without `--overlap` a rank waits for the update, so all of it is exposed. With `--overlap`
/// a rank that sent its snapshot trains its next window (its limit grows by one window's count)
/// and waits only if the update has not come by then: the exposed part of a sync of `s` ms is
/// `max(0, s − window)`. Under `--fragments` the reduces of a cycle carry different fragments
/// and their sync times differ (a whole sync, what else the link carries): the exposed part is
/// taken reduce by reduce and then averaged, never from the mean sync time, since a slow sync
/// that overruns the window is not hidden by quick ones that fit in it.
///
/// What is not modelled: the rank's encoding and hand-off of its snapshot (`Activity::Exchange`)
/// and the merge of the update hold it however the exchange overlaps; they are counted as
/// hidden here (they are inside the sync time, a part of it that loopback runs measure in
/// milliseconds, see BENCHMARKS' `overlap_bench`).
#[derive(Debug, Clone, PartialEq)]
pub struct Exposure {
    /// The sync times (ms) of the reduces the window is sized by: the last one, or under
    /// `--fragments` the last F (one of each fragment once a cycle has run).
    syncs_ms: Vec<f64>,
    /// Whether the ranks train their next window while the exchange runs (`--overlap`).
    overlapped: bool,
}

impl Exposure {
    /// One reduce's sync time, all of it exposed (no overlap).
    pub fn blocking(sync_ms: f64) -> Exposure {
        Exposure { syncs_ms: vec![sync_ms], overlapped: false }
    }

    /// The sync times of the last reduces (ms), overlapped with the next window or not.
    pub fn new(syncs_ms: Vec<f64>, overlapped: bool) -> Exposure {
        Exposure { syncs_ms, overlapped }
    }

    /// The mean ms per reduce the ranks cannot train, for windows of `window_ms` of compute:
    /// each sync time whole without overlap; with it, the part past the window trained
    /// meanwhile. Sync times that are not finite and positive count as 0 (nothing measured);
    /// 0 without any.
    pub fn exposed_ms(&self, window_ms: f64) -> f64 {
        let hidden =
            if self.overlapped && window_ms.is_finite() { window_ms.max(0.0) } else { 0.0 };
        let exposed = |&s: &f64| if s > 0.0 && s.is_finite() { (s - hidden).max(0.0) } else { 0.0 };
        if self.syncs_ms.is_empty() {
            return 0.0;
        }
        self.syncs_ms.iter().map(exposed).sum::<f64>() / self.syncs_ms.len() as f64
    }

    /// The fraction of a window's wall time the exchange costs: `exposed / (window + exposed)`
    /// (0 when nothing is exposed or the window is unknown).
    pub fn overhead(&self, window_ms: f64) -> f64 {
        let exposed = self.exposed_ms(window_ms);
        if !(window_ms > 0.0 && window_ms.is_finite()) || exposed <= 0.0 {
            return 0.0;
        }
        exposed / (window_ms + exposed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-computed: a cycle of 4 fragments' syncs [90, 6, 3, 9] ms around windows of 40 ms.
    /// Blocking: the mean, 27 ms, overhead 27/67. Overlapped: only the heavy fragment's 50 ms
    /// past the window, averaged over the cycle, 12.5 ms, overhead 12.5/52.5 (the mean sync
    /// time, 27 ms, fits in the window and would read as fully hidden). Syncs that all fit: 0.
    #[test]
    fn the_exposed_part_is_taken_reduce_by_reduce() {
        let cycle = vec![90.0, 6.0, 3.0, 9.0];
        let cases = [
            (Exposure::new(cycle.clone(), false), 40.0, 27.0, 27.0 / 67.0),
            (Exposure::new(cycle.clone(), true), 40.0, 12.5, 12.5 / 52.5),
            (Exposure::new(cycle, true), 100.0, 0.0, 0.0),
            (Exposure::blocking(10.0), 200.0, 10.0, 10.0 / 210.0),
            (Exposure::new(vec![60.0], true), 40.0, 20.0, 20.0 / 60.0),
            (
                Exposure::new(vec![f64::NAN, 50.0, -3.0], true),
                40.0,
                10.0 / 3.0,
                (10.0 / 3.0) / (40.0 + 10.0 / 3.0),
            ),
            (Exposure::new(Vec::new(), false), 40.0, 0.0, 0.0),
            (Exposure::blocking(10.0), 0.0, 10.0, 0.0),
        ];
        for (i, (e, window, exposed, overhead)) in cases.into_iter().enumerate() {
            let (got, ov) = (e.exposed_ms(window), e.overhead(window));
            assert!((got - exposed).abs() < 1e-12, "case {i}: exposed {got}, want {exposed}");
            assert!((ov - overhead).abs() < 1e-12, "case {i}: overhead {ov}, want {overhead}");
        }
    }
}

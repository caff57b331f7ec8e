//! What of a reduce's exchange the ranks cannot train through: the cost ElChe's overhead target
//! bounds ([`crate::control::elche::ElChe::report_exchange`]).

/// The exposed exchange of the reduces a window is sized by: for each, the ms the ranks could
/// not train because of it, as they measured it.
///
/// A rank measures, from its snapshot (or its collective) to the merge of the consensus, the
/// time it spent on the reduce instead of training: encoding and handing over its snapshot,
/// waiting for the update, merging it (the breakdown's `reduce` and `exchange`). Without
/// `--overlap` that is the whole round trip as the rank lives it, its own encoding and decoding
/// included, which the coordinator's sync time (from the order to the update sent) leaves out
/// (across processes at 80 MB it was a third of the slow rank's cost: BENCHMARKS, the probe's
/// last rank). With `--overlap` a rank trains while its snapshot
/// travels and waits only when the update has not come by its window's end, so it measures
/// only the part the window did not hide. Under `--fragments` the reduces of a cycle carry
/// different fragments and cost differently: the exposed part is kept reduce by reduce and
/// averaged over the cycle, so the window is sized for the exchange's steady cost rather than
/// for whichever fragment moved last.
///
/// What the measure does not foresee: under `--overlap` a longer window hides more of the
/// exchange, so growing the anchor by `overhead / target` overshoots there; the growth cap
/// (×2 a step) and the guard bound it.
#[derive(Debug, Clone, PartialEq)]
pub struct Exposure {
    /// The exposed ms of the reduces the window is sized by: the last one, or under
    /// `--fragments` the last F (one of each fragment once a cycle has run).
    exposed_ms: Vec<f64>,
}

impl Exposure {
    /// The exposed ms of the last reduces, oldest first.
    pub fn new(exposed_ms: Vec<f64>) -> Exposure {
        Exposure { exposed_ms }
    }

    /// One reduce that cost the ranks `exposed_ms`.
    pub fn of(exposed_ms: f64) -> Exposure {
        Exposure { exposed_ms: vec![exposed_ms] }
    }

    /// The mean exposed ms per reduce. Values that are not finite and positive count as 0
    /// (nothing measured); 0 without any.
    pub fn exposed_ms(&self) -> f64 {
        if self.exposed_ms.is_empty() {
            return 0.0;
        }
        let exposed = |&s: &f64| if s > 0.0 && s.is_finite() { s } else { 0.0 };
        self.exposed_ms.iter().map(exposed).sum::<f64>() / self.exposed_ms.len() as f64
    }

    /// The fraction of a window's wall time the exchange costs, for windows of `window_ms` of
    /// compute: `exposed / (window + exposed)` (0 when nothing is exposed or the window is
    /// unknown).
    pub fn overhead(&self, window_ms: f64) -> f64 {
        let exposed = self.exposed_ms();
        if !(window_ms > 0.0 && window_ms.is_finite()) || exposed <= 0.0 {
            return 0.0;
        }
        exposed / (window_ms + exposed)
    }
}

/// One rank's measure of a reduce: what it cost the rank, and the window it trained after it
/// (its pace is the rank's weight).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankExposure {
    /// The ms the reduce cost the rank (`None`: not measured).
    pub exposed_ms: Option<f64>,
    /// Batches the rank trained in its window.
    pub steps: u64,
    /// Their training ms.
    pub wall_ms: f64,
}

/// What one reduce cost the ranks together: each rank's exposed ms weighted by its pace
/// (batches per ms, the share of the throughput that stood still), the plain mean when no
/// rank's pace is known, `None` when no rank measured it. A fast rank that waits costs the
/// run more samples than a slow one that waits as long.
pub fn reduce_exposed_ms(ranks: &[RankExposure]) -> Option<f64> {
    let pace = |r: &RankExposure| {
        let pace = r.steps as f64 / r.wall_ms;
        if r.steps > 0 && pace.is_finite() && pace > 0.0 { pace } else { 0.0 }
    };
    let (mut n, mut sum, mut weight, mut weighted) = (0usize, 0.0, 0.0, 0.0);
    for r in ranks {
        let Some(exposed) = r.exposed_ms else { continue };
        n += 1;
        sum += exposed;
        weight += pace(r);
        weighted += exposed * pace(r);
    }
    match (n, weight > 0.0) {
        (0, _) => None,
        (_, true) => Some(weighted / weight),
        (_, false) => Some(sum / n as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-computed: ranks at 0.25 and 0.1 batches per ms that lost 40 and 100 ms: (40·0.25 +
    /// 100·0.1) / 0.35 = 57.14; a rank that did not measure is left out; with no pace the plain
    /// mean; none measured, none.
    #[test]
    fn a_reduce_costs_the_ranks_mean_weighted_by_pace() {
        let r = |exposed_ms, steps, wall_ms| RankExposure { exposed_ms, steps, wall_ms };
        let cases: [(Vec<RankExposure>, Option<f64>); 5] = [
            (vec![r(Some(40.0), 25, 100.0), r(Some(100.0), 10, 100.0)], Some(20.0 / 0.35)),
            (vec![r(Some(40.0), 25, 100.0), r(None, 10, 100.0)], Some(40.0)),
            (vec![r(Some(40.0), 0, 0.0), r(Some(100.0), 0, 100.0)], Some(70.0)),
            (vec![r(None, 25, 100.0), r(None, 10, 100.0)], None),
            (Vec::new(), None),
        ];
        for (i, (ranks, want)) in cases.into_iter().enumerate() {
            let got = reduce_exposed_ms(&ranks);
            let close = match (got, want) {
                (Some(g), Some(w)) => (g - w).abs() < 1e-9,
                (g, w) => g == w,
            };
            assert!(close, "case {i}: {got:?}, want {want:?}");
        }
    }

    /// Hand-computed: a cycle of 4 fragments that cost [90, 6, 3, 9] ms around windows of 40
    /// ms: the mean, 27 ms, overhead 27/67. Values that are not finite and positive count as
    /// nothing; no value, or no window, is no overhead.
    #[test]
    fn the_exposed_part_is_averaged_over_the_cycle() {
        let cases = [
            (Exposure::new(vec![90.0, 6.0, 3.0, 9.0]), 40.0, 27.0, 27.0 / 67.0),
            (Exposure::of(10.0), 200.0, 10.0, 10.0 / 210.0),
            (
                Exposure::new(vec![f64::NAN, 50.0, -3.0]),
                40.0,
                50.0 / 3.0,
                (50.0 / 3.0) / (40.0 + 50.0 / 3.0),
            ),
            (Exposure::new(Vec::new()), 40.0, 0.0, 0.0),
            (Exposure::of(10.0), 0.0, 10.0, 0.0),
        ];
        for (i, (e, window, exposed, overhead)) in cases.into_iter().enumerate() {
            let (got, ov) = (e.exposed_ms(), e.overhead(window));
            assert!((got - exposed).abs() < 1e-12, "case {i}: exposed {got}, want {exposed}");
            assert!((ov - overhead).abs() < 1e-12, "case {i}: overhead {ov}, want {overhead}");
        }
    }
}

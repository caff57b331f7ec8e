//! Which rank evaluates the averaged model: the fastest, or a fixed one.

/// The rank that runs the evaluations (and so the eval callbacks' data) of a run.
///
/// Evaluating costs the elected rank its training time for as long as the test set takes; the
/// fastest rank finishes soonest, and under `Cadence`/`Async` ElChe gives it back a shorter
/// window at the next reduce, so the others do not wait for it.
///
/// In a cluster run the rule elects among the ranks of the controller's own process while one
/// lives (with the host backend, rank 0): the run reports the evaluation, and a rank in another
/// process could answer anything (its test set's checksum, its pace and its accuracy are its
/// word). Among the ranks of other processes only when none of those lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalRank {
    /// The live rank with the lowest measured time per batch (the lowest live rank until any
    /// is measured; ties go to the lower rank).
    #[default]
    Fastest,
    /// This rank while it lives; the fastest live rank after its death.
    Fixed(usize),
}

impl EvalRank {
    /// The elected rank among `live` (increasing), given each rank's measured ms per batch
    /// (indexed by rank; 0 or missing when not measured yet). `None` when no rank lives.
    pub fn elect(self, live: &[usize], ms_per_batch: &[f64]) -> Option<usize> {
        if let EvalRank::Fixed(rank) = self
            && live.contains(&rank)
        {
            return Some(rank);
        }
        let measured = |r: &usize| ms_per_batch.get(*r).copied().filter(|ms| *ms > 0.0);
        live.iter()
            .filter_map(|r| measured(r).map(|ms| (ms, *r)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, r)| r)
            .or_else(|| live.first().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::EvalRank;

    /// A case: the rule, the live ranks, their ms per batch, the expected election.
    type Case = (EvalRank, &'static [usize], &'static [f64], Option<usize>);

    /// Election by hand-picked cases: fastest measured, ties, unmeasured, fixed, dead fixed.
    #[test]
    fn elects_as_documented() {
        let cases: [Case; 8] = [
            (EvalRank::Fastest, &[0, 1, 2], &[3.0, 1.0, 2.0], Some(1)),
            (EvalRank::Fastest, &[0, 2], &[3.0, 1.0, 2.0], Some(2)),
            (EvalRank::Fastest, &[0, 1, 2], &[2.0, 2.0, 2.0], Some(0)),
            (EvalRank::Fastest, &[1, 2], &[0.0, 0.0, 0.0], Some(1)),
            (EvalRank::Fastest, &[0, 1], &[0.0, 5.0], Some(1)),
            (EvalRank::Fixed(2), &[0, 1, 2], &[1.0, 1.0, 9.0], Some(2)),
            (EvalRank::Fixed(2), &[0, 1], &[4.0, 1.0, 9.0], Some(1)),
            (EvalRank::Fixed(0), &[], &[], None),
        ];
        for (rule, live, ms, want) in cases {
            assert_eq!(rule.elect(live, ms), want, "{rule:?} {live:?} {ms:?}");
        }
    }
}

//! Where a rank's wall time went: a closed set of activities and their milliseconds.
//!
//! A rank measures its time as contiguous spans (see `runtime::engine::ledger`): each span's wall is
//! measured once, the activities inside it are timed where they happen, and what no activity
//! claims is [`Activity::Other`], so the parts of a span always sum to its wall. Spans travel in
//! the rank's [`WorkTally`](crate::control::metrics::WorkTally) and are summed per rank and
//! epoch into [`RankEpochMetrics::time`](crate::RankEpochMetrics::time).

use serde::{Deserialize, Serialize};

/// What a rank was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activity {
    /// Training steps: forward, backward, optimizer (an emulated slowdown included).
    Compute,
    /// Fetching and uploading batches, or waiting for the prefetcher.
    Data,
    /// Averaging: the collective, or the host round trip (snapshot, average, update) less
    /// what [`Activity::Exchange`] claims.
    Reduce,
    /// The exchange the rank could not train through: encoding its snapshot for the wire
    /// (quantizing it under `int8`/`q4`) and handing its frame to the connection (host
    /// backend; next to nothing in-process).
    Exchange,
    /// Waiting for the other ranks, for a window or for the coordinator.
    Waiting,
    /// Evaluating the test set.
    Evaluation,
    /// Capturing a checkpoint part and waiting for the bundle to be assembled.
    Checkpoint,
    /// Everything else (the loop itself, messages).
    Other,
}

impl Activity {
    /// Every activity, in display order.
    pub const ALL: [Activity; 8] = [
        Activity::Compute,
        Activity::Data,
        Activity::Reduce,
        Activity::Exchange,
        Activity::Waiting,
        Activity::Evaluation,
        Activity::Checkpoint,
        Activity::Other,
    ];

    /// The activity's name, as in the serialised breakdown.
    pub fn name(self) -> &'static str {
        match self {
            Activity::Compute => "compute",
            Activity::Data => "data",
            Activity::Reduce => "reduce",
            Activity::Exchange => "exchange",
            Activity::Waiting => "waiting",
            Activity::Evaluation => "evaluation",
            Activity::Checkpoint => "checkpoint",
            Activity::Other => "other",
        }
    }
}

impl std::fmt::Display for Activity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Milliseconds per [`Activity`]; their sum is the wall time they account for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeBreakdown {
    /// Training steps.
    pub compute_ms: f64,
    /// Batch fetch and upload.
    pub data_ms: f64,
    /// The collective or the host round trip.
    pub reduce_ms: f64,
    /// The exchange the rank could not train through.
    #[serde(default)]
    pub exchange_ms: f64,
    /// Waiting for others.
    pub waiting_ms: f64,
    /// Evaluation.
    pub evaluation_ms: f64,
    /// Checkpoint capture.
    pub checkpoint_ms: f64,
    /// Anything else.
    pub other_ms: f64,
}

impl TimeBreakdown {
    /// The milliseconds of `activity`.
    pub fn get(&self, activity: Activity) -> f64 {
        match activity {
            Activity::Compute => self.compute_ms,
            Activity::Data => self.data_ms,
            Activity::Reduce => self.reduce_ms,
            Activity::Exchange => self.exchange_ms,
            Activity::Waiting => self.waiting_ms,
            Activity::Evaluation => self.evaluation_ms,
            Activity::Checkpoint => self.checkpoint_ms,
            Activity::Other => self.other_ms,
        }
    }

    fn get_mut(&mut self, activity: Activity) -> &mut f64 {
        match activity {
            Activity::Compute => &mut self.compute_ms,
            Activity::Data => &mut self.data_ms,
            Activity::Reduce => &mut self.reduce_ms,
            Activity::Exchange => &mut self.exchange_ms,
            Activity::Waiting => &mut self.waiting_ms,
            Activity::Evaluation => &mut self.evaluation_ms,
            Activity::Checkpoint => &mut self.checkpoint_ms,
            Activity::Other => &mut self.other_ms,
        }
    }

    /// Adds `ms` to `activity` (non-finite or negative amounts are ignored).
    pub fn add(&mut self, activity: Activity, ms: f64) {
        if ms.is_finite() && ms > 0.0 {
            *self.get_mut(activity) += ms;
        }
    }

    /// Adds every part of `other`.
    pub fn merge(&mut self, other: &TimeBreakdown) {
        for a in Activity::ALL {
            self.add(a, other.get(a));
        }
    }

    /// The timed parts of a span of `wall_ms`, closed: what they leave of the wall becomes
    /// [`Activity::Other`]. When the timed parts exceed the wall (clock granularity), they are
    /// scaled down to it, so the result always sums to `wall_ms`.
    pub fn closed(mut self, wall_ms: f64) -> TimeBreakdown {
        let wall = if wall_ms.is_finite() { wall_ms.max(0.0) } else { 0.0 };
        let timed: f64 = Activity::ALL.iter().map(|&a| self.get(a)).sum();
        if timed > wall && timed > 0.0 {
            let k = wall / timed;
            for a in Activity::ALL {
                *self.get_mut(a) *= k;
            }
        } else {
            self.other_ms += wall - timed;
        }
        self
    }

    /// The wall time accounted for: the sum of the parts.
    pub fn wall_ms(&self) -> f64 {
        Activity::ALL.iter().map(|&a| self.get(a)).sum()
    }

    /// The fraction of the wall spent outside [`Activity::Compute`] (0 when there is none).
    pub fn non_compute_share(&self) -> f64 {
        let wall = self.wall_ms();
        if wall > 0.0 { (wall - self.compute_ms) / wall } else { 0.0 }
    }

    /// The fraction of the wall spent in `activity` (0 when there is none).
    pub fn share(&self, activity: Activity) -> f64 {
        let wall = self.wall_ms();
        if wall > 0.0 { self.get(activity) / wall } else { 0.0 }
    }

    /// The largest part other than compute and waiting: what the rank lost its own time to.
    fn largest_loss(&self) -> (Activity, f64) {
        Activity::ALL
            .iter()
            .filter(|a| !matches!(a, Activity::Compute | Activity::Waiting))
            .map(|&a| (a, self.get(a)))
            .fold((Activity::Other, 0.0), |best, x| if x.1 > best.1 { x } else { best })
    }
}

/// The rank that held the run back most, and the activity it lost its time to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Straggler {
    /// The rank.
    pub rank: usize,
    /// What kept it busy beyond the others: its largest part other than compute and waiting,
    /// or [`Activity::Compute`] when it is simply the slowest (no such part above
    /// `STRAGGLER_LOSS_SHARE` of its wall).
    pub activity: Activity,
    /// The fraction of its wall that activity took.
    pub share: f64,
    /// The largest fraction of their wall the other ranks spent waiting (for it, presumably).
    pub others_waiting: f64,
}

/// A rank's own loss (data, reduce, evaluation, checkpoint, other) below this share of its
/// wall does not name a cause: the rank is then slow at computing.
pub(crate) const STRAGGLER_LOSS_SHARE: f64 = 0.05;

/// The rank that held a run of `ranks` (per-rank totals, in rank order) back most: the one that
/// waited least for the others as a share of its wall (the others waited for it), with the
/// activity that kept it busy. `None` with fewer than two ranks with time.
pub fn straggler(ranks: &[TimeBreakdown]) -> Option<Straggler> {
    let timed: Vec<(usize, &TimeBreakdown)> =
        ranks.iter().enumerate().filter(|(_, t)| t.wall_ms() > 0.0).collect();
    if timed.len() < 2 {
        return None;
    }
    let waits = |t: &TimeBreakdown| t.share(Activity::Waiting);
    let (rank, t) = timed.iter().copied().fold(timed[0], |best, x| {
        // Ties go to the lower rank (the fold keeps the first minimum).
        if waits(x.1) < waits(best.1) { x } else { best }
    });
    let (loss, ms) = t.largest_loss();
    let wall = t.wall_ms();
    let (activity, share) = if ms / wall >= STRAGGLER_LOSS_SHARE {
        (loss, ms / wall)
    } else {
        (Activity::Compute, t.share(Activity::Compute))
    };
    let others_waiting =
        timed.iter().filter(|(r, _)| *r != rank).map(|(_, t)| waits(t)).fold(0.0, f64::max);
    Some(Straggler { rank, activity, share, others_waiting })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A breakdown of every activity but the exchange, in display order.
    fn parts(values: [f64; 7]) -> TimeBreakdown {
        let mut t = TimeBreakdown::default();
        let activities = Activity::ALL.into_iter().filter(|&a| a != Activity::Exchange);
        for (a, v) in activities.zip(values) {
            t.add(a, v);
        }
        t
    }

    /// A closed span sums to its wall, whether the timed parts fall short of it or exceed it.
    #[test]
    fn closed_spans_sum_to_their_wall() -> Result<(), String> {
        let cases = [
            ([5.0, 1.0, 2.0, 0.5, 0.0, 0.0, 0.0], 10.0, 1.5),
            ([5.0, 1.0, 2.0, 0.5, 0.0, 0.0, 0.0], 8.5, 0.0),
            ([6.0, 6.0, 0.0, 0.0, 0.0, 0.0, 0.0], 10.0, 0.0),
            ([0.0; 7], 3.0, 3.0),
            ([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], f64::NAN, 0.0),
        ];
        for (values, wall, other) in cases {
            let t = parts(values).closed(wall);
            let want = if wall.is_finite() { wall } else { 0.0 };
            if (t.wall_ms() - want).abs() > 1e-9 || (t.other_ms - other).abs() > 1e-9 {
                return Err(format!("{values:?} closed at {wall}: {t:?}"));
            }
        }
        Ok(())
    }

    /// Merging adds part by part; bad amounts are ignored; shares are fractions of the sum.
    #[test]
    fn merge_and_shares() -> Result<(), String> {
        let mut a = parts([4.0, 1.0, 0.0, 3.0, 0.0, 0.0, 2.0]);
        a.add(Activity::Data, f64::INFINITY);
        a.add(Activity::Data, -1.0);
        a.merge(&parts([6.0, 0.0, 2.0, 1.0, 0.0, 1.0, 0.0]));
        let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
        if !close(a.wall_ms(), 20.0)
            || !close(a.non_compute_share(), 0.5)
            || !close(a.share(Activity::Waiting), 0.2)
        {
            return Err(format!("{a:?}"));
        }
        Ok(())
    }

    /// The straggler is the rank that waited least; its cause is its largest own loss, or
    /// compute when it has none worth naming.
    #[test]
    fn straggler_is_the_rank_the_others_waited_for() -> Result<(), String> {
        // (ranks' parts, expected rank and activity)
        type Case = (Vec<[f64; 7]>, Option<(usize, Activity)>);
        let cases: Vec<Case> = vec![
            // Rank 1 fetches slowly; rank 0 waits for it.
            (
                vec![[50.0, 1.0, 2.0, 45.0, 0.0, 0.0, 2.0], [50.0, 45.0, 2.0, 1.0, 0.0, 0.0, 2.0]],
                Some((1, Activity::Data)),
            ),
            // Rank 0 is a slower device: the others wait, it only computes.
            (
                vec![
                    [95.0, 1.0, 2.0, 1.0, 0.0, 0.0, 1.0],
                    [40.0, 1.0, 2.0, 56.0, 0.0, 0.0, 1.0],
                    [40.0, 1.0, 2.0, 55.0, 0.0, 0.0, 2.0],
                ],
                Some((0, Activity::Compute)),
            ),
            // Rank 2 evaluates on everyone's critical path.
            (
                vec![
                    [60.0, 1.0, 2.0, 36.0, 0.0, 0.0, 1.0],
                    [60.0, 1.0, 2.0, 36.0, 0.0, 0.0, 1.0],
                    [60.0, 1.0, 2.0, 2.0, 34.0, 0.0, 1.0],
                ],
                Some((2, Activity::Evaluation)),
            ),
            (vec![[10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], None),
            (vec![[10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0; 7]], None),
        ];
        for (ranks, want) in cases {
            let ts: Vec<TimeBreakdown> = ranks.iter().map(|v| parts(*v)).collect();
            let got = straggler(&ts).map(|s| (s.rank, s.activity));
            if got != want {
                return Err(format!("{ranks:?}: {got:?}, want {want:?}"));
            }
        }
        Ok(())
    }

    /// The breakdown serialises with one named field per activity.
    #[test]
    fn serialises_with_named_fields() -> Result<(), String> {
        let t = parts([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        let json = serde_json::to_value(t).map_err(|e| e.to_string())?;
        for a in Activity::ALL {
            let key = format!("{}_ms", a.name());
            if json.get(&key).and_then(serde_json::Value::as_f64) != Some(t.get(a)) {
                return Err(format!("{key} missing in {json}"));
            }
        }
        Ok(())
    }
}

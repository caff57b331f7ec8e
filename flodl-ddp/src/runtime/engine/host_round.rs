//! The host backend's averaging round: collect snapshots under a deadline, average on a helper
//! thread, hand the average back.

use std::time::{Duration, Instant};

use crate::control::change::Change;
use crate::control::fragment::Fragments;
use crate::control::weighting::{AverageWeights, average_weights};
use crate::link::wire::Window;
use crate::state::HostState;
use crate::{Error, Result};

/// A host averaging round (`Idle` is the coordinator's `Reduce::Idle`).
#[derive(Debug)]
pub(crate) enum HostRound {
    /// Waiting for every rank's snapshot until `deadline`.
    Collecting {
        round: u64,
        attempt: u32,
        deadline: Instant,
        started: Instant,
        snaps: Vec<Slot>,
        plan: RoundPlan,
    },
    /// The helper thread is averaging.
    Computing { round: u64, started: Instant, steps: Vec<usize>, plan: RoundPlan },
    /// Transient state while moving between the two.
    Moving,
}

/// A rank's snapshot in a round being collected.
#[derive(Debug)]
pub(crate) enum Slot {
    /// Not in yet.
    Waiting,
    /// In: the state and the steps it carries.
    Got(HostState, usize),
    /// The rank is dead: nothing is expected from it.
    Gone,
}

/// What follows a round: the next windows, the evaluation request and the ending window's
/// planned counts; and the fragment it syncs (`None`: the whole model).
#[derive(Debug, Clone)]
pub(crate) struct RoundPlan {
    next: Vec<Window>,
    eval: Option<usize>,
    counts: Vec<usize>,
    fragment: Option<usize>,
}

/// Snapshots ready to be averaged.
#[derive(Debug)]
pub(crate) struct AverageJob {
    pub(crate) round: u64,
    pub(crate) states: Vec<HostState>,
    pub(crate) steps: Vec<usize>,
    /// The rank of each state.
    pub(crate) ranks: Vec<usize>,
    /// The fragment the states are the parts of (`None`: whole states).
    pub(crate) fragment: Option<usize>,
}

/// A finished round, as the coordinator completes it.
#[derive(Debug)]
pub(crate) struct RoundDone {
    pub(crate) round: u64,
    pub(crate) started: Instant,
    pub(crate) next: Vec<Window>,
    pub(crate) eval: Option<usize>,
    pub(crate) counts: Vec<usize>,
    pub(crate) steps: Vec<usize>,
    pub(crate) fragment: Option<usize>,
}

/// A host round's headstart: snapshots ordered before the round is triggered, from ranks that
/// train no more in their window (the anchor of `Cadence` or `Async` once it is ready,
/// `Window::anchored`), so that they travel while the followers finish their last batch. The
/// trigger hands it to its round ([`HostRound::take_headstart`]).
#[derive(Debug)]
pub(crate) struct Headstart {
    round: u64,
    fragment: Option<usize>,
    /// The ranks ordered, attempt 0.
    ordered: Vec<usize>,
    /// The snapshots in: rank, state, steps.
    snaps: Vec<(usize, HostState, usize)>,
}

/// What a [`Headstart`] is to the round that takes it.
#[derive(Debug)]
pub(crate) enum Taken {
    /// It serves the round: these ranks are ordered already (their snapshots kept or still
    /// coming), and the job to average when every snapshot is in.
    Serves { ordered: Vec<usize>, job: Option<AverageJob> },
    /// The round syncs another part (the run's end came near) or captures a checkpoint (one
    /// came due): every rank is ordered again, under this attempt.
    Superseded { attempt: u32 },
}

impl Headstart {
    /// The orders of `ordered`'s snapshots (of `fragment`, `None`: whole) for `round`, attempt 0.
    pub(crate) fn new(round: u64, fragment: Option<usize>, ordered: Vec<usize>) -> Headstart {
        Headstart { round, fragment, ordered, snaps: Vec::new() }
    }

    /// The fragment its snapshots are the parts of (`None`: whole states).
    pub(crate) fn fragment(&self) -> Option<usize> {
        self.fragment
    }

    /// Whether it takes a snapshot of `rank` for `round` and `attempt` (as
    /// [`HostRound::admits`]: `None` is one no honest rank sends).
    pub(crate) fn admits(&self, rank: usize, round: u64, attempt: u32) -> Option<bool> {
        let owed = self.ordered.contains(&rank) && !self.snaps.iter().any(|s| s.0 == rank);
        (round == self.round && attempt == 0 && owed).then_some(true)
    }

    /// Keeps `rank`'s snapshot, when [`admits`](Self::admits) takes it.
    pub(crate) fn keep(
        &mut self,
        rank: usize,
        round: u64,
        attempt: u32,
        state: HostState,
        steps: usize,
    ) {
        if self.admits(rank, round, attempt) == Some(true) {
            self.snaps.push((rank, state, steps));
        }
    }
}

impl HostRound {
    /// Takes `headstart` in: when it is of this round's number and part, and the round
    /// `captures` no checkpoint (a headstart's snapshots carry no checkpoint part), the round
    /// holds its snapshots (those of ranks it waits for) and its ranks need no order;
    /// otherwise its snapshots are dropped and the round moves to the next attempt, so a late
    /// one of them is dropped too.
    pub(crate) fn take_headstart(&mut self, headstart: Headstart, captures: bool) -> Taken {
        let HostRound::Collecting { round, attempt, snaps, plan, .. } = self else {
            return Taken::Superseded { attempt: 0 };
        };
        let serves = headstart.round == *round && headstart.fragment == plan.fragment;
        if !serves || captures || *attempt != 0 {
            *attempt += 1;
            return Taken::Superseded { attempt: *attempt };
        }
        for (rank, state, steps) in headstart.snaps {
            if let Some(slot @ Slot::Waiting) = snaps.get_mut(rank) {
                *slot = Slot::Got(state, steps);
            }
        }
        Taken::Serves { ordered: headstart.ordered, job: self.job_if_complete() }
    }

    /// A round of `world` seats that collects the snapshots (of `fragment`, `None`: whole) of
    /// the `live` ones until `deadline`.
    #[allow(clippy::too_many_arguments, reason = "the round's plan, given once")]
    pub(crate) fn new(
        round: u64,
        world: usize,
        live: &[usize],
        deadline: Instant,
        next: Vec<Window>,
        eval: Option<usize>,
        counts: Vec<usize>,
        fragment: Option<usize>,
    ) -> HostRound {
        HostRound::Collecting {
            round,
            attempt: 0,
            deadline,
            started: Instant::now(),
            snaps: (0..world)
                .map(|r| if live.contains(&r) { Slot::Waiting } else { Slot::Gone })
                .collect(),
            plan: RoundPlan { next, eval, counts, fragment },
        }
    }

    /// The fragment the round syncs (`None`: the whole model, or no round).
    pub(crate) fn fragment(&self) -> Option<usize> {
        match self {
            HostRound::Collecting { plan, .. } | HostRound::Computing { plan, .. } => plan.fragment,
            HostRound::Moving => None,
        }
    }

    /// Time until the snapshot deadline (the maximum while averaging).
    pub(crate) fn time_left(&self) -> Duration {
        match self {
            HostRound::Collecting { deadline, .. } => {
                deadline.saturating_duration_since(Instant::now())
            }
            _ => Duration::MAX,
        }
    }

    /// Takes a snapshot (the first per rank of the current attempt wins); returns the job to
    /// average once every rank's is in.
    pub(crate) fn collect(
        &mut self,
        rank: usize,
        round: u64,
        attempt: u32,
        state: HostState,
        steps: usize,
    ) -> Option<AverageJob> {
        let HostRound::Collecting { round: r, attempt: a, snaps, .. } = self else { return None };
        if *r != round || *a != attempt {
            return None;
        }
        if let Some(slot @ Slot::Waiting) = snaps.get_mut(rank) {
            *slot = Slot::Got(state, steps);
        }
        self.job_if_complete()
    }

    /// What a snapshot of `rank` for `round` and `attempt` is to this round: `Some(true)` one it
    /// takes, `Some(false)` one late for an earlier attempt of it (dropped, no fault), `None`
    /// one no honest rank sends (a closed or future round or attempt, a second for the
    /// attempt: a replay).
    pub(crate) fn admits(&self, rank: usize, round: u64, attempt: u32) -> Option<bool> {
        match self {
            HostRound::Collecting { round: r, attempt: a, snaps, .. } if *r == round => {
                if attempt < *a {
                    Some(false)
                } else if attempt == *a && matches!(snaps.get(rank), Some(Slot::Waiting)) {
                    Some(true)
                } else {
                    None
                }
            }
            _ => None,
        }
    }

    /// Follows a change of the run's members: a rank out of the run is no longer waited for
    /// (its snapshot dropped if it came), and the job to average is returned when the other
    /// snapshots are all in. A rank joined again is admitted between rounds: this round does
    /// not wait for it.
    pub(crate) fn apply(&mut self, change: &Change) -> Option<AverageJob> {
        let HostRound::Collecting { snaps, .. } = self else { return None };
        match *change {
            Change::Vacated { rank, .. } | Change::Died { rank, .. } => {
                if let Some(slot) = snaps.get_mut(rank) {
                    *slot = Slot::Gone;
                }
                self.job_if_complete()
            }
            Change::Joined { .. } => None,
        }
    }

    /// The steps of `rank` that the average being computed holds (0 while snapshots are
    /// collected: a dead rank's is dropped then).
    pub(crate) fn averaging_steps(&self, rank: usize) -> usize {
        match self {
            HostRound::Computing { steps, .. } => steps.get(rank).copied().unwrap_or(0),
            _ => 0,
        }
    }

    /// The ranks whose snapshots the current attempt still waits for.
    pub(crate) fn missing(&self) -> Vec<usize> {
        match self {
            HostRound::Collecting { snaps, .. } => {
                (0..snaps.len()).filter(|&r| matches!(snaps[r], Slot::Waiting)).collect()
            }
            _ => Vec::new(),
        }
    }

    /// The round's number and how long it has been running.
    pub(crate) fn age(&self) -> Option<(u64, Duration)> {
        match self {
            HostRound::Collecting { round, started, .. }
            | HostRound::Computing { round, started, .. } => Some((*round, started.elapsed())),
            HostRound::Moving => None,
        }
    }

    /// Moves to `Computing` once no snapshot is awaited (and one at least came); the job holds
    /// the snapshots that came, the round keeps every rank's steps (0 for the dead).
    fn job_if_complete(&mut self) -> Option<AverageJob> {
        let HostRound::Collecting { snaps, .. } = self else { return None };
        if snaps.iter().any(|s| matches!(s, Slot::Waiting))
            || !snaps.iter().any(|s| matches!(s, Slot::Got(..)))
        {
            return None;
        }
        let HostRound::Collecting { round, started, snaps, plan, .. } =
            std::mem::replace(self, HostRound::Moving)
        else {
            return None;
        };
        let all_steps: Vec<usize> =
            snaps.iter().map(|s| if let Slot::Got(_, n) = s { *n } else { 0 }).collect();
        let (mut states, mut steps, mut ranks) = (Vec::new(), Vec::new(), Vec::new());
        for (rank, slot) in snaps.into_iter().enumerate() {
            if let Slot::Got(state, n) = slot {
                states.push(state);
                steps.push(n);
                ranks.push(rank);
            }
        }
        let fragment = plan.fragment;
        *self = HostRound::Computing { round, started, steps: all_steps, plan };
        Some(AverageJob { round, states, steps, ranks, fragment })
    }

    /// The helper thread finished `round`: the round is done.
    pub(crate) fn averaged(&mut self, round: u64) -> Option<RoundDone> {
        if !matches!(self, HostRound::Computing { round: r, .. } if *r == round) {
            return None;
        }
        let HostRound::Computing { round, started, steps, plan } =
            std::mem::replace(self, HostRound::Moving)
        else {
            return None;
        };
        Some(RoundDone {
            round,
            started,
            next: plan.next,
            eval: plan.eval,
            counts: plan.counts,
            steps,
            fragment: plan.fragment,
        })
    }

    /// Bytes of `rank`'s awaited snapshot came `at` (a large state crossing a slow link): the
    /// deadline is one of silence, so it is `timeout` after them at the soonest.
    pub(crate) fn arriving(&mut self, rank: usize, at: Instant, timeout: Duration) {
        if let HostRound::Collecting { deadline, snaps, .. } = self
            && matches!(snaps.get(rank), Some(Slot::Waiting))
        {
            *deadline = (*deadline).max(at + timeout);
        }
    }

    /// Soft abort: when the snapshot deadline has passed, drops what was collected and starts a
    /// new attempt with a fresh deadline; returns the round and the new attempt to request.
    pub(crate) fn retry_if_late(&mut self, timeout: Duration) -> Option<(u64, u32)> {
        let HostRound::Collecting { round, attempt, deadline, snaps, .. } = self else {
            return None;
        };
        if Instant::now() < *deadline {
            return None;
        }
        *attempt += 1;
        *deadline = Instant::now() + timeout;
        for s in snaps.iter_mut() {
            if matches!(s, Slot::Got(..)) {
                *s = Slot::Waiting;
            }
        }
        Some((*round, *attempt))
    }
}

/// The work-weighted average of `states` ([`average_weights`] with exponent `gamma`):
/// parameters weighted by `steps^γ` (ranks with no step excluded), buffers averaged equally over
/// the ranks that stepped, accumulated in rank order.
///
/// # Errors
/// [`Error::ReplicaMismatch`] when no rank stepped or the states disagree in layout;
/// [`Error::Logic`] for a bad γ.
pub(crate) fn average(states: &[HostState], steps: &[usize], gamma: f64) -> Result<HostState> {
    let first = states
        .first()
        .ok_or_else(|| Error::mismatch("snapshots to average", "at least one", "none"))?;
    let weights = round_weights(states.len(), steps, gamma)?;
    let params =
        weighted(states.iter().map(|s| &s.params).collect(), &weights.params, first.params.len())?;
    let buffers = weighted(
        states.iter().map(|s| &s.buffers).collect(),
        &weights.buffers,
        first.buffers.len(),
    )?;
    Ok(HostState { params, buffers })
}

/// [`average`] fragment by fragment (`--fragments`): fragment k's parameters weighted by
/// `weights[k]` (one count per state; all zero: equally), the buffers as fragment 0's average
/// has them. Each fragment's runs are summed where they lie in the states, into the output:
/// the same sums, in the same order, as averaging each fragment's part apart.
///
/// # Errors
/// As [`average`]; [`Error::Logic`] when a state does not fit the cut; a mismatch when
/// `weights` does not hold one list per fragment.
pub(crate) fn average_fragments(
    states: &[HostState],
    cut: &Fragments,
    weights: &[Vec<usize>],
    gamma: f64,
) -> Result<HostState> {
    let first = states
        .first()
        .ok_or_else(|| Error::mismatch("states to average", "at least one", "none"))?;
    if weights.len() != cut.len() {
        return Err(Error::mismatch("weight lists, one per fragment", cut.len(), weights.len()));
    }
    for state in states {
        cut.fits(&state.params, "a whole state to average")?;
    }
    let mut params: Vec<Vec<f32>> = first.params.iter().map(|v| vec![0.0; v.len()]).collect();
    let mut buffers = Vec::new();
    for (k, w) in weights.iter().enumerate() {
        let equal = vec![1; w.len()];
        let w = if w.iter().all(|&n| n == 0) { &equal } else { w };
        let round = round_weights(states.len(), w, gamma)?;
        if k == 0 {
            let sets = states.iter().map(|s| &s.buffers).collect();
            buffers = weighted(sets, &round.buffers, first.buffers.len())?;
        }
        for p in cut.pieces(k) {
            let runs = states.iter().map(|s| &s.params[p.tensor][p.range()]);
            accumulate(&mut params[p.tensor][p.range()], runs.zip(round.params.iter().copied()));
        }
    }
    Ok(HostState { params, buffers })
}

/// `max_r ‖W_r − W_avg‖ / ‖W_avg‖` over the parameters of the ranks that stepped (f64
/// accumulation; 0 when the average is all but zero).
pub(crate) fn divergence(states: &[HostState], steps: &[usize], avg: &HostState) -> f64 {
    let post: f64 = avg.params.iter().flatten().map(|&x| f64::from(x) * f64::from(x)).sum();
    let post = post.sqrt();
    states
        .iter()
        .zip(steps)
        .filter(|(_, s)| **s > 0)
        .map(|(state, _)| {
            let diff: f64 = state
                .params
                .iter()
                .zip(&avg.params)
                .flat_map(|(a, b)| a.iter().zip(b))
                .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
                .sum();
            crate::control::guard::divergence(diff.sqrt(), post)
        })
        .fold(0.0, f64::max)
}

/// The weights of a round over `states` snapshots with `steps` each (one per snapshot).
///
/// # Errors
/// A mismatch when no rank stepped or the counts differ; [`Error::Logic`] for a bad γ.
fn round_weights(states: usize, steps: &[usize], gamma: f64) -> Result<AverageWeights> {
    let counts: Vec<u64> = steps.iter().map(|&s| s as u64).collect();
    match average_weights(&counts, gamma)?.filter(|_| states == steps.len()) {
        Some(weights) => Ok(weights),
        None => Err(Error::mismatch(
            "ranks that stepped, in a host average",
            "at least one, with one step count per snapshot",
            format!("{states} snapshots, steps {steps:?}"),
        )),
    }
}

/// Adds `w·x` of each run of `runs` into `acc`, in order (a run of weight 0 is skipped).
fn accumulate<'a>(acc: &mut [f32], runs: impl Iterator<Item = (&'a [f32], f32)>) {
    for (run, w) in runs.filter(|&(_, w)| w != 0.0) {
        for (a, &x) in acc.iter_mut().zip(run) {
            *a += w * x;
        }
    }
}

fn weighted(sets: Vec<&Vec<Vec<f32>>>, weights: &[f32], n: usize) -> Result<Vec<Vec<f32>>> {
    if sets.iter().any(|s| s.len() != n) {
        let counts: Vec<usize> = sets.iter().map(|s| s.len()).collect();
        return Err(Error::mismatch("tensors per snapshot", n, format!("{counts:?}")));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let len = sets[0][i].len();
        if sets.iter().any(|s| s[i].len() != len) {
            let sizes: Vec<usize> = sets.iter().map(|s| s[i].len()).collect();
            return Err(Error::mismatch(
                "a tensor's size across snapshots",
                format!("{len} values in tensor {i}"),
                format!("{sizes:?}"),
            ));
        }
        let mut acc = vec![0.0f32; len];
        let runs = sets.iter().map(|s| s[i].as_slice());
        accumulate(&mut acc, runs.zip(weights.iter().copied()));
        out.push(acc);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    /// `count` states of parameter tensors of `sizes` and one buffer of `buffer` values, every
    /// value uniform in [-1, 1).
    fn random_states(
        rng: &mut Xoshiro256PlusPlus,
        count: usize,
        sizes: &[usize],
        buffer: usize,
    ) -> Vec<HostState> {
        let mut values =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
        (0..count)
            .map(|_| HostState {
                params: sizes.iter().map(|&n| values(n)).collect(),
                buffers: vec![values(buffer)],
            })
            .collect()
    }

    /// The host average against its closed form in f64 (`Σ n_r^γ·W_r / Σ n_r^γ` for
    /// parameters, the plain mean over ranks that stepped for buffers) on random states, step
    /// counts (some zero) and exponents γ.
    #[test]
    fn average_matches_f64_reference() -> Result<()> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
        for case in 0..60 {
            let gamma = [0.0, 0.5, 1.0, 2.0][case % 4];
            let world = rng.random_range(1..6);
            let sizes: Vec<usize> =
                (0..rng.random_range(1..4)).map(|_| rng.random_range(1..50)).collect();
            let mut steps: Vec<usize> = (0..world).map(|_| rng.random_range(0..5)).collect();
            steps[0] += 1;
            let states = random_states(&mut rng, world, &sizes, 3);
            let avg = average(&states, &steps, gamma)?;
            let mass = |k: usize| if k == 0 { 0.0 } else { (k as f64).powf(gamma) };
            let total: f64 = steps.iter().map(|&s| mass(s)).sum();
            let movers = steps.iter().filter(|&&s| s > 0).count() as f64;
            for (i, &n) in sizes.iter().enumerate() {
                for j in 0..n {
                    let want: f64 = states
                        .iter()
                        .zip(&steps)
                        .map(|(s, &k)| mass(k) / total * f64::from(s.params[i][j]))
                        .sum();
                    assert!(
                        (f64::from(avg.params[i][j]) - want).abs() < 1e-5,
                        "γ {gamma}: param {i}[{j}]"
                    );
                }
            }
            for j in 0..3 {
                let want: f64 = states
                    .iter()
                    .zip(&steps)
                    .filter(|(_, k)| **k > 0)
                    .map(|(s, _)| f64::from(s.buffers[0][j]) / movers)
                    .sum();
                assert!((f64::from(avg.buffers[0][j]) - want).abs() < 1e-5, "buffer {j}");
            }
        }
        Ok(())
    }

    /// Fragment by fragment, on random shapes cut into random counts (runs splitting tensors
    /// among them): each fragment's parameters are, bit for bit, [`average`] of its parts by
    /// its own weights (equal when all zero), the buffers fragment 0's. A state of another
    /// layout is refused.
    #[test]
    fn fragments_average_by_their_own_weights() -> Result<()> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(31);
        for case in 0..40 {
            let sizes: Vec<usize> = (0..rng.random_range(1..6))
                .map(|_| if rng.random_range(0..5) == 0 { 0 } else { rng.random_range(1..60) })
                .collect();
            let total: usize = sizes.iter().sum();
            if total == 0 {
                continue;
            }
            let ranks = rng.random_range(1..4);
            let states = random_states(&mut rng, ranks, &sizes, 2);
            let cut = Fragments::cut(&sizes, rng.random_range(1..=total.min(7)))?;
            let weights: Vec<Vec<usize>> = (0..cut.len())
                .map(|_| (0..ranks).map(|_| rng.random_range(0..4)).collect())
                .collect();
            let avg = average_fragments(&states, &cut, &weights, 1.0)?;
            for (k, w) in weights.iter().enumerate() {
                let parts = states
                    .iter()
                    .map(|s| cut.part(k, s))
                    .collect::<crate::LogicResult<Vec<_>>>()?;
                let w = if w.iter().all(|&n| n == 0) { vec![1; ranks] } else { w.clone() };
                let want = average(&parts, &w, 1.0)?;
                assert_eq!(cut.part(k, &avg)?.params, want.params, "case {case}, fragment {k}");
                if k == 0 {
                    assert_eq!(avg.buffers, want.buffers, "case {case}");
                }
            }
            let mut other = states.clone();
            other[0].params.push(vec![0.0]);
            assert!(average_fragments(&other, &cut, &weights, 1.0).is_err(), "case {case}");
        }
        Ok(())
    }

    #[test]
    fn late_round_retries_with_a_new_attempt() {
        let mut r = HostRound::new(3, 2, &[0, 1], Instant::now(), vec![], None, vec![], None);
        assert!(r.collect(0, 3, 0, HostState::default(), 1).is_none());
        assert_eq!(r.retry_if_late(Duration::from_secs(60)), Some((3, 1)));
        // a snapshot of the aborted attempt no longer counts
        assert!(r.collect(1, 3, 0, HostState::default(), 1).is_none());
        assert!(r.collect(0, 3, 1, HostState::default(), 1).is_none());
        assert!(r.collect(1, 3, 1, HostState::default(), 1).is_some());
        assert!(r.averaged(3).is_some());
    }

    /// A headstart on random worlds, orders and parts: when it is of the round's number and
    /// part and the round captures no checkpoint, the round holds the snapshots that came
    /// ahead (each once, the state and steps as sent) and needs orders only for the others; a
    /// snapshot of an ordered rank may still come after the trigger, as the same attempt. When
    /// its part is not the round's or the round captures, the round asks everyone under
    /// attempt 1 and a late ahead snapshot is dropped, not taken. A headstart takes nothing
    /// from a rank not ordered, of another round or attempt, or twice.
    #[test]
    fn a_headstart_serves_its_round_or_is_superseded() -> std::result::Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(31);
        let state = |v: f32| HostState { params: vec![vec![v; 3]], buffers: Vec::new() };
        for case in 0..300 {
            let world = rng.random_range(2..6);
            let live: Vec<usize> = (0..world).collect();
            let ordered: Vec<usize> =
                live.iter().copied().filter(|_| rng.random_bool(0.4)).collect();
            let part = [None, Some(0), Some(1)][rng.random_range(0..3)];
            let round_part = if rng.random_bool(0.7) { part } else { [None, Some(2)][case % 2] };
            let mut ahead = Headstart::new(9, part, ordered.clone());
            // Some of the ordered ranks' snapshots come before the trigger, with a replay.
            let mut came = Vec::new();
            for &r in &ordered {
                if rng.random_bool(0.5) {
                    if ahead.admits(r, 9, 0) != Some(true) {
                        return Err(format!("case {case}: rank {r} ordered, refused"));
                    }
                    ahead.keep(r, 9, 0, state(r as f32), r + 1);
                    came.push(r);
                    if ahead.admits(r, 9, 0).is_some() {
                        return Err(format!("case {case}: rank {r}'s second snapshot admitted"));
                    }
                }
            }
            let unordered = live.iter().find(|r| !ordered.contains(r));
            let stray = [unordered.map(|&r| (r, 9, 0)), Some((0, 8, 0)), Some((0, 9, 1))];
            if let Some((r, round, attempt)) = stray
                .into_iter()
                .flatten()
                .find(|&(r, round, attempt)| ahead.admits(r, round, attempt).is_some())
            {
                return Err(format!(
                    "case {case}: admits rank {r}, round {round}, attempt {attempt}"
                ));
            }
            let mut hr =
                HostRound::new(9, world, &live, Instant::now(), vec![], None, vec![], round_part);
            let captures = rng.random_bool(0.2);
            let serves = round_part == part && !captures;
            let owed: Vec<usize> = match (hr.take_headstart(ahead, captures), serves) {
                (Taken::Serves { ordered: o, job }, true) => {
                    if o != ordered || job.is_some() != (came.len() == world) {
                        return Err(format!(
                            "case {case}: served {o:?} of {ordered:?}, job {}",
                            job.is_some()
                        ));
                    }
                    live.iter().copied().filter(|r| !came.contains(r)).collect()
                }
                (Taken::Superseded { attempt: 1 }, false) => live.clone(),
                (taken, _) => {
                    return Err(format!("case {case}: {taken:?}, parts {part:?} / {round_part:?}"));
                }
            };
            let attempt = u32::from(!serves);
            let late = ordered.iter().find(|r| !came.contains(r));
            if let (false, Some(&r)) = (serves, late)
                && (hr.admits(r, 9, 0) != Some(false)
                    || hr.collect(r, 9, 0, state(-1.0), 1).is_some())
            {
                return Err(format!("case {case}: a late ahead snapshot of rank {r} taken"));
            }
            let mut job = None;
            for &r in &owed {
                if hr.admits(r, 9, attempt) != Some(true) {
                    return Err(format!("case {case}: rank {r}, attempt {attempt}, refused"));
                }
                job = hr.collect(r, 9, attempt, state(r as f32), r + 1);
            }
            let job = match job {
                Some(job) => job,
                None if owed.is_empty() => continue,
                None => return Err(format!("case {case}: no job with every snapshot in")),
            };
            if job.ranks != live
                || job.steps != live.iter().map(|r| r + 1).collect::<Vec<_>>()
                || job.states.iter().zip(&live).any(|(s, &r)| s.params[0][0] != r as f32)
            {
                return Err(format!("case {case}: job of {:?}, steps {:?}", job.ranks, job.steps));
            }
        }
        Ok(())
    }

    /// The deadline is one of silence: bytes of an awaited snapshot push it to a timeout after
    /// them; bytes from a rank whose snapshot is in, or from long ago, do not.
    #[test]
    fn a_snapshot_still_arriving_is_not_late() -> std::result::Result<(), String> {
        let (t, timeout) = (Instant::now(), Duration::from_secs(60));
        let long_ago = t.checked_sub(Duration::from_secs(120)).ok_or("no clock before")?;
        // (rank whose bytes came, when, whether the round is late after)
        let cases = [(1, t, false), (0, t, true), (1, long_ago, true), (2, t, true)];
        for (case, (rank, at, late)) in cases.into_iter().enumerate() {
            let mut r = HostRound::new(3, 2, &[0, 1], t, vec![], None, vec![], None);
            if r.collect(0, 3, 0, HostState::default(), 1).is_some() {
                return Err(format!("case {case}: a job with rank 1 missing"));
            }
            r.arriving(rank, at, timeout);
            if r.retry_if_late(timeout).is_some() != late {
                return Err(format!("case {case}: rank {rank}'s bytes, late = {}", !late));
            }
        }
        Ok(())
    }

    /// Snapshots arrive and ranks die in random orders (some dying after their snapshot came):
    /// the job comes exactly when every live rank's snapshot is in, holds exactly the live
    /// ranks' snapshots (in rank order), and the finished round reports 0 steps for the others.
    #[test]
    fn dead_ranks_are_not_waited_for() -> std::result::Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(23);
        for case in 0..500 {
            let world = rng.random_range(1..7);
            let live: Vec<usize> = (0..world).collect();
            let mut r = HostRound::new(9, world, &live, Instant::now(), vec![], None, vec![], None);
            let mut events: Vec<(usize, bool)> = (0..world).map(|rank| (rank, false)).collect();
            events.extend((0..world).filter(|_| rng.random_bool(0.3)).map(|rank| (rank, true)));
            for i in (1..events.len()).rev() {
                let j = rng.random_range(0..=i);
                events.swap(i, j);
            }
            let (mut sent, mut dead) = (vec![false; world], vec![false; world]);
            let mut job = None;
            for (rank, dies) in events {
                let state = HostState { params: vec![vec![rank as f32]], buffers: vec![] };
                let out = if dies {
                    dead[rank] = true;
                    r.apply(&Change::Died { rank, at: Instant::now(), held: 0 })
                } else {
                    sent[rank] = true;
                    r.collect(rank, 9, 0, state, rank + 1)
                };
                let live_in: Vec<usize> = (0..world).filter(|&q| sent[q] && !dead[q]).collect();
                let waiting = (0..world).any(|q| !dead[q] && !sent[q]);
                match out {
                    Some(j) if job.is_none() && !waiting && !live_in.is_empty() => {
                        job = Some((j, live_in));
                    }
                    Some(_) => return Err(format!("case {case}: a job too early or twice")),
                    None if job.is_none() && !waiting && !live_in.is_empty() => {
                        return Err(format!("case {case}: no job once every live rank is in"));
                    }
                    None => {}
                }
            }
            let Some((job, live_in)) = job else {
                if (0..world).all(|q| dead[q]) {
                    continue;
                }
                return Err(format!("case {case}: never averaged"));
            };
            let ranks: Vec<usize> = job.states.iter().map(|s| s.params[0][0] as usize).collect();
            if ranks != live_in || job.steps != ranks.iter().map(|q| q + 1).collect::<Vec<_>>() {
                return Err(format!("case {case}: job of {ranks:?}, live and in {live_in:?}"));
            }
            let done = r.averaged(9).ok_or(format!("case {case}: not computing"))?;
            let want: Vec<usize> =
                (0..world).map(|q| if ranks.contains(&q) { q + 1 } else { 0 }).collect();
            if done.steps != want {
                return Err(format!("case {case}: round steps {:?}, want {want:?}", done.steps));
            }
        }
        Ok(())
    }
}

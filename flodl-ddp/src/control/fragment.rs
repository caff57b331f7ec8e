//! The cut of a model's parameter tensors into fragments of whole tensors balanced by size, the
//! staggered schedule that syncs one of them per reduce (`--fragments F`, after Streaming
//! DiLoCo), the steps each rank trained since each fragment was last synced, and the sync times
//! of a cycle of fragments.

use std::collections::VecDeque;

#[cfg(doc)]
use crate::control::exposure::Exposure;
use crate::control::logic_error::{LogicError, LogicResult};
use crate::state::HostState;

/// A model's parameter tensors cut into fragments of whole tensors, balanced by values.
///
/// # Invariants
/// Every tensor is in exactly one fragment; no fragment is empty; each fragment's tensors are
/// ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fragments {
    /// The tensors of each fragment, ascending.
    members: Vec<Vec<usize>>,
    /// The values of the tensors cut (the parameter count of the model).
    sizes: Vec<usize>,
}

impl Fragments {
    /// Cuts tensors of `sizes` values into `count` fragments: largest tensor first (ties: the
    /// lower index), each to the fragment holding the fewest values so far (ties: the lower
    /// fragment). Deterministic: both ends of a connection cut alike from the same sizes. The
    /// heaviest fragment holds at most the ideal share plus the largest tensor.
    ///
    /// # Errors
    /// [`LogicError::InvalidValue`] for 0 fragments, [`LogicError::TooManyFragments`] for more
    /// fragments than tensors (a fragment would be empty).
    pub(crate) fn cut(sizes: &[usize], count: usize) -> LogicResult<Fragments> {
        if count == 0 {
            return Err(LogicError::InvalidValue { what: "fragments", value: 0.0 });
        }
        if count > sizes.len() {
            return Err(LogicError::TooManyFragments { fragments: count, tensors: sizes.len() });
        }
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
        let mut members = vec![Vec::new(); count];
        let mut load = vec![0usize; count];
        for tensor in order {
            // The lightest fragment; an empty one first, so that none stays empty.
            let k = (0..count)
                .min_by_key(|&k| (!members[k].is_empty(), load[k], k))
                .unwrap_or_default();
            members[k].push(tensor);
            load[k] += sizes[tensor];
        }
        for m in &mut members {
            m.sort_unstable();
        }
        Ok(Fragments { members, sizes: sizes.to_vec() })
    }

    /// The cut of `state`'s parameters into `count` fragments (see [`Fragments::cut`]).
    ///
    /// # Errors
    /// As [`Fragments::cut`].
    pub(crate) fn of_state(state: &HostState, count: usize) -> LogicResult<Fragments> {
        let sizes: Vec<usize> = state.params.iter().map(Vec::len).collect();
        Fragments::cut(&sizes, count)
    }

    /// The number of fragments.
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// The tensors of fragment `k`, ascending (none for a fragment out of range).
    pub(crate) fn tensors(&self, k: usize) -> &[usize] {
        self.members.get(k).map_or(&[], Vec::as_slice)
    }

    /// The fragment the run's reduce number `k` (from 0) syncs: `k mod F`, so consecutive
    /// reduces carry consecutive fragments, and the first carries fragment 0, which holds the
    /// largest tensor.
    pub(crate) fn scheduled(&self, k: u64) -> usize {
        (k % self.len().max(1) as u64) as usize
    }

    /// The values of every fragment together: the model's parameter count.
    pub(crate) fn total(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// The values of fragment `k`.
    #[cfg(test)]
    pub(crate) fn values(&self, k: usize) -> usize {
        self.tensors(k).iter().map(|&t| self.sizes[t]).sum()
    }

    /// The shapes of fragment `k`'s part, from a whole state's `shapes` (its parameters', then
    /// its buffers'): the fragment's parameters' in ascending order, then every buffer's.
    pub(crate) fn shapes(&self, k: usize, shapes: &[Vec<usize>]) -> Vec<Vec<usize>> {
        let n = self.sizes.len().min(shapes.len());
        let params = self.tensors(k).iter().filter_map(|&t| shapes.get(t).cloned());
        params.chain(shapes[n..].iter().cloned()).collect()
    }

    /// Fragment `k`'s part of a whole `state`, taken out of it: its tensors' parameters in
    /// ascending order, and every buffer (buffers travel at every exchange).
    ///
    /// # Errors
    /// [`LogicError::FragmentShape`] when `k` is out of range or `state` is not of the cut
    /// model's layout.
    pub(crate) fn take(&self, k: usize, state: &mut HostState) -> LogicResult<HostState> {
        self.check(k, &state.params, self.sizes.len(), "a whole state to cut")?;
        let params =
            self.tensors(k).iter().map(|&t| std::mem::take(&mut state.params[t])).collect();
        Ok(HostState { params, buffers: std::mem::take(&mut state.buffers) })
    }

    /// Fragment `k`'s part of a whole `state`, copied: see [`Fragments::take`].
    ///
    /// # Errors
    /// As [`Fragments::take`].
    pub(crate) fn part(&self, k: usize, state: &HostState) -> LogicResult<HostState> {
        self.check(k, &state.params, self.sizes.len(), "a whole state to cut")?;
        let params = self.tensors(k).iter().map(|&t| state.params[t].clone()).collect();
        Ok(HostState { params, buffers: state.buffers.clone() })
    }

    /// Writes fragment `k`'s `part` (as [`Fragments::take`] makes it) into a whole state:
    /// its parameters, and every buffer.
    ///
    /// # Errors
    /// [`LogicError::FragmentShape`] when `k` is out of range or a shape disagrees.
    pub(crate) fn put(&self, k: usize, part: HostState, into: &mut HostState) -> LogicResult<()> {
        self.check(k, &into.params, self.sizes.len(), "a whole state to write")?;
        self.check(k, &part.params, self.tensors(k).len(), "a fragment's part")?;
        if part.buffers.len() != into.buffers.len() {
            return Err(LogicError::FragmentShape {
                what: "buffers of a fragment's part",
                expected: into.buffers.len(),
                got: part.buffers.len(),
            });
        }
        for (&t, values) in self.tensors(k).iter().zip(part.params) {
            into.params[t] = values;
        }
        into.buffers = part.buffers;
        Ok(())
    }

    /// Checks that `params` are a whole state's parameters of the cut model's layout.
    ///
    /// # Errors
    /// [`LogicError::FragmentShape`] naming `what` when a count or a size disagrees.
    pub(crate) fn fits(&self, params: &[Vec<f32>], what: &'static str) -> LogicResult<()> {
        if params.len() != self.sizes.len() {
            let (expected, got) = (self.sizes.len(), params.len());
            return Err(LogicError::FragmentShape { what, expected, got });
        }
        match params.iter().zip(&self.sizes).find(|(p, size)| p.len() != **size) {
            Some((p, size)) => {
                Err(LogicError::FragmentShape { what, expected: *size, got: p.len() })
            }
            None => Ok(()),
        }
    }

    /// Checks `k`, that `params` holds `tensors` tensors, and the sizes of fragment `k`'s.
    fn check(
        &self,
        k: usize,
        params: &[Vec<f32>],
        tensors: usize,
        what: &'static str,
    ) -> LogicResult<()> {
        if k >= self.len() {
            return Err(LogicError::FragmentShape {
                what: "a fragment",
                expected: self.len(),
                got: k,
            });
        }
        if params.len() != tensors {
            return Err(LogicError::FragmentShape { what, expected: tensors, got: params.len() });
        }
        // A whole state's tensors of fragment `k` are checked (the others may have been taken).
        let whole = tensors == self.sizes.len();
        for (i, &t) in self.tensors(k).iter().enumerate() {
            let got = params[if whole { t } else { i }].len();
            if got != self.sizes[t] {
                return Err(LogicError::FragmentShape { what, expected: self.sizes[t], got });
            }
        }
        Ok(())
    }
}

/// The steps each rank trained since each fragment was last synced: a fragment's average
/// weighs each rank by the work its copy of that fragment holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unsynced {
    /// `steps[k][rank]`: the steps of `rank` since fragment `k` was last synced.
    steps: Vec<Vec<usize>>,
}

impl Unsynced {
    /// Nothing trained yet, for `fragments` fragments and `world` seats.
    pub(crate) fn new(fragments: usize, world: usize) -> Unsynced {
        Unsynced { steps: vec![vec![0; world]; fragments] }
    }

    /// The weights of fragment `k`'s average at a reduce holding `steps` per rank: each rank's
    /// steps since `k` was last synced, this reduce's included (`steps` for a fragment out of
    /// range).
    pub(crate) fn weights(&self, k: usize, steps: &[usize]) -> Vec<usize> {
        let before = self.steps.get(k);
        steps
            .iter()
            .enumerate()
            .map(|(r, &s)| s + before.and_then(|b| b.get(r)).copied().unwrap_or(0))
            .collect()
    }

    /// A reduce holding `steps` per rank completed, syncing fragment `k` (`None`: all of them):
    /// the others hold these steps too, the synced ones none.
    pub(crate) fn synced(&mut self, k: Option<usize>, steps: &[usize]) {
        for (j, since) in self.steps.iter_mut().enumerate() {
            if k.is_none() || k == Some(j) {
                since.iter_mut().for_each(|s| *s = 0);
            } else {
                for (s, &n) in since.iter_mut().zip(steps) {
                    *s += n;
                }
            }
        }
    }

    /// Whether `rank` trained nothing since any fragment was last synced (so it holds the
    /// last consensus of every fragment).
    pub(crate) fn is_synced(&self, rank: usize) -> bool {
        self.steps.iter().all(|since| since.get(rank).is_none_or(|&s| s == 0))
    }

    /// A rank starts again from the whole consensus (joined again, or gone): it holds no
    /// unsynced work.
    pub(crate) fn restart(&mut self, rank: usize) {
        for since in &mut self.steps {
            if let Some(s) = since.get_mut(rank) {
                *s = 0;
            }
        }
    }
}

/// A run's staggered syncs (`--fragments F`): the cut of its model and the steps each rank
/// trained since each fragment was last synced.
#[derive(Debug, Clone)]
pub(crate) struct Staggered {
    /// The cut of the model's parameters.
    pub(crate) cut: Fragments,
    /// Each rank's steps since each fragment was last synced.
    pub(crate) unsynced: Unsynced,
    /// The sync times of the last F reduces (ms), newest last.
    syncs: VecDeque<f64>,
}

impl Staggered {
    /// The staggered syncs of `state`'s model cut into `count` fragments, for `world` seats.
    ///
    /// # Errors
    /// As [`Fragments::cut`].
    pub(crate) fn new(state: &HostState, count: usize, world: usize) -> LogicResult<Staggered> {
        let cut = Fragments::of_state(state, count)?;
        Ok(Staggered { unsynced: Unsynced::new(cut.len(), world), syncs: VecDeque::new(), cut })
    }

    /// A reduce's sync time (ms) is in.
    pub(crate) fn synced_in(&mut self, sync_ms: f64) {
        if self.syncs.len() == self.cut.len() {
            self.syncs.pop_front();
        }
        self.syncs.push_back(sync_ms);
    }

    /// The sync times ElChe sizes windows by: the last F reduces', one of each fragment once a
    /// cycle has run (`[last]` before any), so the window is sized for the exchange's steady
    /// cost rather than for whichever fragment moved last (a model with one dominant tensor
    /// alternates one heavy reduce with F − 1 light ones); [`Exposure`] takes what of each the
    /// ranks cannot train through.
    pub(crate) fn cycle_syncs_ms(&self, last: f64) -> Vec<f64> {
        if self.syncs.is_empty() {
            return vec![last];
        }
        self.syncs.iter().copied().collect()
    }

    /// The fragment the run's reduce number `k` (from 0) syncs: the scheduled one, or every
    /// one (`None`) when `whole` (a reduce that saves a checkpoint: the bundle is then one cut
    /// of the run; the run's last reduce: the final evaluation, state and bundle are then the
    /// consensus).
    pub(crate) fn fragment(&self, k: u64, whole: bool) -> Option<usize> {
        (!whole).then(|| self.cut.scheduled(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    /// The lightest heaviest fragment over every assignment of tensors to `count` non-empty
    /// fragments (exhaustive: small cases only).
    fn best(sizes: &[usize], count: usize) -> usize {
        let n = sizes.len();
        let mut best = usize::MAX;
        let mut assign = vec![0usize; n];
        loop {
            let mut load = vec![0usize; count];
            let mut used = vec![false; count];
            for (t, &k) in assign.iter().enumerate() {
                load[k] += sizes[t];
                used[k] = true;
            }
            if used.iter().all(|&u| u) {
                best = best.min(load.iter().copied().max().unwrap_or(0));
            }
            // The next assignment, counting in base `count`.
            let mut i = 0;
            while i < n && assign[i] + 1 == count {
                assign[i] = 0;
                i += 1;
            }
            if i == n {
                return best;
            }
            assign[i] += 1;
        }
    }

    /// On random shapes: every tensor in exactly one fragment, none empty, each ascending; the
    /// heaviest fragment within the ideal share plus the largest tensor, and (small cases,
    /// against the exhaustive optimum) within 4/3 of the optimum; the same cut twice; the
    /// parts of a state put back into another give the state.
    #[test]
    fn the_cut_is_balanced_complete_and_deterministic() -> Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(27);
        for case in 0..400 {
            let small = case % 2 == 0;
            let n = if small { rng.random_range(1..8) } else { rng.random_range(1..60) };
            let sizes: Vec<usize> = (0..n)
                .map(|_| match rng.random_range(0..3) {
                    0 => rng.random_range(1..10),
                    1 => rng.random_range(1..1000),
                    _ => rng.random_range(1..100_000),
                })
                .collect();
            let count = rng.random_range(1..=n.min(if small { 4 } else { 9 }));
            let cut = Fragments::cut(&sizes, count).map_err(|e| e.to_string())?;
            if cut != Fragments::cut(&sizes, count).map_err(|e| e.to_string())? {
                return Err(format!("case {case}: two cuts differ"));
            }
            let mut seen = vec![0; n];
            for k in 0..count {
                let ts = cut.tensors(k);
                if ts.is_empty() || ts.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(format!("case {case}: fragment {k} is {ts:?}"));
                }
                ts.iter().for_each(|&t| seen[t] += 1);
            }
            if seen.iter().any(|&s| s != 1) {
                return Err(format!("case {case}: tensors seen {seen:?}"));
            }
            let total: usize = sizes.iter().sum();
            let heaviest = (0..count).map(|k| cut.values(k)).max().unwrap_or(0);
            let largest = sizes.iter().copied().max().unwrap_or(0);
            if heaviest > total.div_ceil(count) + largest {
                return Err(format!("case {case}: heaviest {heaviest} of {total} in {count}"));
            }
            if small {
                let opt = best(&sizes, count);
                if 3 * heaviest > 4 * opt {
                    return Err(format!("case {case}: heaviest {heaviest}, optimum {opt}"));
                }
            }
            let state = HostState {
                params: sizes.iter().map(|&s| (0..s).map(|v| v as f32).collect()).collect(),
                buffers: vec![vec![1.0, 2.0]],
            };
            let mut rebuilt = HostState {
                params: sizes.iter().map(|&s| vec![0.0; s]).collect(),
                buffers: vec![vec![0.0; 2]],
            };
            let mut whole = state.clone();
            for k in 0..count {
                let part = cut.take(k, &mut whole).map_err(|e| e.to_string())?;
                if part != cut.part(k, &state).map_err(|e| e.to_string())? {
                    return Err(format!("case {case}: take and part differ"));
                }
                whole.buffers = part.buffers.clone();
                cut.put(k, part, &mut rebuilt).map_err(|e| e.to_string())?;
            }
            if rebuilt != state {
                return Err(format!("case {case}: the parts put back are not the state"));
            }
        }
        Ok(())
    }

    /// Refused: no fragment, more fragments than tensors, a fragment out of range, a part of
    /// another layout.
    #[test]
    fn bad_cuts_and_parts_are_errors() -> Result<(), String> {
        assert!(matches!(Fragments::cut(&[3, 4], 0), Err(LogicError::InvalidValue { .. })));
        assert_eq!(
            Fragments::cut(&[3, 4], 3),
            Err(LogicError::TooManyFragments { fragments: 3, tensors: 2 })
        );
        let cut = Fragments::cut(&[3, 4, 5], 2).map_err(|e| e.to_string())?;
        let mut state =
            HostState { params: vec![vec![0.0; 3], vec![0.0; 4], vec![0.0; 5]], buffers: vec![] };
        assert!(cut.take(2, &mut state).is_err());
        let wrong = HostState { params: vec![vec![0.0; 2]], buffers: vec![] };
        assert!(cut.put(0, wrong, &mut state).is_err());
        let mut short = HostState { params: vec![vec![0.0; 3]], buffers: vec![] };
        assert!(cut.take(0, &mut short).is_err());
        Ok(())
    }

    /// Per-fragment steps against a reference replay: a fragment's weights are the steps since
    /// its last sync, this reduce's included; a full sync and a restart zero them.
    #[test]
    fn unsynced_steps_follow_the_schedule() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
        let (fragments, world) = (3, 4);
        let mut u = Unsynced::new(fragments, world);
        let mut history: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
        for round in 0..60u64 {
            let steps: Vec<usize> = (0..world).map(|_| rng.random_range(0..9)).collect();
            let k = if round % 11 == 10 { None } else { Some(round as usize % fragments) };
            for j in 0..fragments {
                let mut want = steps.clone();
                for (kk, s) in history.iter().rev() {
                    if kk.is_none() || *kk == Some(j) {
                        break;
                    }
                    want.iter_mut().zip(s).for_each(|(w, s)| *w += s);
                }
                assert_eq!(u.weights(j, &steps), want, "round {round}, fragment {j}");
            }
            u.synced(k, &steps);
            history.push((k, steps));
        }
        u.restart(1);
        assert!((0..fragments).all(|k| u.weights(k, &[0; 4])[1] == 0));
        assert!(u.is_synced(1));
        u.synced(Some(0), &[0, 0, 3, 0]);
        assert!(u.is_synced(1) && !u.is_synced(2));
        u.synced(None, &[0, 0, 1, 0]);
        assert!((0..world).all(|r| u.is_synced(r)));
    }

    /// ElChe's sync times: the last one before any, then the last F, oldest first.
    #[test]
    fn the_cycle_sync_times_are_the_last_f() -> Result<(), String> {
        let state =
            HostState { params: vec![vec![0.0; 9], vec![0.0; 2], vec![0.0]], buffers: vec![] };
        let mut s = Staggered::new(&state, 3, 2).map_err(|e| e.to_string())?;
        assert_eq!(s.cycle_syncs_ms(7.0), [7.0]);
        let wants: [(f64, &[f64]); 5] = [
            (90.0, &[90.0]),
            (6.0, &[90.0, 6.0]),
            (3.0, &[90.0, 6.0, 3.0]),
            (90.0, &[6.0, 3.0, 90.0]),
            (9.0, &[3.0, 90.0, 9.0]),
        ];
        for (ms, want) in wants {
            s.synced_in(ms);
            assert_eq!(s.cycle_syncs_ms(0.0), want, "after {ms}");
        }
        Ok(())
    }
}

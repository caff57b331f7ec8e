//! The cut of a model's parameters into fragments of equal size, the staggered schedule that
//! syncs one of them per reduce (`--fragments F`, after Streaming DiLoCo), the steps each rank
//! trained since each fragment was last synced, and what a cycle of fragments cost the ranks.

use std::collections::VecDeque;
use std::ops::Range;

use crate::control::exposure::Exposure;
use crate::control::logic_error::{LogicError, LogicResult};
use crate::state::HostState;

/// A run of consecutive values of one parameter tensor: what a fragment is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The tensor's index among the model's parameters.
    pub(crate) tensor: usize,
    /// The run's first value, counted in the tensor's values (row-major).
    pub(crate) start: usize,
    /// The run's values (at least one).
    pub(crate) len: usize,
}

impl Piece {
    /// Every value of tensor `tensor`, of `len` values.
    pub(crate) fn whole(tensor: usize, len: usize) -> Piece {
        Piece { tensor, start: 0, len }
    }

    /// The run's values within its tensor.
    pub(crate) fn range(&self) -> Range<usize> {
        self.start..self.start + self.len
    }

    /// Whether the run is every value of a tensor of `size` values.
    pub(crate) fn covers(&self, size: usize) -> bool {
        self.start == 0 && self.len == size
    }
}

/// A model's parameters cut into fragments of equal size: the tensors laid end to end in their
/// order, and that line cut into F runs whose lengths differ by at most one value. A tensor
/// that a cut point falls in is split between two (or more) fragments, so a model dominated
/// by one large tensor is balanced too.
///
/// # Invariants
/// Every parameter value is in exactly one fragment; no fragment is empty; each fragment's
/// pieces are of ascending tensors, one piece per tensor at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fragments {
    /// The pieces of each fragment, by ascending tensor.
    members: Vec<Vec<Piece>>,
    /// The values of the tensors cut (the parameter count of the model).
    sizes: Vec<usize>,
}

impl Fragments {
    /// Cuts tensors of `sizes` values into `count` fragments: fragment k holds the values
    /// `⌊k·T/F⌋ .. ⌊(k+1)·T/F⌋` of the T values laid end to end. Deterministic: both ends of a
    /// connection cut alike from the same sizes.
    ///
    /// # Errors
    /// [`LogicError::InvalidValue`] for 0 fragments, [`LogicError::TooManyFragments`] for more
    /// fragments than parameter values (a fragment would be empty).
    pub(crate) fn cut(sizes: &[usize], count: usize) -> LogicResult<Fragments> {
        if count == 0 {
            return Err(LogicError::InvalidValue { what: "fragments", value: 0.0 });
        }
        let total: usize = sizes.iter().sum();
        if count > total {
            return Err(LogicError::TooManyFragments { fragments: count, values: total });
        }
        // The k-th cut point; ⌊(k+1)·T/F⌋ − ⌊k·T/F⌋ ≥ ⌊T/F⌋ ≥ 1, so no fragment is empty.
        let bound = |k: usize| (k as u128 * total as u128 / count as u128) as usize;
        let mut members = vec![Vec::new(); count];
        let mut offset = 0usize;
        for (tensor, &size) in sizes.iter().enumerate() {
            let (from, to) = (offset, offset + size);
            for (k, pieces) in members.iter_mut().enumerate() {
                let (lo, hi) = (bound(k).max(from), bound(k + 1).min(to));
                if lo < hi {
                    pieces.push(Piece { tensor, start: lo - from, len: hi - lo });
                }
            }
            offset = to;
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

    /// The pieces of fragment `k`, by ascending tensor (none for a fragment out of range).
    pub(crate) fn pieces(&self, k: usize) -> &[Piece] {
        self.members.get(k).map_or(&[], Vec::as_slice)
    }

    /// The pieces of fragment `k`, which must exist.
    ///
    /// # Errors
    /// [`LogicError::FragmentShape`] when `k` is out of range.
    pub(crate) fn pieces_of(&self, k: usize) -> LogicResult<&[Piece]> {
        match self.members.get(k) {
            Some(pieces) => Ok(pieces),
            None => {
                Err(LogicError::FragmentShape { what: "a fragment", expected: self.len(), got: k })
            }
        }
    }

    /// The fragment the run's reduce number `k` (from 0) syncs: `k mod F`, so consecutive
    /// reduces carry consecutive fragments.
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
        self.pieces(k).iter().map(|p| p.len).sum()
    }

    /// The shapes of fragment `k`'s part, from a whole state's `shapes` (its parameters', then
    /// its buffers'): a piece's tensor's shape where it is the whole tensor, `[len]` where it
    /// is a run of it, in ascending order, then every buffer's.
    pub(crate) fn shapes(&self, k: usize, shapes: &[Vec<usize>]) -> Vec<Vec<usize>> {
        let n = self.sizes.len().min(shapes.len());
        let params = self.pieces(k).iter().filter_map(|p| {
            let size = *self.sizes.get(p.tensor)?;
            Some(if p.covers(size) { shapes.get(p.tensor)?.clone() } else { vec![p.len] })
        });
        params.chain(shapes[n..].iter().cloned()).collect()
    }

    /// Fragment `k`'s part of a whole `state`, copied: its pieces' values in ascending order,
    /// and every buffer (buffers travel at every exchange). What a rank reads for a fragment
    /// (`Worker::snapshot_part`) and what a fragment's average holds, by definition: the
    /// tests' reference.
    ///
    /// # Errors
    /// [`LogicError::FragmentShape`] when `k` is out of range or `state` is not of the cut
    /// model's layout.
    #[cfg(test)]
    pub(crate) fn part(&self, k: usize, state: &HostState) -> LogicResult<HostState> {
        self.check(k, &state.params, true, "a whole state to cut")?;
        let params =
            self.pieces(k).iter().map(|p| state.params[p.tensor][p.range()].to_vec()).collect();
        Ok(HostState { params, buffers: state.buffers.clone() })
    }

    /// Writes fragment `k`'s `part` (as [`Fragments::part`] cuts it) into a whole state:
    /// its pieces' values, and every buffer.
    ///
    /// # Errors
    /// [`LogicError::FragmentShape`] when `k` is out of range or a shape disagrees.
    pub(crate) fn put(&self, k: usize, part: HostState, into: &mut HostState) -> LogicResult<()> {
        self.check(k, &into.params, true, "a whole state to write")?;
        self.check(k, &part.params, false, "a fragment's part")?;
        if part.buffers.len() != into.buffers.len() {
            return Err(LogicError::FragmentShape {
                what: "buffers of a fragment's part",
                expected: into.buffers.len(),
                got: part.buffers.len(),
            });
        }
        for (p, values) in self.pieces(k).iter().zip(part.params) {
            let tensor = &mut into.params[p.tensor];
            if p.covers(tensor.len()) {
                *tensor = values;
            } else {
                tensor[p.range()].copy_from_slice(&values);
            }
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

    /// Checks `k`, and `params`: a `whole` state of the cut model ([`Fragments::fits`]), or a
    /// part of fragment `k`, its vectors against its pieces.
    fn check(
        &self,
        k: usize,
        params: &[Vec<f32>],
        whole: bool,
        what: &'static str,
    ) -> LogicResult<()> {
        let pieces = self.pieces_of(k)?;
        if whole {
            return self.fits(params, what);
        }
        if params.len() != pieces.len() {
            let (expected, got) = (pieces.len(), params.len());
            return Err(LogicError::FragmentShape { what, expected, got });
        }
        match params.iter().zip(pieces).find(|(v, p)| v.len() != p.len) {
            Some((v, p)) => Err(LogicError::FragmentShape { what, expected: p.len, got: v.len() }),
            None => Ok(()),
        }
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
    /// What the last F reduces cost the ranks (ms, [`Exposure`]), newest last.
    exposed: VecDeque<f64>,
}

impl Staggered {
    /// The staggered syncs of `state`'s model cut into `count` fragments, for `world` seats.
    ///
    /// # Errors
    /// As [`Fragments::cut`].
    pub(crate) fn new(state: &HostState, count: usize, world: usize) -> LogicResult<Staggered> {
        let cut = Fragments::of_state(state, count)?;
        let unsynced = Unsynced::new(cut.len(), world);
        Ok(Staggered { unsynced, exposed: VecDeque::new(), cut })
    }

    /// What a reduce cost the ranks (ms) is in.
    pub(crate) fn exposed_in(&mut self, exposed_ms: f64) {
        if self.exposed.len() == self.cut.len() {
            self.exposed.pop_front();
        }
        self.exposed.push_back(exposed_ms);
    }

    /// The exchange ElChe sizes windows by: the last F reduces', one of each fragment once a
    /// cycle has run, so the window is sized for the exchange's steady cost rather than for
    /// whichever fragment moved last (a reduce's cost varies with the fragment and with what
    /// else the links carry).
    pub(crate) fn cycle_exposure(&self) -> Exposure {
        Exposure::new(self.exposed.iter().copied().collect())
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

    /// The fragment of each parameter value laid end to end, from its definition: value i is
    /// in the last fragment k whose first value ⌊k·T/F⌋ is at most i (computed in f64).
    fn reference(total: usize, count: usize) -> Vec<usize> {
        let first = |k: usize| (k as f64 * total as f64 / count as f64).floor() as usize;
        (0..total).map(|i| (0..count).rev().find(|&k| first(k) <= i).unwrap_or(0)).collect()
    }

    /// On random shapes (empty tensors among them): each value in the fragment its definition
    /// puts it in, every fragment one run of consecutive values of at most one piece per
    /// tensor, in ascending order, of ⌊T/F⌋ or ⌈T/F⌉ values; the same cut twice; the parts of a
    /// state taken and put back into another give the state.
    #[test]
    fn the_cut_is_balanced_complete_and_deterministic() -> Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(27);
        for case in 0..300 {
            let n = rng.random_range(1..30);
            let sizes: Vec<usize> = (0..n)
                .map(|_| match rng.random_range(0..4) {
                    0 => rng.random_range(0..3),
                    1 => rng.random_range(1..10),
                    2 => rng.random_range(1..1000),
                    _ => rng.random_range(1..20_000),
                })
                .collect();
            let total: usize = sizes.iter().sum();
            if total == 0 {
                continue;
            }
            let count = match case % 3 {
                0 => total.min(rng.random_range(1..5)),
                1 => total.min(rng.random_range(1..17)),
                _ => rng.random_range(1..=total.min(200)),
            };
            let cut = Fragments::cut(&sizes, count).map_err(|e| e.to_string())?;
            if cut != Fragments::cut(&sizes, count).map_err(|e| e.to_string())? {
                return Err(format!("case {case}: two cuts differ"));
            }
            let offsets: Vec<usize> = sizes
                .iter()
                .scan(0, |at, &s| {
                    *at += s;
                    Some(*at - s)
                })
                .collect();
            let mut owner = vec![usize::MAX; total];
            for k in 0..count {
                let pieces = cut.pieces(k);
                let values = cut.values(k);
                if values != total / count && values != total.div_ceil(count) {
                    return Err(format!("case {case}: fragment {k} of {values} ({total}/{count})"));
                }
                if pieces.windows(2).any(|w| w[0].tensor >= w[1].tensor) {
                    return Err(format!("case {case}: fragment {k} is {pieces:?}"));
                }
                for p in pieces {
                    if p.len == 0 || p.start + p.len > sizes[p.tensor] {
                        return Err(format!("case {case}: piece {p:?} of {}", sizes[p.tensor]));
                    }
                    for i in p.range() {
                        owner[offsets[p.tensor] + i] = k;
                    }
                }
            }
            if owner != reference(total, count) {
                return Err(format!("case {case}: the fragments differ from their definition"));
            }
            let state = HostState {
                params: sizes.iter().map(|&s| (0..s).map(|v| v as f32).collect()).collect(),
                buffers: vec![vec![1.0, 2.0]],
            };
            let mut rebuilt = HostState {
                params: sizes.iter().map(|&s| vec![0.0; s]).collect(),
                buffers: vec![vec![0.0; 2]],
            };
            for k in 0..count {
                let part = cut.part(k, &state).map_err(|e| e.to_string())?;
                let shapes = cut.shapes(k, &sizes.iter().map(|&s| vec![s]).collect::<Vec<_>>());
                let lens: Vec<usize> = part.params.iter().map(Vec::len).collect();
                if shapes.iter().map(|s| s.iter().product::<usize>()).collect::<Vec<_>>() != lens {
                    return Err(format!("case {case}: shapes {shapes:?} of parts {lens:?}"));
                }
                cut.put(k, part, &mut rebuilt).map_err(|e| e.to_string())?;
            }
            if rebuilt != state {
                return Err(format!("case {case}: the parts put back are not the state"));
            }
        }
        Ok(())
    }

    /// Refused: no fragment, more fragments than values, a fragment out of range, a part of
    /// another layout. A part with as many vectors as the model has tensors is still a part.
    #[test]
    fn bad_cuts_and_parts_are_errors() -> Result<(), String> {
        assert!(matches!(Fragments::cut(&[3, 4], 0), Err(LogicError::InvalidValue { .. })));
        assert_eq!(
            Fragments::cut(&[3, 4], 8),
            Err(LogicError::TooManyFragments { fragments: 8, values: 7 })
        );
        assert_eq!(Fragments::cut(&[3, 4], 7).map(|c| c.len()), Ok(7));
        let cut = Fragments::cut(&[3, 4, 5], 2).map_err(|e| e.to_string())?;
        let mut state =
            HostState { params: vec![vec![0.0; 3], vec![0.0; 4], vec![0.0; 5]], buffers: vec![] };
        assert!(cut.part(2, &state).is_err());
        assert!(cut.pieces_of(2).is_err());
        let wrong = HostState { params: vec![vec![0.0; 2]], buffers: vec![] };
        assert!(cut.put(0, wrong, &mut state).is_err());
        let short = HostState { params: vec![vec![0.0; 3]], buffers: vec![] };
        assert!(cut.part(0, &short).is_err());
        // Fragment 0 of [1, 100] in 2: tensor 0 whole and tensor 1's first 49 values.
        let cut = Fragments::cut(&[1, 100], 2).map_err(|e| e.to_string())?;
        assert_eq!(cut.pieces(0), [Piece::whole(0, 1), Piece { tensor: 1, start: 0, len: 49 }]);
        let mut into = HostState { params: vec![vec![0.0], vec![0.0; 100]], buffers: vec![] };
        let part = HostState { params: vec![vec![7.0], vec![7.0; 49]], buffers: vec![] };
        cut.put(0, part, &mut into).map_err(|e| e.to_string())?;
        assert_eq!(into.params[1].iter().filter(|&&v| v == 7.0).count(), 49);
        let whole_sized = HostState { params: vec![vec![7.0], vec![7.0; 100]], buffers: vec![] };
        assert!(cut.put(0, whole_sized, &mut into).is_err());
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

    /// ElChe's exposed exchange: none before any, then the last F, oldest first.
    #[test]
    fn the_cycle_is_the_last_f_reduces() -> Result<(), String> {
        let state =
            HostState { params: vec![vec![0.0; 9], vec![0.0; 2], vec![0.0]], buffers: vec![] };
        let mut s = Staggered::new(&state, 3, 2).map_err(|e| e.to_string())?;
        assert_eq!(s.cycle_exposure(), Exposure::new(Vec::new()));
        let wants: [(f64, &[f64]); 5] = [
            (90.0, &[90.0]),
            (6.0, &[90.0, 6.0]),
            (3.0, &[90.0, 6.0, 3.0]),
            (90.0, &[6.0, 3.0, 90.0]),
            (9.0, &[3.0, 90.0, 9.0]),
        ];
        for (ms, want) in wants {
            s.exposed_in(ms);
            assert_eq!(s.cycle_exposure(), Exposure::new(want.to_vec()), "after {ms}");
        }
        Ok(())
    }
}

//! [`RankMap`]: whose saved per-rank state each rank of a resumed run takes, when the bundle was
//! written by a world of another size (elastic resume) or with ranks that had died.

use std::fmt;

use super::bundle::Checkpoint;

/// Which rank of the saving run each rank of the resuming run takes its inner optimizer state
/// (and step counter) from.
///
/// The rule: new rank `r` takes the state of the first old rank, in the order `r mod W`,
/// `(r + 1) mod W`, … (`W` the saving world), that saved one; when none did (a replica without
/// optimizer state), it starts fresh. So a resume onto the same world is the identity (a `Sync`
/// run resumes bitwise), a smaller world keeps the lowest ranks' states and drops the others,
/// and a larger world repeats states cyclically.
///
/// Why a whole state of one rank and not an average or a reset: an inner optimizer's state is
/// one trajectory's — momentum, Adam's moments and its step counter (which sets the bias
/// correction) belong together, and ranks train statistically alike chunks of the same
/// permutations, so any one rank's state is a sound state for any other. An element-wise
/// average would mix moments of different step counts and shrink the momentum's variance (it
/// becomes the momentum of the mean gradient, not of one rank's); a reset throws away the
/// warm-up and restarts Adam's bias correction. Duplicated states on a larger world diverge
/// from the first step, since each rank sees its own batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankMap {
    from_world: usize,
    sources: Vec<Option<usize>>,
}

impl RankMap {
    /// The map from a saving world of `from_world` ranks, of which those with `saved[r]` true
    /// left a state, onto `to_world` ranks.
    pub fn new(from_world: usize, to_world: usize, saved: &[bool]) -> RankMap {
        let has = |r: usize| saved.get(r).copied().unwrap_or(false);
        let sources = (0..to_world)
            .map(|r| (0..from_world).map(|k| (r + k) % from_world.max(1)).find(|&old| has(old)))
            .collect();
        RankMap { from_world, sources }
    }

    /// The map of `bundle`'s per-rank optimizer states onto `to_world` ranks (a rank saved a
    /// state when its set is not empty).
    pub fn of(bundle: &Checkpoint, to_world: usize) -> RankMap {
        let saved: Vec<bool> = bundle.optimizer.iter().map(|s| !s.is_empty()).collect();
        RankMap::new(bundle.world_size, to_world, &saved)
    }

    /// Ranks of the saving run.
    pub fn from_world(&self) -> usize {
        self.from_world
    }

    /// Ranks of the resuming run.
    pub fn to_world(&self) -> usize {
        self.sources.len()
    }

    /// Whether the world size is unchanged (per-rank states may still move, from a dead rank).
    pub fn same_world(&self) -> bool {
        self.from_world == self.to_world()
    }

    /// The old rank whose state new rank `rank` takes; `None`: it starts fresh.
    pub fn source(&self, rank: usize) -> Option<usize> {
        self.sources.get(rank).copied().flatten()
    }

    /// Old ranks whose state no new rank takes (a smaller world drops them).
    pub fn dropped(&self) -> Vec<usize> {
        (0..self.from_world).filter(|old| !self.sources.contains(&Some(*old))).collect()
    }
}

impl fmt::Display for RankMap {
    /// E.g. `3 ranks onto 2: optimizer states 0←0, 1←1 (dropped: rank 2)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ranks onto {}: optimizer states ", self.from_world, self.to_world())?;
        let pairs: Vec<String> = self
            .sources
            .iter()
            .enumerate()
            .map(|(r, s)| match s {
                Some(old) => format!("{r}←{old}"),
                None => format!("{r} fresh"),
            })
            .collect();
        f.write_str(&pairs.join(", "))?;
        let dropped = self.dropped();
        if !dropped.is_empty() {
            let names: Vec<String> = dropped.iter().map(ToString::to_string).collect();
            let rank = if dropped.len() == 1 { "rank" } else { "ranks" };
            write!(f, " (dropped: {rank} {})", names.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::RankMap;

    /// (saving world, resuming world, which old ranks saved, sources, dropped, text).
    type Case<'a> = (usize, usize, &'a [bool], &'a [Option<usize>], &'a [usize], &'a str);

    #[test]
    fn maps_follow_the_documented_rule() -> Result<(), String> {
        // (from, to, saved, expected sources, expected dropped, text)
        let cases: &[Case<'_>] = &[
            (
                2,
                2,
                &[true, true],
                &[Some(0), Some(1)],
                &[],
                "2 ranks onto 2: optimizer states 0←0, 1←1",
            ),
            (
                3,
                2,
                &[true, true, true],
                &[Some(0), Some(1)],
                &[2],
                "3 ranks onto 2: optimizer states 0←0, 1←1 (dropped: rank 2)",
            ),
            (
                2,
                3,
                &[true, true],
                &[Some(0), Some(1), Some(0)],
                &[],
                "2 ranks onto 3: optimizer states 0←0, 1←1, 2←0",
            ),
            // A rank dead at the save left nothing: the next old rank stands in.
            (
                3,
                3,
                &[true, false, true],
                &[Some(0), Some(2), Some(2)],
                &[1],
                "3 ranks onto 3: optimizer states 0←0, 1←2, 2←2 (dropped: rank 1)",
            ),
            (
                4,
                1,
                &[true; 4],
                &[Some(0)],
                &[1, 2, 3],
                "4 ranks onto 1: optimizer states 0←0 (dropped: ranks 1, 2, 3)",
            ),
            // No state at all: fresh optimizers.
            (
                2,
                3,
                &[false, false],
                &[None, None, None],
                &[0, 1],
                "2 ranks onto 3: optimizer states 0 fresh, 1 fresh, 2 fresh (dropped: ranks 0, 1)",
            ),
        ];
        for (from, to, saved, sources, dropped, text) in cases {
            let map = RankMap::new(*from, *to, saved);
            let got: Vec<Option<usize>> = (0..*to).map(|r| map.source(r)).collect();
            let found = (got.as_slice(), map.dropped(), map.to_string(), map.same_world());
            if found != (*sources, dropped.to_vec(), (*text).to_owned(), from == to) {
                return Err(format!("{from}→{to} {saved:?}: {found:?}"));
            }
        }
        Ok(())
    }
}

//! Which samples the staging cache holds and which it gives up: farthest next use, or LRU.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

/// How the staging cache chooses what to give up when it is full.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Eviction {
    /// Belady/MIN with respect to the advised stream: evict the sample whose next use is farthest
    /// (never used again counts as infinitely far), and decline to admit a sample whose next use
    /// is not strictly sooner than that. A sample needed sooner is never evicted for one needed
    /// later.
    #[default]
    NextUse,
    /// Least recently used, ignoring advisories (kept for comparison).
    Lru,
}

/// What became of a request to hold a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The sample is now held; `evicted` was given up to make room.
    Admitted { evicted: Option<usize> },
    /// The sample was already held.
    AlreadyHeld,
    /// Everything held is needed sooner (or the capacity is zero): the sample is not held.
    Declined,
}

/// The bookkeeping of a sample cache of fixed capacity (in samples) driven by an advised stream.
///
/// Positions are indices into the latest advised stream. Each held sample has a victim key,
/// larger = given up first: its next use under [`Eviction::NextUse`], or `u64::MAX - last
/// access` under [`Eviction::Lru`].
#[derive(Debug)]
pub(crate) struct Residency {
    capacity: usize,
    eviction: Eviction,
    held: HashMap<usize, u64>,
    victims: BTreeSet<(u64, usize)>,
    // Advised positions of each sample not yet consumed, ascending.
    future: HashMap<usize, VecDeque<u64>>,
    stream: Vec<usize>,
    // Positions before this one have been consumed.
    cursor: usize,
    tick: u64,
}

const NEVER: u64 = u64::MAX;

impl Residency {
    pub(crate) fn new(capacity: usize, eviction: Eviction) -> Self {
        Self {
            capacity,
            eviction,
            held: HashMap::new(),
            victims: BTreeSet::new(),
            future: HashMap::new(),
            stream: Vec::new(),
            cursor: 0,
            tick: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    pub(crate) fn is_held(&self, sample: usize) -> bool {
        self.held.contains_key(&sample)
    }

    /// Replaces the advised stream (latest wins) and re-keys what is held.
    pub(crate) fn advise(&mut self, stream: Vec<usize>) {
        self.future.clear();
        for (pos, &s) in stream.iter().enumerate() {
            self.future.entry(s).or_default().push_back(pos as u64);
        }
        self.stream = stream;
        self.cursor = 0;
        if self.eviction == Eviction::NextUse {
            let held: Vec<usize> = self.held.keys().copied().collect();
            for s in held {
                self.rekey(s);
            }
        }
    }

    fn next_use(&self, sample: usize) -> u64 {
        self.future.get(&sample).and_then(|q| q.front().copied()).unwrap_or(NEVER)
    }

    fn key(&mut self, sample: usize) -> u64 {
        match self.eviction {
            Eviction::NextUse => self.next_use(sample),
            Eviction::Lru => {
                self.tick += 1;
                NEVER - self.tick
            }
        }
    }

    fn rekey(&mut self, sample: usize) {
        let key = self.key(sample);
        if let Some(old) = self.held.insert(sample, key) {
            self.victims.remove(&(old, sample));
        }
        self.victims.insert((key, sample));
    }

    /// Records a use of `sample` (consuming its earliest advised position) and returns whether it
    /// was held.
    pub(crate) fn access(&mut self, sample: usize) -> bool {
        if let Some(q) = self.future.get_mut(&sample) {
            if let Some(pos) = q.pop_front() {
                self.cursor = self.cursor.max(pos as usize + 1);
            }
            if q.is_empty() {
                self.future.remove(&sample);
            }
        }
        let hit = self.held.contains_key(&sample);
        if hit {
            self.rekey(sample);
        }
        hit
    }

    /// Asks to hold `sample`, evicting by the policy.
    pub(crate) fn admit(&mut self, sample: usize) -> Admission {
        if self.held.contains_key(&sample) {
            return Admission::AlreadyHeld;
        }
        if self.capacity == 0 {
            return Admission::Declined;
        }
        let mut evicted = None;
        if self.held.len() >= self.capacity {
            let Some(&(victim_key, victim)) = self.victims.last() else {
                return Admission::Declined;
            };
            if self.eviction == Eviction::NextUse && victim_key <= self.next_use(sample) {
                return Admission::Declined;
            }
            self.victims.remove(&(victim_key, victim));
            self.held.remove(&victim);
            evicted = Some(victim);
        }
        self.rekey(sample);
        Admission::Admitted { evicted }
    }

    /// Up to `max` samples of the advised stream, from the consumption cursor on, that are not
    /// held and that [`Residency::admit`] would take now, in stream order.
    pub(crate) fn fill_candidates(&self, max: usize) -> Vec<usize> {
        let mut chosen = Vec::new();
        if self.eviction != Eviction::NextUse || self.capacity == 0 {
            return chosen;
        }
        let mut seen = HashSet::new();
        let mut free = self.capacity.saturating_sub(self.held.len());
        let mut victims = self.victims.iter().rev();
        for (pos, &s) in self.stream.iter().enumerate().skip(self.cursor) {
            if chosen.len() >= max {
                break;
            }
            if self.held.contains_key(&s) || !seen.insert(s) {
                continue;
            }
            if free > 0 {
                free -= 1;
            } else {
                match victims.next() {
                    Some(&(key, _)) if key > pos as u64 => {}
                    _ => break,
                }
            }
            chosen.push(s);
        }
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    /// Misses of a read-through cache fed `stream` (advised in full up front).
    fn misses(stream: &[usize], capacity: usize, eviction: Eviction) -> usize {
        let mut r = Residency::new(capacity, eviction);
        r.advise(stream.to_vec());
        let mut misses = 0;
        for &s in stream {
            if !r.access(s) {
                misses += 1;
                r.admit(s);
            }
            assert!(r.held.len() <= capacity);
        }
        misses
    }

    /// The fewest misses any policy (evict anything or bypass, on each miss) can achieve.
    fn optimal_misses(stream: &[usize], capacity: usize) -> usize {
        fn go(
            stream: &[usize],
            i: usize,
            held: Vec<usize>,
            capacity: usize,
            memo: &mut HashMap<(usize, Vec<usize>), usize>,
        ) -> usize {
            if i == stream.len() {
                return 0;
            }
            if let Some(&m) = memo.get(&(i, held.clone())) {
                return m;
            }
            let s = stream[i];
            let best = if held.contains(&s) {
                go(stream, i + 1, held.clone(), capacity, memo)
            } else {
                let mut best = go(stream, i + 1, held.clone(), capacity, memo);
                if held.len() < capacity {
                    let mut h = held.clone();
                    h.push(s);
                    h.sort_unstable();
                    best = best.min(go(stream, i + 1, h, capacity, memo));
                } else {
                    for v in 0..held.len() {
                        let mut h = held.clone();
                        h[v] = s;
                        h.sort_unstable();
                        best = best.min(go(stream, i + 1, h, capacity, memo));
                    }
                }
                best + 1
            };
            memo.insert((i, held), best);
            best
        }
        go(stream, 0, Vec::new(), capacity, &mut HashMap::new())
    }

    #[test]
    fn next_use_matches_brute_force_optimum() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
        for case in 0..600 {
            let alphabet = 2 + case % 5;
            let len = 4 + case % 11;
            let capacity = case % 4;
            let stream: Vec<usize> =
                (0..len).map(|_| (rng.next_u64() % alphabet as u64) as usize).collect();
            let ours = misses(&stream, capacity, Eviction::NextUse);
            let best = optimal_misses(&stream, capacity);
            assert_eq!(ours, best, "stream {stream:?} capacity {capacity}");
            assert!(ours <= misses(&stream, capacity, Eviction::Lru));
        }
    }

    #[test]
    fn next_use_beats_lru_on_cyclic_streams() {
        // A loop over 10 samples through a cache of 5: LRU always misses, MIN keeps 4 of 10.
        let stream: Vec<usize> = (0..100).map(|i| i % 10).collect();
        let lru = misses(&stream, 5, Eviction::Lru);
        let min = misses(&stream, 5, Eviction::NextUse);
        assert_eq!(lru, 100);
        assert!(min < lru, "min {min} lru {lru}");
    }

    #[test]
    fn sooner_samples_are_never_evicted_for_later_ones() {
        let mut r = Residency::new(2, Eviction::NextUse);
        r.advise(vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(r.admit(0), Admission::Admitted { evicted: None });
        assert_eq!(r.admit(1), Admission::Admitted { evicted: None });
        // 2 is needed at position 2, after 0 and 1: declined.
        assert_eq!(r.admit(2), Admission::Declined);
        assert!(r.access(0));
        // Now 0's next use is 3, later than 2's (2): 0 is the farthest and gives way.
        assert!(r.access(1));
        assert_eq!(r.admit(2), Admission::Admitted { evicted: Some(1) });
        assert_eq!(r.admit(2), Admission::AlreadyHeld);
    }

    #[test]
    fn fill_candidates_are_admissible_in_stream_order() {
        let mut r = Residency::new(3, Eviction::NextUse);
        r.advise(vec![4, 5, 4, 6, 7, 8, 5]);
        assert_eq!(r.fill_candidates(10), vec![4, 5, 6]);
        for s in r.fill_candidates(10) {
            assert!(matches!(r.admit(s), Admission::Admitted { .. }));
        }
        assert!(r.fill_candidates(10).is_empty());
        assert!(r.access(4));
        assert!(r.access(5));
        assert!(r.access(4));
        // 4 is never used again (7 takes its place) and 5 is needed after 8 (8 takes its place).
        assert_eq!(r.fill_candidates(10), vec![7, 8]);
    }
}

//! Deterministic per-epoch permutations of a pick space, derived only from (seed, epoch).

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::error::{Error, Result};

/// The space of picks of one epoch: every sample repeated `multiplicity` times.
///
/// Augmentation is multiplicity: pick `p` stands for repeat `p % k` of sample `p / k`, so an
/// epoch over `N` samples with multiplicity `k` has `N·k` picks and shows every sample `k` times,
/// each time under a different [`PickKey`].
///
/// # Invariants
/// `multiplicity >= 1` and `samples * multiplicity` fits in `usize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PickSpace {
    samples: usize,
    multiplicity: usize,
}

impl PickSpace {
    /// A pick space of `samples` samples, each picked `multiplicity` times per epoch.
    ///
    /// # Errors
    /// [`Error::InvalidSharding`] when `multiplicity` is zero or `samples * multiplicity`
    /// overflows `usize`.
    pub fn new(samples: usize, multiplicity: usize) -> Result<Self> {
        if multiplicity == 0 {
            return Err(Error::InvalidSharding {
                reason: "augmentation multiplicity must be at least 1".into(),
            });
        }
        if samples.checked_mul(multiplicity).is_none() {
            return Err(Error::InvalidSharding {
                reason: format!("{samples} samples x {multiplicity} repeats overflows usize"),
            });
        }
        Ok(Self { samples, multiplicity })
    }

    /// A pick space without augmentation: one pick per sample.
    pub fn plain(samples: usize) -> Self {
        Self { samples, multiplicity: 1 }
    }

    /// Number of picks per epoch (`samples × multiplicity`).
    pub fn len(&self) -> usize {
        self.samples * self.multiplicity
    }

    /// Whether the pick space has no picks.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of distinct samples.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Repeats of each sample per epoch.
    pub fn multiplicity(&self) -> usize {
        self.multiplicity
    }

    /// The sample a pick stands for (`pick / multiplicity`).
    pub fn sample(&self, pick: usize) -> usize {
        pick / self.multiplicity
    }

    /// The full key of a pick in a given epoch of a given run.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] when `pick >= self.len()`.
    pub fn key(&self, pick: usize, epoch: u64, seed: u64) -> Result<PickKey> {
        if pick >= self.len() {
            return Err(Error::IndexOutOfRange { index: pick, len: self.len() });
        }
        Ok(PickKey {
            sample: pick / self.multiplicity,
            repeat: pick % self.multiplicity,
            epoch,
            seed,
        })
    }

    /// The permutation of this pick space for one epoch (see [`epoch_permutation`]).
    pub fn permutation(&self, seed: u64, epoch: u64) -> Vec<usize> {
        epoch_permutation(self.len(), seed, epoch)
    }
}

/// Everything a transform may depend on: transforms are pure functions of this key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PickKey {
    /// The sample (index into the dataset).
    pub sample: usize,
    /// Which of the sample's repeats in this epoch (`0..multiplicity`).
    pub repeat: usize,
    /// The epoch.
    pub epoch: u64,
    /// The run's shuffle seed.
    pub seed: u64,
}

impl PickKey {
    /// A 64-bit value mixing all four parts, for seeding a transform's random choices.
    pub fn hash64(&self) -> u64 {
        let mut h = mix64(self.seed ^ 0x243f_6a88_85a3_08d3);
        h = mix64(h ^ self.epoch);
        h = mix64(h ^ self.sample as u64);
        mix64(h ^ self.repeat as u64)
    }
}

/// The permutation of `0..len` for `epoch` of a run seeded with `seed`.
///
/// Derived only from `(seed, epoch)`: a Xoshiro256++ generator seeded with a mix of both drives
/// a Fisher–Yates shuffle with unbiased bounded draws, so every rank that calls this gets the
/// same order, on any platform. Distinct epochs of one seed, and one epoch of distinct seeds,
/// give independent permutations (`seed + epoch` collisions are avoided by the mixing).
pub fn epoch_permutation(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    let mut rng =
        Xoshiro256PlusPlus::seed_from_u64(mix64(seed ^ mix64(epoch ^ 0x9e37_79b9_7f4a_7c15)));
    for i in (1..len).rev() {
        let j = bounded(&mut rng, i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// An unbiased draw from `0..range` (Lemire's multiply-and-reject), `range >= 1`.
fn bounded(rng: &mut Xoshiro256PlusPlus, range: u64) -> u64 {
    let mut m = u128::from(rng.next_u64()) * u128::from(range);
    if (m as u64) < range {
        let threshold = range.wrapping_neg() % range;
        while (m as u64) < threshold {
            m = u128::from(rng.next_u64()) * u128::from(range);
        }
    }
    (m >> 64) as u64
}

/// The SplitMix64 finaliser: a bijective 64-bit mix.
fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_bijections_and_depend_on_seed_and_epoch() -> Result<()> {
        for len in [0usize, 1, 2, 3, 7, 100, 1000] {
            for (seed, epoch) in [(0u64, 0u64), (42, 0), (42, 1), (43, 0), (u64::MAX, 7)] {
                let p = epoch_permutation(len, seed, epoch);
                let mut seen = vec![false; len];
                for &i in &p {
                    assert!(!seen[i], "duplicate {i}");
                    seen[i] = true;
                }
                assert!(seen.iter().all(|&s| s));
                assert_eq!(p, epoch_permutation(len, seed, epoch));
            }
        }
        // seed + epoch must not collide: (42, 1) and (43, 0) differ.
        assert_ne!(epoch_permutation(1000, 42, 1), epoch_permutation(1000, 43, 0));
        assert_ne!(epoch_permutation(1000, 42, 0), epoch_permutation(1000, 42, 1));
        Ok(())
    }

    #[test]
    fn small_permutations_are_uniform() -> Result<()> {
        // 3! = 6 orders; over 60_000 (seed, epoch) pairs each must appear ~10_000 times.
        let mut counts = std::collections::HashMap::new();
        let trials = 60_000u64;
        for t in 0..trials {
            *counts.entry(epoch_permutation(3, t / 100, t % 100)).or_insert(0u64) += 1;
        }
        assert_eq!(counts.len(), 6);
        let expected = trials as f64 / 6.0;
        let chi2: f64 = counts.values().map(|&c| (c as f64 - expected).powi(2) / expected).sum();
        // 5 degrees of freedom: p = 1e-4 at chi2 ≈ 25.7.
        assert!(chi2 < 25.7, "chi2 {chi2} counts {counts:?}");
        Ok(())
    }

    #[test]
    fn pick_key_hashes_are_deterministic_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        for sample in 0..20 {
            for repeat in 0..3 {
                for epoch in 0..4 {
                    for seed in [0u64, 42] {
                        let k = PickKey { sample, repeat, epoch, seed };
                        assert_eq!(k.hash64(), k.hash64());
                        assert!(seen.insert(k.hash64()), "collision at {k:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn pick_space_maps_picks_to_sample_and_repeat() -> Result<()> {
        let space = PickSpace::new(5, 3)?;
        assert_eq!(space.len(), 15);
        let mut pairs = Vec::new();
        for p in 0..space.len() {
            let k = space.key(p, 2, 9)?;
            assert_eq!(k.sample * 3 + k.repeat, p);
            pairs.push((k.sample, k.repeat));
        }
        pairs.sort_unstable();
        pairs.dedup();
        assert_eq!(pairs.len(), 15);
        assert!(space.key(15, 0, 0).is_err());
        assert!(PickSpace::new(5, 0).is_err());
        assert!(PickSpace::new(usize::MAX, 2).is_err());
        Ok(())
    }
}

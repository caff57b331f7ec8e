//! Epoch plans: contiguous slices of an epoch's permutation, and their batches.

use std::num::NonZeroUsize;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A rank's share of one epoch: the picks at positions `offset..offset + size` of the epoch's
/// permutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EpochPlan {
    /// The epoch whose permutation is sliced.
    pub epoch: u64,
    /// First position in the permutation.
    pub offset: usize,
    /// Number of positions.
    pub size: usize,
}

impl EpochPlan {
    /// The positions of the permutation this plan covers.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.size
    }

    /// The picks of this plan, in order.
    ///
    /// # Errors
    /// [`Error::InvalidSharding`] when the plan reaches past the end of `permutation`.
    pub fn picks<'p>(&self, permutation: &'p [usize]) -> Result<&'p [usize]> {
        match self.offset.checked_add(self.size) {
            Some(end) if end <= permutation.len() => Ok(&permutation[self.offset..end]),
            _ => Err(Error::InvalidSharding {
                reason: format!(
                    "plan {}..+{} reaches past a permutation of {}",
                    self.offset,
                    self.size,
                    permutation.len()
                ),
            }),
        }
    }
}

/// Equal shares of `total` positions over `world` ranks: `total / world` each, plus one for the
/// first `total % world` ranks. Plans are contiguous in rank order and cover `0..total` exactly.
///
/// # Errors
/// [`Error::InvalidSharding`] when `world` is zero.
pub fn equal_partition(epoch: u64, total: usize, world: usize) -> Result<Vec<EpochPlan>> {
    if world == 0 {
        return Err(Error::InvalidSharding {
            reason: "a partition needs at least one rank".into(),
        });
    }
    let sizes: Vec<usize> =
        (0..world).map(|r| total / world + usize::from(r < total % world)).collect();
    Ok(contiguous(epoch, &sizes))
}

/// Shares of `total` positions proportional to `ratios` (normalised; a zero ratio gets nothing
/// but its remainder): each rank gets the floor of its share, then the leftover positions go one
/// each to the largest ratios first (ties to the lower rank). Plans are contiguous in rank order
/// and cover `0..total` exactly.
///
/// # Errors
/// [`Error::InvalidSharding`] when `ratios` is empty, holds a negative or non-finite value, or
/// sums to zero.
pub fn weighted_partition(epoch: u64, total: usize, ratios: &[f64]) -> Result<Vec<EpochPlan>> {
    if ratios.is_empty() {
        return Err(Error::InvalidSharding {
            reason: "a partition needs at least one rank".into(),
        });
    }
    if let Some(bad) = ratios.iter().find(|r| !r.is_finite() || **r < 0.0) {
        return Err(Error::InvalidSharding {
            reason: format!("partition ratio {bad} is not a finite non-negative number"),
        });
    }
    let sum: f64 = ratios.iter().sum();
    if sum <= 0.0 || !sum.is_finite() {
        return Err(Error::InvalidSharding { reason: "partition ratios sum to zero".into() });
    }
    let mut sizes: Vec<usize> =
        ratios.iter().map(|r| ((r / sum) * total as f64).floor() as usize).collect();
    // Floating error can push the floored sum past `total`; take back from the smallest ratios.
    let mut assigned: usize = sizes.iter().sum();
    let mut by_ratio: Vec<usize> = (0..ratios.len()).collect();
    by_ratio.sort_by(|&a, &b| ratios[b].total_cmp(&ratios[a]).then(a.cmp(&b)));
    for &r in by_ratio.iter().rev() {
        while assigned > total && sizes[r] > 0 {
            sizes[r] -= 1;
            assigned -= 1;
        }
    }
    let mut next = 0;
    while assigned < total {
        sizes[by_ratio[next % by_ratio.len()]] += 1;
        assigned += 1;
        next += 1;
    }
    Ok(contiguous(epoch, &sizes))
}

fn contiguous(epoch: u64, sizes: &[usize]) -> Vec<EpochPlan> {
    let mut offset = 0;
    sizes
        .iter()
        .map(|&size| {
            let plan = EpochPlan { epoch, offset, size };
            offset += size;
            plan
        })
        .collect()
}

/// What to do with the picks at the end of a plan that do not fill a whole batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum TailPolicy {
    /// Leave them out of this plan's batches (they are not trained on this epoch).
    #[default]
    Drop,
    /// Emit a last, full-size batch whose slots past [`BatchPicks::valid`] are padding (copies of
    /// the batch's first pick) that the consumer must mask out.
    Pad,
}

/// The picks of one batch, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BatchPicks {
    /// Picks (positions in the pick space, not permutation positions).
    pub picks: Vec<usize>,
    /// How many leading picks are real; the rest are padding under [`TailPolicy::Pad`].
    pub valid: usize,
}

impl BatchPicks {
    /// Number of slots in the batch, padding included.
    pub fn len(&self) -> usize {
        self.picks.len()
    }

    /// Whether the batch has no slots.
    pub fn is_empty(&self) -> bool {
        self.picks.is_empty()
    }

    /// Whether some slots are padding.
    pub fn is_padded(&self) -> bool {
        self.valid < self.picks.len()
    }
}

/// The batches of a plan: consecutive groups of `batch_size` picks of `permutation[plan]`, the
/// tail handled by `tail`.
///
/// # Errors
/// [`Error::InvalidSharding`] when the plan reaches past the end of `permutation`.
pub fn plan_batches(
    permutation: &[usize],
    plan: &EpochPlan,
    batch_size: NonZeroUsize,
    tail: TailPolicy,
) -> Result<Vec<BatchPicks>> {
    let picks = plan.picks(permutation)?;
    let bs = batch_size.get();
    let mut batches: Vec<BatchPicks> =
        picks.chunks_exact(bs).map(|c| BatchPicks { picks: c.to_vec(), valid: bs }).collect();
    let rest = picks.chunks_exact(bs).remainder();
    if let (TailPolicy::Pad, Some(&first)) = (tail, rest.first()) {
        let mut padded = rest.to_vec();
        padded.resize(bs, first);
        batches.push(BatchPicks { picks: padded, valid: rest.len() });
    }
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::permutation::epoch_permutation;

    fn nz(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
    }

    #[test]
    fn partitions_cover_exactly_once() -> Result<()> {
        for total in 0..40 {
            for world in 1..7 {
                let plans = equal_partition(3, total, world)?;
                check_cover(&plans, total);
                let max = plans.iter().map(|p| p.size).max().unwrap_or(0);
                let min = plans.iter().map(|p| p.size).min().unwrap_or(0);
                assert!(max - min <= 1);
            }
        }
        for ratios in [&[1.0][..], &[1.0, 2.0], &[0.0, 1.0, 3.0], &[0.1, 0.2, 0.7], &[1e-9, 1e9]] {
            for total in 0..50 {
                let plans = weighted_partition(0, total, ratios)?;
                check_cover(&plans, total);
                let sum: f64 = ratios.iter().sum();
                for (p, r) in plans.iter().zip(ratios) {
                    let share = r / sum * total as f64;
                    assert!((p.size as f64 - share).abs() < 1.0 + 1e-9, "{p:?} share {share}");
                }
            }
        }
        assert!(equal_partition(0, 5, 0).is_err());
        assert!(weighted_partition(0, 5, &[]).is_err());
        assert!(weighted_partition(0, 5, &[0.0, 0.0]).is_err());
        assert!(weighted_partition(0, 5, &[1.0, f64::NAN]).is_err());
        assert!(weighted_partition(0, 5, &[1.0, -1.0]).is_err());
        Ok(())
    }

    fn check_cover(plans: &[EpochPlan], total: usize) {
        let mut next = 0;
        for p in plans {
            assert_eq!(p.offset, next);
            next += p.size;
        }
        assert_eq!(next, total);
    }

    #[test]
    fn pad_marks_padding_and_drop_leaves_tail() -> Result<()> {
        let perm = epoch_permutation(10, 1, 0);
        let plan = EpochPlan { epoch: 0, offset: 2, size: 7 };
        let dropped = plan_batches(&perm, &plan, nz(3), TailPolicy::Drop)?;
        assert_eq!(dropped.len(), 2);
        assert!(dropped.iter().all(|b| !b.is_padded()));
        let padded = plan_batches(&perm, &plan, nz(3), TailPolicy::Pad)?;
        assert_eq!(padded.len(), 3);
        assert_eq!(padded[2].valid, 1);
        assert_eq!(padded[2].picks, vec![perm[8]; 3]);
        let past = EpochPlan { epoch: 0, offset: 5, size: 6 };
        assert!(plan_batches(&perm, &past, nz(3), TailPolicy::Drop).is_err());
        Ok(())
    }
}

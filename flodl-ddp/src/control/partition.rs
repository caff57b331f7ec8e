//! Non-progressive partitions: one contiguous share of an epoch per rank.
//!
//! Units are whatever the caller counts: pass positions for the [0.5] behaviour (each rank then
//! drops its own `len % batch_size` tail), or whole batches and multiply by the batch size for
//! batch-aligned shares that drop nothing but the epoch's own tail (recommended).

use crate::control::logic_error::{LogicError, LogicResult};

// No caller outside this crate's tests: kept for them only.
#[cfg(test)]
/// Smallest ms/batch used to turn a speed into a throughput weight.
pub(crate) const MIN_MS_PER_BATCH: f64 = 0.001;

/// One rank's contiguous share of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Share {
    /// First unit.
    pub offset: usize,
    /// Number of units.
    pub len: usize,
}

/// Equal sizes: `n / w` each, one more for the first `n % w` ranks.
///
/// # Errors
/// [`LogicError::WorldTooSmall`] for an empty world.
pub(crate) fn equal_sizes(n: usize, world: usize) -> LogicResult<Vec<usize>> {
    if world == 0 {
        return Err(LogicError::WorldTooSmall { what: "partition", world, min: 1 });
    }
    Ok((0..world).map(|r| n / world + usize::from(r < n % world)).collect())
}

// No caller outside this crate's tests: kept for them only.
#[cfg(test)]
/// Sizes in proportion to `weights` (explicit ratios, or throughputs): floors of each share,
/// then the remainder one by one to the largest weights (lowest rank on ties). A zero weight gets
/// nothing.
///
/// # Errors
/// [`LogicError::WorldTooSmall`] for no weights; [`LogicError::InvalidValue`] for a negative or
/// non-finite weight or an all-zero set.
pub(crate) fn weighted_sizes(n: usize, weights: &[f64]) -> LogicResult<Vec<usize>> {
    if weights.is_empty() {
        return Err(LogicError::WorldTooSmall { what: "partition", world: 0, min: 1 });
    }
    if let Some(&w) = weights.iter().find(|w| !(w.is_finite() && **w >= 0.0)) {
        return Err(LogicError::InvalidValue { what: "partition weight", value: w });
    }
    let sum: f64 = weights.iter().sum();
    if sum <= 0.0 {
        return Err(LogicError::InvalidValue { what: "sum of partition weights", value: sum });
    }
    let mut sizes: Vec<usize> =
        weights.iter().map(|w| ((n as f64 * w / sum).floor() as usize).min(n)).collect();
    let mut order: Vec<usize> = (0..weights.len()).filter(|&r| weights[r] > 0.0).collect();
    order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
    let mut given: usize = sizes.iter().sum();
    // Floors can only fall short (by less than the number of ranks), never exceed n, except
    // through float rounding, which the loop below also absorbs.
    while given > n {
        let r = *order.iter().rev().find(|&&r| sizes[r] > 0).unwrap_or(&order[0]);
        sizes[r] -= 1;
        given -= 1;
    }
    for &r in order.iter().cycle().take(n - given) {
        sizes[r] += 1;
    }
    Ok(sizes)
}

// No caller outside this crate's tests: kept for them only.
#[cfg(test)]
/// Throughput weights `1 / max(ms, 0.001)` from ms/batch (a rank with no estimate, ms ≤ 0,
/// gets the mean weight of the others, or 1 when nobody has one).
pub(crate) fn throughput_weights(ms_per_batch: &[f64]) -> Vec<f64> {
    let known: Vec<f64> = ms_per_batch
        .iter()
        .filter(|m| **m > 0.0 && m.is_finite())
        .map(|m| 1.0 / m.max(MIN_MS_PER_BATCH))
        .collect();
    let fill = if known.is_empty() { 1.0 } else { known.iter().sum::<f64>() / known.len() as f64 };
    ms_per_batch
        .iter()
        .map(|&m| if m > 0.0 && m.is_finite() { 1.0 / m.max(MIN_MS_PER_BATCH) } else { fill })
        .collect()
}

/// Contiguous shares from sizes, in rank order.
pub(crate) fn shares(sizes: &[usize]) -> Vec<Share> {
    let mut offset = 0;
    sizes
        .iter()
        .map(|&len| {
            let s = Share { offset, len };
            offset += len;
            s
        })
        .collect()
}

#[cfg(test)]
mod tests {
    //! Non-progressive partition sizing against hand-computed values and an f64 reference.

    use crate::LogicError;
    use crate::control::partition::{
        Share, equal_sizes, shares, throughput_weights, weighted_sizes,
    };
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn equal_and_weighted_by_hand() -> TestResult {
        assert_eq!(equal_sizes(10, 3)?, vec![4, 3, 3]);
        assert_eq!(equal_sizes(2, 3)?, vec![1, 1, 0]);
        // 100 * [0.5, 0.3, 0.2]: exact.
        assert_eq!(weighted_sizes(100, &[5.0, 3.0, 2.0])?, vec![50, 30, 20]);
        // 10 * [1/3, 2/3] = 3.33, 6.67 -> floors 3, 6, remainder to the largest weight.
        assert_eq!(weighted_sizes(10, &[1.0, 2.0])?, vec![3, 7]);
        // Throughputs 1/4 and 1/10: 70 -> 50 : 20.
        assert_eq!(weighted_sizes(70, &throughput_weights(&[4.0, 10.0]))?, vec![50, 20]);
        assert_eq!(weighted_sizes(7, &[0.0, 1.0])?, vec![0, 7]);
        assert_eq!(
            shares(&[3, 0, 4]),
            vec![
                Share { offset: 0, len: 3 },
                Share { offset: 3, len: 0 },
                Share { offset: 3, len: 4 }
            ]
        );
        assert_eq!(throughput_weights(&[0.0, 2.0, 0.0005]), vec![500.25, 0.5, 1000.0]);
        Ok(())
    }

    #[test]
    fn bad_weights_are_typed() {
        assert!(matches!(equal_sizes(3, 0), Err(LogicError::WorldTooSmall { .. })));
        assert!(matches!(weighted_sizes(3, &[]), Err(LogicError::WorldTooSmall { .. })));
        for w in [[-1.0, 1.0], [f64::NAN, 1.0], [0.0, 0.0]] {
            assert!(matches!(weighted_sizes(3, &w), Err(LogicError::InvalidValue { .. })), "{w:?}");
        }
    }

    #[test]
    fn weighted_sizes_match_f64_reference() -> TestResult {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
        for _ in 0..3000 {
            let w = rng.random_range(1..9usize);
            let n = rng.random_range(0..100_000usize);
            let weights: Vec<f64> = (0..w).map(|_| rng.random_range(0.01..10.0)).collect();
            let sizes = weighted_sizes(n, &weights)?;
            assert_eq!(sizes.iter().sum::<usize>(), n);
            let sum: f64 = weights.iter().sum();
            for (s, wt) in sizes.iter().zip(&weights) {
                let exact = n as f64 * wt / sum;
                assert!((*s as f64 - exact).abs() < 1.0 + 1e-9, "{s} vs {exact}");
            }
        }
        Ok(())
    }
}

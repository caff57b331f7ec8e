//! Non-progressive partitions: one contiguous share of an epoch per rank.
//!
//! Units are whatever the caller counts: pass positions for the [0.5] behaviour (each rank then
//! drops its own `len % batch_size` tail), or whole batches and multiply by the batch size for
//! batch-aligned shares that drop nothing but the epoch's own tail (recommended).

use crate::control::logic_error::{LogicError, LogicResult};

/// Smallest ms/batch used to turn a speed into a throughput weight.
pub(crate) const MIN_MS_PER_BATCH: f64 = 0.001;

/// One rank's contiguous share of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// First unit.
    pub offset: usize,
    /// Number of units.
    pub len: usize,
}

/// Equal sizes: `n / w` each, one more for the first `n % w` ranks.
///
/// # Errors
/// [`LogicError::WorldTooSmall`] for an empty world.
pub fn equal_sizes(n: usize, world: usize) -> LogicResult<Vec<usize>> {
    if world == 0 {
        return Err(LogicError::WorldTooSmall { what: "partition", world, min: 1 });
    }
    Ok((0..world).map(|r| n / world + usize::from(r < n % world)).collect())
}

/// Sizes in proportion to `weights` (explicit ratios, or throughputs): floors of each share,
/// then the remainder one by one to the largest weights (lowest rank on ties). A zero weight gets
/// nothing.
///
/// # Errors
/// [`LogicError::WorldTooSmall`] for no weights; [`LogicError::InvalidValue`] for a negative or
/// non-finite weight or an all-zero set.
pub fn weighted_sizes(n: usize, weights: &[f64]) -> LogicResult<Vec<usize>> {
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

/// Throughput weights `1 / max(ms, 0.001)` from ms/batch (a rank with no estimate, ms ≤ 0,
/// gets the mean weight of the others, or 1 when nobody has one).
pub fn throughput_weights(ms_per_batch: &[f64]) -> Vec<f64> {
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
pub fn shares(sizes: &[usize]) -> Vec<Share> {
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

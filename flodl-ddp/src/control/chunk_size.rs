//! How many batches a rank's next chunk holds, and how an epoch's last windows are split.

use crate::control::chunk_pool::ChunkPool;

/// Smallest chunk, in batches, progressive dispatch hands out (unless less remains).
pub const MIN_CHUNK_BATCHES: usize = 4;
/// An uncalibrated pool probes with chunks of about this fraction of a rank's epoch share.
pub const PROBE_DIVISOR: usize = 10;

/// What the sizer knows about the cohort's speed (usually read from `ElChe`).
#[derive(Debug, Clone, Copy)]
pub struct Speeds<'a> {
    /// ElChe's batches per window, per rank (0 for retired ranks).
    pub counts: &'a [usize],
    /// Smoothed ms/batch per rank (0 where unknown).
    pub ms_per_batch: &'a [f64],
    /// True once ElChe is calibrated or was given a speed hint.
    pub informed: bool,
}

/// Progressive-dispatch chunk sizing.
///
/// Calibrated: `ceil(remaining × counts[r] / Σcounts)` batches, at most `max_windows` windows of
/// the rank, tail-balanced near the end of the epoch, at least `min_batches`. Uncalibrated:
/// a probe of `max(min_batches, epoch_batches / (W × 10))`.
///
/// The `max_windows` cap is not in the [0.5] rule, which hands a rank its whole proportional
/// share of what remains in one chunk: 70% of an epoch committed to one rank cannot follow a
/// later change of speed and is all lost if the rank dies. Two windows per chunk keep a rank fed
/// across one reduce while the rest of the epoch stays in the pool; the cost is one more message
/// per chunk. `None` gives the [0.5] behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSizing {
    /// Smallest chunk in batches.
    pub min_batches: usize,
    /// Largest chunk, in windows of the rank (`counts[r]` batches); `None` for no cap.
    pub max_windows: Option<usize>,
}

impl Default for ChunkSizing {
    fn default() -> ChunkSizing {
        ChunkSizing { min_batches: MIN_CHUNK_BATCHES, max_windows: Some(2) }
    }
}

impl ChunkSizing {
    /// Batches for `rank`'s next chunk from `pool` (0 when the pool is exhausted).
    ///
    /// Tail balance: once the remainder is smaller than `target × W`, if the longest backlog of
    /// another rank (`in_flight × its ms/batch`) exceeds one of this rank's batches, the target is
    /// capped at the batches this rank trains in that time, so the fast rank does not grab the
    /// tail that the slow rank would have finished sooner.
    pub fn batches(&self, rank: usize, pool: &ChunkPool, speeds: &Speeds<'_>) -> usize {
        let rem = pool.remaining_batches();
        if rem == 0 {
            return 0;
        }
        let alive = (0..pool.world()).filter(|&r| !pool.is_retired(r)).count().max(1);
        let min = self.min_batches.max(1);
        let count = speeds.counts.get(rank).copied().unwrap_or(0);
        let sum: usize = speeds.counts.iter().sum();
        if !speeds.informed || count == 0 || sum == 0 {
            let epoch_batches = pool.total().div_ceil(pool.batch_size());
            return (epoch_batches / (alive * PROBE_DIVISOR)).max(min).min(rem);
        }
        let mut target = (rem * count).div_ceil(sum);
        if let Some(w) = self.max_windows {
            target = target.min(w.max(1) * count);
        }
        let my_ms = speeds.ms_per_batch.get(rank).copied().unwrap_or(0.0);
        if rem < target * alive && my_ms > 0.0 {
            let backlog = (0..pool.world())
                .filter(|&r| r != rank)
                .map(|r| {
                    pool.in_flight_batches(r) as f64
                        * speeds.ms_per_batch.get(r).copied().unwrap_or(0.0)
                })
                .fold(0.0, f64::max);
            if backlog > my_ms {
                target = target.min((backlog / my_ms).ceil() as usize);
            }
        }
        target.max(min).min(rem)
    }
}

/// Splits the next window's batches when an epoch is about to end ([0.6+] epoch-tail rule), so
/// no rank ends the epoch on a window of a single step.
///
/// With `rem` batches left and `Σ = Σcounts`:
/// * `rem ≥ Σ + W`: the window is the plain `counts`.
/// * `Σ ≤ rem < Σ + W`: the `R = rem − Σ` leftover batches would make a last window shorter than
///   one batch per rank; they are folded as +1 onto the `R` slowest ranks (smallest counts, lowest
///   rank on ties, never the fastest), so this window ends the epoch.
/// * `rem < Σ`: `rem` is split in proportion to the counts (floors, remainder one by one to the
///   fastest ranks first), then every rank left with exactly one batch moves it onto the smallest
///   other rank holding at least one.
///
/// Retired ranks (count 0) get 0; the result sums to `min(rem, Σ)` or, in the fold case, `rem`.
pub fn window_allocation(rem: usize, counts: &[usize]) -> Vec<usize> {
    let sum: usize = counts.iter().sum();
    let alive: Vec<usize> = (0..counts.len()).filter(|&r| counts[r] > 0).collect();
    if sum == 0 || rem >= sum + alive.len() {
        return counts.to_vec();
    }
    // The fastest rank: the largest count, lowest rank on ties.
    let fastest =
        alive.iter().copied().fold(alive[0], |b, r| if counts[r] > counts[b] { r } else { b });
    let mut out = counts.to_vec();
    if rem >= sum {
        let mut slow: Vec<usize> = alive.iter().copied().filter(|&r| r != fastest).collect();
        slow.sort_by_key(|&r| (counts[r], r));
        for &r in slow.iter().take(rem - sum) {
            out[r] += 1;
        }
        return out;
    }
    for &r in &alive {
        out[r] = rem * counts[r] / sum;
    }
    let mut by_speed = alive.clone();
    by_speed.sort_by_key(|&r| (std::cmp::Reverse(counts[r]), r));
    let given: usize = out.iter().sum();
    for &r in by_speed.iter().cycle().take(rem - given) {
        out[r] += 1;
    }
    loop {
        let holders: Vec<usize> = alive.iter().copied().filter(|&r| out[r] > 0).collect();
        let Some(&single) = holders.iter().find(|&&r| out[r] == 1) else { break };
        let peer = holders.iter().copied().filter(|&r| r != single).min_by_key(|&r| (out[r], r));
        let Some(peer) = peer else { break };
        out[peer] += 1;
        out[single] = 0;
    }
    out
}

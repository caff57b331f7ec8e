//! The emulated slower device: how a CPU rank is made into a device `factor` times slower
//! (`--slowdown`, `--speed-change`, `FLODL_JITTER`), for tests and benches.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Below this, a slowdown wait spins: a sleep overshoots by tens of microseconds.
const SPIN_BELOW: Duration = Duration::from_micros(300);

/// Holds the rank for `d`, the extra time an emulated slower device would have spent: sleeps
/// (freeing the core, as a busy accelerator would) and spins only the last stretch, so short
/// steps are slowed by the right factor.
fn hold_for(d: Duration) {
    let end = Instant::now() + d;
    if d > SPIN_BELOW {
        std::thread::sleep(d - SPIN_BELOW / 2);
    }
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// Test-facing: `FLODL_JITTER=F` (0 ≤ F < 1) stretches every step of every rank by a factor
/// drawn uniformly in [1 − F, 1 + F] on top of its slowdown (a step cannot be shortened below
/// its own compute), to emulate devices whose speed wobbles.
const JITTER: &str = "FLODL_JITTER";

/// The factor a rank's step `step` is stretched by, by [`JITTER`] (1 when unset): a hash of
/// `(rank, step)`, the same in every run.
pub(super) fn jitter(rank: usize, step: u64) -> f64 {
    static SPREAD: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let spread = *SPREAD.get_or_init(|| {
        let f = std::env::var(JITTER).ok().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        if (0.0..1.0).contains(&f) { f } else { 0.0 }
    });
    if spread == 0.0 {
        return 1.0;
    }
    // splitmix64 of the pair: a uniform draw in [0, 1).
    let mut z = (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ step;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let u = (z >> 11) as f64 / (1u64 << 53) as f64;
    1.0 + spread * (2.0 * u - 1.0)
}

/// How many of a rank's latest step times its typical step is the median of.
const RECENT: usize = 32;

/// A step's compute counts for at most this many typical steps when it is stretched: what is
/// over it is the host's hiccup (the core taken by other work, a page fault), which a slower
/// device would not multiply.
const HICCUP: f64 = 2.0;

/// A rank's emulated slower device: each step stretched to `factor` times its compute, where
/// the compute counts at most [`HICCUP`] times the median of the [`RECENT`] latest steps. A
/// hiccup of a few ms stretched by a factor of 1,000 would hold the rank, silent, for seconds:
/// no device is slower that way, and a deadline derived from the rank's windows would rightly
/// take it for hung.
#[derive(Debug, Default)]
pub(super) struct SlowerDevice {
    recent: VecDeque<Duration>,
}

impl SlowerDevice {
    /// The extra time after a step that computed for `compute`, on a device `factor` times
    /// slower (none at 1 or below); the step joins the recent ones.
    pub(super) fn extra(&mut self, compute: Duration, factor: f64) -> Duration {
        // Only a stretched step needs the median (most runs stretch none).
        let stretched = factor > 1.0 && factor.is_finite();
        let typical = if stretched { self.typical() } else { None };
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(compute);
        if !stretched {
            return Duration::ZERO;
        }
        let counted = typical.map_or(compute, |t| compute.min(t.mul_f64(HICCUP)));
        counted.mul_f64(factor - 1.0)
    }

    /// Holds the rank for the [`extra`](Self::extra) time of a step that computed for
    /// `compute`, on a device `factor` times slower.
    pub(super) fn hold(&mut self, compute: Duration, factor: f64) {
        let extra = self.extra(compute, factor);
        if !extra.is_zero() {
            hold_for(extra);
        }
    }

    /// The median of the recent steps (the upper one of an even count); `None` before
    /// [`RECENT`]` / 4` steps.
    fn typical(&self) -> Option<Duration> {
        if self.recent.len() < RECENT / 4 {
            return None;
        }
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        sorted.get(sorted.len() / 2).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    /// Random step times (steady, with rare hiccups of up to 1,000 times a step, and a lasting
    /// change of speed halfway) against a reference in f64: each extra is (factor − 1) times the
    /// step, capped at twice the median of the steps before it once there are 8 of them; a
    /// factor of 1 or less adds nothing.
    #[test]
    fn a_hiccup_is_not_stretched_and_a_steady_step_is() -> Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
        for case in 0..200 {
            let factor = [0.5, 1.0, 1.5, 10.0, 1000.0][case % 5];
            let base: f64 = rng.random_range(10.0..5_000.0);
            let mut device = SlowerDevice::default();
            let mut history: Vec<f64> = Vec::new();
            for step in 0..120 {
                let speed: f64 = if step < 60 { 1.0 } else { 3.0 };
                let noise = rng.random_range(0.9..1.1);
                let hiccup =
                    if rng.random_bool(0.05) { rng.random_range(2.0..1000.0) } else { 1.0 };
                let us = (base * speed * noise * hiccup).round();
                let compute = Duration::from_micros(us as u64);
                let last = &history[history.len().saturating_sub(RECENT)..];
                let counted = if last.len() >= RECENT / 4 {
                    let mut sorted = last.to_vec();
                    sorted.sort_by(f64::total_cmp);
                    us.min(2.0 * sorted[sorted.len() / 2])
                } else {
                    us
                };
                let want = if factor > 1.0 { counted * (factor - 1.0) } else { 0.0 };
                let got = device.extra(compute, factor).as_secs_f64() * 1e6;
                if (got - want).abs() > 1e-3 * want.max(1.0) {
                    return Err(format!("case {case}, step {step}: {got} µs, want {want}"));
                }
                history.push(us);
            }
        }
        Ok(())
    }
}

//! Prefetch depth: how many batches may wait on the device, from the VRAM gauge or forced.

use flodl_tensor::Device;

/// How many uploaded batches a prefetcher may keep waiting for its consumer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Depth {
    /// Exactly this many (0 makes the queue a rendezvous: one batch prepared ahead, in hand).
    Fixed(usize),
    /// From the device's memory gauge, re-evaluated at the start of every plan.
    Vram(VramBudget),
}

impl Default for Depth {
    fn default() -> Self {
        Depth::Vram(VramBudget::default())
    }
}

/// The share of device memory the prefetch queue may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VramBudget {
    /// Fraction of total device memory the process may use, clamped to `[0.5, 0.99]`.
    pub max_usage: f64,
    /// Bytes kept free for activations (measured by the runtime after its first batch).
    pub reserve_bytes: u64,
    /// Upper bound on the depth.
    pub max_depth: usize,
}

impl Default for VramBudget {
    /// 90% of device memory, no reserve, at most 512 batches.
    fn default() -> Self {
        Self { max_usage: 0.90, reserve_bytes: 0, max_depth: 512 }
    }
}

/// The depth a CPU rank uses under [`Depth::Vram`] (host memory is not gauged per batch).
///
/// Four, not two: on a machine whose cores are shared, the prefetch thread sometimes waits
/// for a core, and two batches of slack then let a 1 ms consumer starve for 0.5–5% of its wall
/// time; four keep it under 0.3% (`cargo bench -p flodl-benches --bench data -- prefetch`).
/// The memory is a few host batches.
pub const CPU_DEPTH: usize = 4;

/// Depth from a memory gauge: `(total·clamp(max_usage, 0.5, 0.99) − used − reserve) / batch_bytes`
/// (saturating at 0), at most `budget.max_depth`; [`CPU_DEPTH`] for the CPU or a zero batch size.
///
/// `used` is `total − free` at the time of the call, so it includes the model and optimizer
/// state already allocated.
pub fn vram_depth(
    device: Device,
    total: u64,
    free: u64,
    batch_bytes: u64,
    budget: &VramBudget,
) -> usize {
    if device.is_cpu() || batch_bytes == 0 {
        return CPU_DEPTH.min(budget.max_depth);
    }
    let usage = if budget.max_usage.is_nan() { 0.5 } else { budget.max_usage.clamp(0.5, 0.99) };
    let cap = (total as f64 * usage) as u64;
    let used = total.saturating_sub(free);
    let room = cap.saturating_sub(used).saturating_sub(budget.reserve_bytes);
    usize::try_from(room / batch_bytes).unwrap_or(usize::MAX).min(budget.max_depth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_follows_the_gauge_formula() {
        let b = |max_usage, reserve_bytes, max_depth| VramBudget {
            max_usage,
            reserve_bytes,
            max_depth,
        };
        let gib = 1u64 << 30;
        let cuda = Device::Cuda(0);
        // 80 GiB card, 20 GiB used, 90% cap = 72 GiB, 52 GiB room, 1 GiB batches.
        assert_eq!(vram_depth(cuda, 80 * gib, 60 * gib, gib, &b(0.9, 0, 512)), 52);
        assert_eq!(vram_depth(cuda, 80 * gib, 60 * gib, gib, &b(0.9, 2 * gib, 512)), 50);
        assert_eq!(vram_depth(cuda, 80 * gib, 60 * gib, gib, &b(0.9, 0, 10)), 10);
        // max_usage clamps to [0.5, 0.99].
        assert_eq!(vram_depth(cuda, 100 * gib, 100 * gib, gib, &b(0.1, 0, 512)), 50);
        assert_eq!(vram_depth(cuda, 100 * gib, 100 * gib, gib, &b(1.5, 0, 512)), 99);
        // Over budget saturates at 0.
        assert_eq!(vram_depth(cuda, 10 * gib, gib, gib, &b(0.9, 0, 512)), 0);
        assert_eq!(vram_depth(Device::Cpu, 0, 0, gib, &b(0.9, 0, 512)), CPU_DEPTH);
        assert_eq!(vram_depth(cuda, 10 * gib, 10 * gib, 0, &b(0.9, 0, 512)), CPU_DEPTH);
        // Against an f64 reference on random gauges.
        let mut x = 0x1234_5678_9abc_def0u64;
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let total = x % (200 * gib) + 1;
            let free = (x >> 3) % (total + 1);
            let batch = (x >> 11) % (gib / 8) + 1;
            let reserve = (x >> 17) % (4 * gib);
            let got = vram_depth(cuda, total, free, batch, &b(0.9, reserve, usize::MAX));
            let room = total as f64 * 0.9 - (total - free) as f64 - reserve as f64;
            let want = (room / batch as f64).floor().max(0.0);
            assert!((got as f64 - want).abs() <= 1.0, "got {got} want {want}");
        }
    }
}

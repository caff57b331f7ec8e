//! The averaging core: `out = Σ w_i x_i` in one pass over memory.
//!
//! The output is built in 64-float tiles held in registers: the first input initialises the
//! tile, the others are added in input order (f32), and the finished tile is written once, so
//! every input is read exactly once and all inputs stream side by side. Large outputs are written
//! with non-temporal stores so the destination is not read into cache first, and on that path
//! every input is prefetched into L2 1 KiB ahead (more loads in flight than the hardware
//! prefetchers keep for this many streams). The tile loop is compiled for AVX-512 and AVX2 and
//! picked at run time.

use super::CpuWorkers;

/// Floats per tile: four cache lines, held in four AVX-512 (or eight AVX2) registers.
const TILE: usize = 64;

/// Outputs at least this long bypass the cache on the final store.
const STREAMING_MIN: usize = 1 << 18;

/// How far ahead (in floats, 1 KiB) each input is prefetched on the streaming path.
const PREFETCH_AHEAD: usize = 256;

/// `out = Σ weights[i] · inputs[i]`; every input is as long as `out` and `inputs` is non-empty.
pub(crate) fn weighted_sum(w: &CpuWorkers, inputs: &[&[f32]], weights: &[f32], out: &mut [f32]) {
    let streaming = out.len() >= STREAMING_MIN;
    w.split1(out, |off, oc| chunk(inputs, weights, off, oc, streaming));
}

/// One element, summed in input order (used for the unaligned head and the tail).
#[inline(always)]
fn element(inputs: &[&[f32]], weights: &[f32], i: usize) -> f32 {
    let mut acc = weights[0] * inputs[0][i];
    for (x, wt) in inputs[1..].iter().zip(&weights[1..]) {
        acc += *wt * x[i];
    }
    acc
}

fn chunk(inputs: &[&[f32]], weights: &[f32], off: usize, out: &mut [f32], streaming: bool) {
    if inputs.is_empty() || weights.len() != inputs.len() {
        return;
    }
    let n = out.len();
    // Align the tiles to 64 bytes so their stores can stream.
    let head = out.as_ptr().align_offset(64).min(n);
    let body = (n - head) / TILE * TILE;
    for (i, o) in out[..head].iter_mut().enumerate() {
        *o = element(inputs, weights, off + i);
    }
    tiles::run(inputs, weights, off + head, &mut out[head..head + body], streaming);
    for (i, o) in out[head + body..].iter_mut().enumerate() {
        *o = element(inputs, weights, off + head + body + i);
    }
}

/// The tile loop over `out` (a multiple of [`TILE`] long, 64-byte aligned), inputs from `off`.
#[inline(always)]
fn tile_loop(
    inputs: &[&[f32]],
    weights: &[f32],
    off: usize,
    out: &mut [f32],
    prefetch: impl Fn(*const f32),
    store: impl Fn(&mut [f32], &[f32; TILE]),
) {
    let (x0, xs) = (inputs[0], &inputs[1..]);
    let (w0, ws) = (weights[0], &weights[1..]);
    for (t, o) in out.chunks_exact_mut(TILE).enumerate() {
        let lo = off + t * TILE;
        for x in inputs {
            for line in (0..TILE).step_by(16) {
                // Only an address to hint at: it may lie past the end and is never read.
                prefetch(x.as_ptr().wrapping_add(lo + PREFETCH_AHEAD + line));
            }
        }
        let mut acc = [0.0f32; TILE];
        for (a, x) in acc.iter_mut().zip(&x0[lo..lo + TILE]) {
            *a = w0 * *x;
        }
        for (x, wt) in xs.iter().zip(ws) {
            for (a, v) in acc.iter_mut().zip(&x[lo..lo + TILE]) {
                *a += *wt * *v;
            }
        }
        store(o, &acc);
    }
}

#[cfg(target_arch = "x86_64")]
mod tiles {
    use std::arch::x86_64::{
        _MM_HINT_T1, _mm_prefetch, _mm_sfence, _mm256_loadu_ps, _mm256_stream_ps,
    };

    use super::{TILE, tile_loop};

    pub(super) fn run(inputs: &[&[f32]], weights: &[f32], off: usize, out: &mut [f32], nt: bool) {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked just above), which implies AVX.
            unsafe { run_avx512(inputs, weights, off, out, nt) }
        } else if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above), which implies AVX.
            unsafe { run_avx2(inputs, weights, off, out, nt) }
        } else {
            tile_loop(inputs, weights, off, out, |_| {}, |o, a| o.copy_from_slice(a));
        }
    }

    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn run_avx512(
        inputs: &[&[f32]],
        weights: &[f32],
        off: usize,
        out: &mut [f32],
        nt: bool,
    ) {
        if nt {
            // SAFETY: AVX is implied by AVX-512F, which the caller guarantees.
            tile_loop(inputs, weights, off, out, prefetch, |o, a| unsafe { stream_tile(o, a) });
            fence();
        } else {
            tile_loop(inputs, weights, off, out, |_| {}, |o, a| o.copy_from_slice(a));
        }
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn run_avx2(inputs: &[&[f32]], weights: &[f32], off: usize, out: &mut [f32], nt: bool) {
        if nt {
            // SAFETY: AVX is implied by AVX2, which the caller guarantees.
            tile_loop(inputs, weights, off, out, prefetch, |o, a| unsafe { stream_tile(o, a) });
            fence();
        } else {
            tile_loop(inputs, weights, off, out, |_| {}, |o, a| o.copy_from_slice(a));
        }
    }

    /// Writes one tile with non-temporal stores.
    ///
    /// # Safety
    /// The CPU must support AVX; `o` must be 32-byte aligned (tiles are 64-byte aligned).
    #[inline(always)]
    unsafe fn stream_tile(o: &mut [f32], a: &[f32; TILE]) {
        if o.len() < TILE {
            return;
        }
        let (d, s) = (o.as_mut_ptr(), a.as_ptr());
        for k in (0..TILE).step_by(8) {
            // SAFETY: k + 8 <= TILE <= o.len() keeps both accesses in bounds; d + k is 32-byte
            // aligned (the caller aligned d to 64 bytes and k is a multiple of 8 floats); AVX is
            // available per the caller.
            unsafe { _mm256_stream_ps(d.add(k), _mm256_loadu_ps(s.add(k))) };
        }
    }

    /// Asks for the cache line holding `p` to be brought into L2 ahead of use.
    #[inline(always)]
    fn prefetch(p: *const f32) {
        // SAFETY: `prefetch` is part of SSE, which every x86_64 CPU has, and it never faults:
        // the address is only a hint and is not dereferenced.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast::<i8>()) }
    }

    /// Orders this thread's non-temporal stores before whatever it does next.
    fn fence() {
        // SAFETY: `sfence` is part of SSE, which every x86_64 CPU has.
        unsafe { _mm_sfence() }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod tiles {
    use super::tile_loop;

    pub(super) fn run(inputs: &[&[f32]], weights: &[f32], off: usize, out: &mut [f32], _nt: bool) {
        tile_loop(inputs, weights, off, out, |_| {}, |o, a| o.copy_from_slice(a));
    }
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    use super::{CpuWorkers, STREAMING_MIN, weighted_sum};

    /// The order every caller relies on: `w0·x0`, then `+ wi·xi` for i = 1, 2, … in f32.
    fn sequential(inputs: &[Vec<f32>], weights: &[f32], i: usize) -> f32 {
        let mut acc = weights[0] * inputs[0][i];
        for (x, w) in inputs[1..].iter().zip(&weights[1..]) {
            acc += *w * x[i];
        }
        acc
    }

    /// Every path (head, tiles, tail, cached and streaming stores, one or two threads, any
    /// output alignment) gives bit for bit the sequential f32 sum in input order.
    #[test]
    fn bitwise_equal_to_sequential_input_order() -> Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x5eed_0002);
        for threads in [1, 2] {
            let workers = CpuWorkers::new(threads);
            for n in [1, 7, 63, 1023, 4099, STREAMING_MIN + 3] {
                for count in 1..=9 {
                    let inputs: Vec<Vec<f32>> = (0..count)
                        .map(|_| (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect())
                        .collect();
                    let weights: Vec<f32> =
                        (0..count).map(|_| rng.random::<f32>() * 1.5 - 0.25).collect();
                    let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
                    // Shift the output by `skew` floats so the unaligned head is exercised too.
                    let skew = rng.random_range(0..16usize);
                    let mut buf = vec![f32::NAN; n + skew];
                    let out = &mut buf[skew..];
                    weighted_sum(&workers, &refs, &weights, out);
                    for (i, got) in out.iter().enumerate() {
                        let want = sequential(&inputs, &weights, i);
                        if got.to_bits() != want.to_bits() {
                            return Err(format!(
                                "threads={threads} n={n} W={count} skew={skew} i={i}: \
                                 got {got:e}, sequential order gives {want:e}"
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

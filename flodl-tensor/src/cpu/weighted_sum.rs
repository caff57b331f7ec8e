//! The averaging core: `out = Σ w_i x_i` in one pass over memory.
//!
//! The output is built in L1-sized blocks: the first input initialises a block accumulator, the
//! others are added in input order (f32), and the finished block is written once. Large outputs
//! are written with non-temporal stores so the destination is not read into cache first; each
//! input is read exactly once.

use super::CpuWorkers;

/// Elements per block: an 8 KiB accumulator that stays in L1.
const BLOCK: usize = 2048;

/// Outputs at least this long bypass the cache on the final store.
const STREAMING_MIN: usize = 1 << 18;

/// `out = Σ weights[i] · inputs[i]`; every input is as long as `out` and `inputs` is non-empty.
pub(crate) fn weighted_sum(w: &CpuWorkers, inputs: &[&[f32]], weights: &[f32], out: &mut [f32]) {
    let streaming = out.len() >= STREAMING_MIN;
    w.split1(out, |off, oc| block_loop(inputs, weights, off, oc, streaming));
}

fn block_loop(inputs: &[&[f32]], weights: &[f32], off: usize, out: &mut [f32], streaming: bool) {
    let (Some((x0, xs)), Some((w0, ws))) = (inputs.split_first(), weights.split_first()) else {
        return;
    };
    let mut acc = [0.0f32; BLOCK];
    let mut start = 0;
    while start < out.len() {
        let n = BLOCK.min(out.len() - start);
        let a = &mut acc[..n];
        let lo = off + start;
        for (d, s) in a.iter_mut().zip(&x0[lo..lo + n]) {
            *d = *w0 * *s;
        }
        for (x, wt) in xs.iter().zip(ws) {
            for (d, s) in a.iter_mut().zip(&x[lo..lo + n]) {
                *d += *wt * *s;
            }
        }
        let dst = &mut out[start..start + n];
        if streaming {
            store::streaming(dst, a);
        } else {
            dst.copy_from_slice(a);
        }
        start += n;
    }
    if streaming {
        store::fence();
    }
}

#[cfg(target_arch = "x86_64")]
mod store {
    use std::arch::x86_64::{_mm_sfence, _mm256_loadu_ps, _mm256_stream_ps};

    /// Copies `src` into `dst` with non-temporal stores where the CPU has AVX.
    pub(super) fn streaming(dst: &mut [f32], src: &[f32]) {
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU supports AVX (checked just above).
            unsafe { streaming_avx(dst, src) }
        } else {
            dst.copy_from_slice(src);
        }
    }

    /// Orders this thread's non-temporal stores before whatever it does next.
    pub(super) fn fence() {
        // SAFETY: `sfence` is part of SSE, which every x86_64 CPU has.
        unsafe { _mm_sfence() }
    }

    /// # Safety
    /// The CPU must support AVX.
    #[target_feature(enable = "avx")]
    unsafe fn streaming_avx(dst: &mut [f32], src: &[f32]) {
        let n = dst.len().min(src.len());
        let head = dst.as_ptr().align_offset(32).min(n);
        dst[..head].copy_from_slice(&src[..head]);
        let mut i = head;
        let d = dst.as_mut_ptr();
        let s = src.as_ptr();
        while i + 8 <= n {
            // SAFETY: i + 8 <= n keeps both 8-float accesses in bounds of both slices;
            // d + i is 32-byte aligned (head aligned it and i advances by 8 floats), as
            // `_mm256_stream_ps` requires; the load is unaligned-tolerant.
            unsafe { _mm256_stream_ps(d.add(i), _mm256_loadu_ps(s.add(i))) };
            i += 8;
        }
        dst[i..n].copy_from_slice(&src[i..n]);
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod store {
    pub(super) fn streaming(dst: &mut [f32], src: &[f32]) {
        dst.copy_from_slice(src);
    }

    pub(super) fn fence() {}
}

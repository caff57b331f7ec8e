//! Blockwise quantization kernels (the bytes are described in `crate::quant`).

use rayon::prelude::*;

use super::CpuWorkers;
use crate::quant::{QuantFormat, SCALE_BYTES};

/// Blocks handed to one task when splitting across the stream's threads.
const BLOCKS_PER_TASK: usize = 512;

/// The first index in `x` (offset by `base`) whose value is not finite.
fn first_non_finite(x: &[f32], base: usize) -> Option<usize> {
    // A branch-free sweep first (it vectorises); the position only on the rare failure.
    if x.iter().fold(true, |ok, v| ok & v.is_finite()) {
        None
    } else {
        x.iter().position(|v| !v.is_finite()).map(|i| base + i)
    }
}

/// `y` rounded to the nearest integer (ties to even), for `|y| < 2^22`: adding and removing
/// 1.5 · 2^23 leaves no fraction bits. Plain adds, so the loops vectorise on any x86-64 (`round`
/// is a libm call per value without SSE4.1).
#[inline]
fn round(y: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (y + SHIFT) - SHIFT
}

/// The block's scale and the multiplier that turns a value into its code.
fn scale_of(x: &[f32], levels: f32) -> (f32, f32) {
    let absmax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = absmax / levels;
    // A zero (or vanishing) block: every code is 0.
    let inv = if scale > 0.0 && (1.0 / scale).is_finite() { 1.0 / scale } else { 0.0 };
    (scale, inv)
}

/// Writes one block of finite values: the scale, then the codes; `y`, when given, receives the
/// value each code stands for.
fn encode_block(format: QuantFormat, x: &[f32], out: &mut [u8], y: Option<&mut [f32]>) {
    let (scale, inv) = scale_of(x, format.levels());
    let scale = if inv == 0.0 { 0.0 } else { scale };
    out[..SCALE_BYTES].copy_from_slice(&scale.to_le_bytes());
    let codes = &mut out[SCALE_BYTES..];
    match format {
        QuantFormat::Int8 => {
            for (c, v) in codes.iter_mut().zip(x) {
                // |v·inv| ≤ 127 up to rounding (within `round`'s range); `as` saturates.
                *c = round(v * inv) as i8 as u8;
            }
        }
        QuantFormat::Q4 => {
            for (c, pair) in codes.iter_mut().zip(x.chunks(2)) {
                let lo = round(pair[0] * inv).clamp(-7.0, 7.0) as i8;
                let hi = match pair.get(1) {
                    Some(v) => (round(v * inv).clamp(-7.0, 7.0) as i8 + 8) as u8,
                    None => 0,
                };
                *c = (lo + 8) as u8 | (hi << 4);
            }
        }
    }
    if let Some(y) = y {
        decode_codes(format, scale, codes, y);
    }
}

/// The values of one block's codes, given its scale.
fn decode_codes(format: QuantFormat, scale: f32, codes: &[u8], y: &mut [f32]) {
    match format {
        QuantFormat::Int8 => {
            for (v, c) in y.iter_mut().zip(codes) {
                *v = f32::from(*c as i8) * scale;
            }
        }
        QuantFormat::Q4 => {
            for (pair, c) in y.chunks_mut(2).zip(codes) {
                pair[0] = f32::from((c & 0x0f) as i8 - 8) * scale;
                if let Some(v) = pair.get_mut(1) {
                    *v = f32::from((c >> 4) as i8 - 8) * scale;
                }
            }
        }
    }
}

/// Runs `f(first value, values, bytes)` over `x` and `out` cut into matching runs of whole
/// blocks, on the stream's threads for large inputs; the first error (by position) wins.
fn split<A: Send, E: Send>(
    w: &CpuWorkers,
    format: QuantFormat,
    x: &mut [A],
    out: &mut [u8],
    f: impl Fn(usize, &mut [A], &mut [u8]) -> Result<(), E> + Sync,
) -> Result<(), E> {
    match w.pool_for(x.len()) {
        None => f(0, x, out),
        Some(pool) => {
            let values = BLOCKS_PER_TASK * format.block();
            let bytes = BLOCKS_PER_TASK * format.block_bytes();
            pool.install(|| {
                x.par_chunks_mut(values)
                    .zip(out.par_chunks_mut(bytes))
                    .enumerate()
                    .map(|(i, (xc, oc))| f(i * values, xc, oc))
                    .collect::<Result<Vec<()>, E>>()
                    .map(|_| ())
            })
        }
    }
}

/// Quantizes `x` into `out` (exactly `format.encoded_len(x.len())` bytes); `Err(index)` names
/// the first non-finite value, in which case `out` holds no meaning.
pub(crate) fn quantize(
    w: &CpuWorkers,
    format: QuantFormat,
    x: &[f32],
    out: &mut [u8],
) -> Result<(), usize> {
    let b = format.block();
    let values = BLOCKS_PER_TASK * b;
    let bytes = BLOCKS_PER_TASK * format.block_bytes();
    let run = |base: usize, xc: &[f32], oc: &mut [u8]| -> Result<(), usize> {
        if let Some(i) = first_non_finite(xc, base) {
            return Err(i);
        }
        let mut at = 0;
        for block in xc.chunks(b) {
            let len = SCALE_BYTES + format.code_bytes(block.len());
            encode_block(format, block, &mut oc[at..at + len], None);
            at += len;
        }
        Ok(())
    };
    match w.pool_for(x.len()) {
        None => run(0, x, out),
        Some(pool) => pool.install(|| {
            x.par_chunks(values)
                .zip(out.par_chunks_mut(bytes))
                .enumerate()
                .map(|(i, (xc, oc))| run(i * values, xc, oc))
                .collect::<Result<Vec<()>, usize>>()
                .map(|_| ())
        }),
    }
}

/// Writes the values of `bytes` (exactly `format.encoded_len(y.len())` of them) into `y`;
/// `Err(index)` names the first value of a block whose scale is not finite (hostile bytes).
pub(crate) fn dequantize(
    w: &CpuWorkers,
    format: QuantFormat,
    bytes: &[u8],
    y: &mut [f32],
) -> Result<(), usize> {
    let b = format.block();
    let values = BLOCKS_PER_TASK * b;
    let per_task = BLOCKS_PER_TASK * format.block_bytes();
    let run = |base: usize, yc: &mut [f32], bc: &[u8]| -> Result<(), usize> {
        let mut at = 0;
        for (k, block) in yc.chunks_mut(b).enumerate() {
            let len = format.code_bytes(block.len());
            let mut raw = [0u8; SCALE_BYTES];
            raw.copy_from_slice(&bc[at..at + SCALE_BYTES]);
            let scale = f32::from_le_bytes(raw);
            if !scale.is_finite() {
                return Err(base + k * b);
            }
            decode_codes(format, scale, &bc[at + SCALE_BYTES..at + SCALE_BYTES + len], block);
            at += SCALE_BYTES + len;
        }
        Ok(())
    };
    match w.pool_for(y.len()) {
        None => run(0, y, bytes),
        Some(pool) => pool.install(|| {
            y.par_chunks_mut(values)
                .zip(bytes.par_chunks(per_task))
                .enumerate()
                .map(|(i, (yc, bc))| run(i * values, yc, bc))
                .collect::<Result<Vec<()>, usize>>()
                .map(|_| ())
        }),
    }
}

/// Error feedback: `residual += delta`, quantized into `out`, then `residual` keeps what the
/// codes did not carry (`residual − dequantize(out)`). `Err(index)` names the first position
/// where `residual + delta` is not finite, checked before anything is written, so a refused
/// delta leaves `residual` as it was.
pub(crate) fn quantize_with_feedback(
    w: &CpuWorkers,
    format: QuantFormat,
    delta: &[f32],
    residual: &mut [f32],
    out: &mut [u8],
) -> Result<(), usize> {
    // All or nothing: look before writing.
    let first_bad = first_bad_sum(w, delta, residual);
    if let Some(i) = first_bad {
        return Err(i);
    }
    let b = format.block();
    split(w, format, residual, out, |base, rc, oc| -> Result<(), usize> {
        let dc = &delta[base..base + rc.len()];
        let mut at = 0;
        let mut decoded = vec![0.0f32; b];
        for (block, d) in rc.chunks_mut(b).zip(dc.chunks(b)) {
            for (r, d) in block.iter_mut().zip(d) {
                *r += d;
            }
            let len = SCALE_BYTES + format.code_bytes(block.len());
            let y = &mut decoded[..block.len()];
            encode_block(format, block, &mut oc[at..at + len], Some(y));
            for (r, y) in block.iter_mut().zip(y.iter()) {
                *r -= y;
            }
            at += len;
        }
        Ok(())
    })
}

/// The first position where `residual + delta` is not finite.
fn first_bad_sum(w: &CpuWorkers, delta: &[f32], residual: &[f32]) -> Option<usize> {
    let ok = |r: std::ops::Range<usize>| {
        residual[r.clone()].iter().zip(&delta[r]).fold(true, |ok, (a, b)| ok & (a + b).is_finite())
    };
    if w.sum(delta.len(), |r| if ok(r) { 0.0 } else { 1.0 }) == 0.0 {
        return None;
    }
    residual.iter().zip(delta).position(|(a, b)| !(a + b).is_finite())
}

//! The quantized wire formats against an f64 reference: every block edge, constant and zero
//! blocks, refused non-finite values, and error feedback over a long random walk.

mod common;

use common::TestResult;
use flodl_tensor::quant::{QuantFormat, SCALE_BYTES};
use flodl_tensor::{DType, Error, ErrorFeedback, Stream, Tensor, ops};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// The CPU streams every case runs on: one thread, and every core (the split path, for inputs
/// above the stream's parallel threshold).
fn streams() -> [Stream; 2] {
    [Stream::cpu_with_threads(1), Stream::cpu()]
}

/// The lengths of a format that exercise every block edge: empty, one value, a block less one,
/// a block, a block and one, odd lengths (q4's half-used last byte), and a length large enough to
/// be split across threads that ends inside a block.
fn lengths(f: QuantFormat) -> Vec<usize> {
    let b = f.block();
    vec![0, 1, 2, 3, 7, b - 1, b, b + 1, 2 * b - 1, 3 * b + 5, (1 << 20) + 3]
}

/// Values whose magnitude changes from block to block over six decades, with signs mixed.
fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut mag = 1.0f32;
    (0..n)
        .map(|i| {
            if i % 37 == 0 {
                mag = 10f32.powf(rng.random_range(-4.0..2.0));
            }
            rng.random_range(-1.0f32..1.0) * mag
        })
        .collect()
}

/// The scale stored at the head of the block that starts at byte `at`.
fn scale_at(bytes: &[u8], at: usize) -> f32 {
    let mut raw = [0u8; SCALE_BYTES];
    raw.copy_from_slice(&bytes[at..at + SCALE_BYTES]);
    f32::from_le_bytes(raw)
}

/// Encodes `x`, decodes it back and checks every value against the f64 reference: each block's
/// scale is `max|x| / levels` (to f32 rounding) and each value comes back within half a step.
fn round_trip(f: QuantFormat, x: &[f32], s: &Stream) -> TestResult {
    let n = x.len();
    let t = Tensor::from_slice(x, &[n], s)?;
    let mut bytes = vec![0u8; f.encoded_len(n)];
    ops::quantize(f, &t, &mut bytes, s)?;
    let mut y = Tensor::zeros(&[n], DType::F32, s)?;
    ops::dequantize(f, &bytes, &mut y, s)?;
    let y = y.to_vec::<f32>(s)?;
    let mut at = 0;
    for (k, (xb, yb)) in x.chunks(f.block()).zip(y.chunks(f.block())).enumerate() {
        let absmax = xb.iter().map(|v| f64::from(v.abs())).fold(0.0, f64::max);
        let want = absmax / f64::from(f.levels());
        let scale = f64::from(scale_at(&bytes, at));
        if (scale - want).abs() > 1e-6 * want {
            return Err(format!("{f} n={n} block {k}: scale {scale:e}, want {want:e}").into());
        }
        for (i, (a, b)) in xb.iter().zip(yb).enumerate() {
            let err = (f64::from(*a) - f64::from(*b)).abs();
            // Half a step, plus the f32 roundings of the scale and the product.
            if err > want * (0.5 + 1e-5) {
                return Err(format!(
                    "{f} n={n} block {k} value {i}: {a} came back as {b} (|err| {err:e}, step {want:e})"
                )
                .into());
            }
        }
        at += f.encoded_len(xb.len());
    }
    if at != bytes.len() {
        return Err(format!("{f} n={n}: blocks end at byte {at} of {}", bytes.len()).into());
    }
    Ok(())
}

#[test]
fn round_trips_stay_within_half_a_step_at_every_block_edge() -> TestResult {
    for s in &streams() {
        for f in QuantFormat::ALL {
            for (i, n) in lengths(f).into_iter().enumerate() {
                round_trip(f, &random_values(n, 100 + i as u64), s)
                    .map_err(|e| format!("{} threads: {e}", s.threads()))?;
            }
        }
    }
    Ok(())
}

#[test]
fn constant_and_zero_blocks_come_back_exactly() -> TestResult {
    let s = Stream::cpu_with_threads(1);
    for f in QuantFormat::ALL {
        let b = f.block();
        for c in [0.0f32, 1.5, -3.25e-3, 7.0, -127.0, 1e30] {
            for n in [1, b - 1, b, 2 * b + 1] {
                let x = vec![c; n];
                let t = Tensor::from_slice(&x, &[n], &s)?;
                let mut bytes = vec![0u8; f.encoded_len(n)];
                ops::quantize(f, &t, &mut bytes, &s)?;
                let mut y = Tensor::zeros(&[n], DType::F32, &s)?;
                ops::dequantize(f, &bytes, &mut y, &s)?;
                for v in y.to_vec::<f32>(&s)? {
                    // `levels · (|c| / levels)` is |c| up to one f32 rounding.
                    if (f64::from(v) - f64::from(c)).abs() > f64::from(c.abs()) * 2e-7 {
                        return Err(format!("{f} n={n}: {c} came back as {v}").into());
                    }
                }
                if c == 0.0
                    && (0..n.div_ceil(b)).any(|k| scale_at(&bytes, k * f.block_bytes()) != 0.0)
                {
                    return Err(format!("{f} n={n}: a zero block has a nonzero scale").into());
                }
            }
        }
    }
    Ok(())
}

#[test]
fn bytes_per_value_meet_the_wire_budget() -> TestResult {
    // By formula: (block + 4) / (4 · block) for int8, (block / 2 + 4) / (4 · block) for q4.
    let cases = [(QuantFormat::Int8, 68.0 / 256.0, 0.27), (QuantFormat::Q4, 68.0 / 512.0, 0.14)];
    for (f, formula, budget) in cases {
        for n in [f.block(), 1000 * f.block(), 20_000_000 / f.block() * f.block()] {
            let ratio = f.ratio_to_f32(n);
            if ratio != formula || ratio > budget {
                return Err(format!("{f} n={n}: ratio {ratio}, formula {formula}").into());
            }
        }
        // A ragged tail adds at most one scale.
        let n = 20_000_000 + 1;
        if f.ratio_to_f32(n) > budget {
            return Err(format!("{f} n={n}: ratio {} over {budget}", f.ratio_to_f32(n)).into());
        }
    }
    Ok(())
}

#[test]
fn non_finite_values_are_refused_with_their_index() -> TestResult {
    for s in &streams() {
        for f in QuantFormat::ALL {
            for n in [1, f.block() + 1, (1 << 20) + 3] {
                for at in [0, n / 2, n - 1] {
                    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                        let mut x = random_values(n, 7);
                        x[at] = bad;
                        if at + 1 < n {
                            // A later bad value: the first one is reported.
                            x[n - 1] = f32::NAN;
                        }
                        let t = Tensor::from_slice(&x, &[n], s)?;
                        let mut bytes = vec![0u8; f.encoded_len(n)];
                        match ops::quantize(f, &t, &mut bytes, s) {
                            Err(Error::NonFinite { index, .. }) if index == at => {}
                            other => {
                                return Err(
                                    format!("{f} n={n}: {bad} at {at} gave {other:?}").into()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn forged_bytes_are_refused() -> TestResult {
    let s = Stream::cpu_with_threads(1);
    for f in QuantFormat::ALL {
        let n = 3 * f.block() + 1;
        let t = Tensor::from_slice(&random_values(n, 3), &[n], &s)?;
        let mut bytes = vec![0u8; f.encoded_len(n)];
        ops::quantize(f, &t, &mut bytes, &s)?;
        let mut y = Tensor::zeros(&[n], DType::F32, &s)?;
        // A non-finite scale in block 2.
        let at = 2 * f.block_bytes();
        let mut forged = bytes.clone();
        forged[at..at + SCALE_BYTES].copy_from_slice(&f32::NAN.to_le_bytes());
        match ops::dequantize(f, &forged, &mut y, &s) {
            Err(Error::NonFinite { index, .. }) if index == 2 * f.block() => {}
            other => return Err(format!("{f}: a NaN scale gave {other:?}").into()),
        }
        // Too few or too many bytes.
        for len in [bytes.len() - 1, bytes.len() + 1] {
            let mut other = bytes.clone();
            other.resize(len, 0);
            match ops::dequantize(f, &other, &mut y, &s) {
                Err(Error::LengthMismatch { .. }) => {}
                r => return Err(format!("{f}: {len} bytes gave {r:?}").into()),
            }
        }
        let mut short = vec![0u8; bytes.len() - 1];
        match ops::quantize(f, &t, &mut short, &s) {
            Err(Error::LengthMismatch { .. }) => {}
            r => return Err(format!("{f}: a short output gave {r:?}").into()),
        }
        let ints = Tensor::zeros(&[n], DType::I32, &s)?;
        match ops::quantize(f, &ints, &mut bytes, &s) {
            Err(Error::DTypeMismatch { .. }) => {}
            r => return Err(format!("{f}: an i32 tensor gave {r:?}").into()),
        }
    }
    Ok(())
}

/// Runs `steps` random deltas through `send` and returns the largest drift between the true
/// running sum and the received one, in units of the last message's step (its block's scale).
fn walk(
    f: QuantFormat,
    n: usize,
    steps: usize,
    s: &Stream,
    mut send: impl FnMut(&Tensor, &mut [u8]) -> Result<(), Error>,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(n as u64 + steps as u64);
    let mut truth = vec![0.0f64; n];
    let mut received = vec![0.0f64; n];
    let mut bytes = vec![0u8; f.encoded_len(n)];
    let mut decoded = Tensor::zeros(&[n], DType::F32, s)?;
    let mut worst = 0.0f64;
    for _ in 0..steps {
        let sigma = 10f32.powf(rng.random_range(-3.0..0.0));
        let delta: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0) * sigma).collect();
        let d = Tensor::from_slice(&delta, &[n], s)?;
        send(&d, &mut bytes)?;
        ops::dequantize(f, &bytes, &mut decoded, s)?;
        for (k, ((t, r), (dv, y))) in truth
            .iter_mut()
            .zip(&mut received)
            .zip(delta.iter().zip(decoded.to_vec::<f32>(s)?))
            .enumerate()
        {
            *t += f64::from(*dv);
            *r += f64::from(y);
            let block = k / f.block();
            let step = f64::from(scale_at(&bytes, block * f.block_bytes()));
            worst = worst.max((*t - *r).abs() / step.max(1e-30));
        }
    }
    Ok(worst)
}

#[test]
fn error_feedback_keeps_the_received_sum_within_one_step_of_the_truth() -> TestResult {
    let s = Stream::cpu_with_threads(1);
    for f in QuantFormat::ALL {
        let n = 3 * f.block() + 7;
        let mut state = ErrorFeedback::new(f, n, &s)?;
        let with = walk(f, n, 400, &s, |d, out| state.encode(d, out, &s))?;
        if with > 1.0 {
            return Err(format!("{f}: with feedback the sums drift {with:.3} steps apart").into());
        }
        // Without it the rounding errors add up as a random walk: the check above can fail.
        let without = walk(f, n, 400, &s, |d, out| ops::quantize(f, d, out, &s))?;
        if without < 2.0 {
            return Err(
                format!("{f}: without feedback the drift is only {without:.3} steps").into()
            );
        }
        eprintln!("{f}: drift {with:.3} steps with feedback, {without:.1} without");
    }
    Ok(())
}

#[test]
fn a_refused_delta_leaves_the_feedback_state_unchanged() -> TestResult {
    for s in &streams() {
        for f in QuantFormat::ALL {
            let n = (1 << 20) + 3;
            let mut state = ErrorFeedback::new(f, n, s)?;
            let mut out = vec![0u8; state.encoded_len()];
            state.encode(&Tensor::from_slice(&random_values(n, 1), &[n], s)?, &mut out, s)?;
            let before = state.residual().to_vec::<f32>(s)?;
            let mut bad = random_values(n, 2);
            bad[n - 2] = f32::INFINITY;
            match state.encode(&Tensor::from_slice(&bad, &[n], s)?, &mut out, s) {
                Err(Error::NonFinite { index, .. }) if index == n - 2 => {}
                other => return Err(format!("{f}: an Inf delta gave {other:?}").into()),
            }
            let after = state.residual().to_vec::<f32>(s)?;
            if before.iter().zip(&after).any(|(a, b)| a.to_bits() != b.to_bits()) {
                return Err(format!("{f}: the refused delta changed the residual").into());
            }
        }
    }
    Ok(())
}

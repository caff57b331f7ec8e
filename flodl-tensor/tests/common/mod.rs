//! Test support: the device-parameterised runner, random inputs and f64 comparisons.

#![allow(dead_code, unreachable_pub)]

use flodl_tensor::{Device, Stream, Tensor, gpu_skip_reason, skip_or_fail};

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The awkward sizes every element-wise kernel is checked on.
pub const SIZES: [usize; 4] = [1, 7, 1023, (1 << 20) + 3];

/// Runs `case` on a 1-thread CPU stream, on a CPU stream with every core, and on `cuda:0` when
/// CUDA is usable (otherwise the CUDA case prints `skipped: <reason>`, or fails under
/// `FLODL_REQUIRE_GPU=1`). Errors name the stream they came from.
pub fn on_each_device(case: impl Fn(&Stream) -> TestResult) -> TestResult {
    let mut streams = vec![Stream::cpu_with_threads(1), Stream::cpu()];
    match gpu_skip_reason() {
        None => streams.push(Stream::new(Device::Cuda(0))?),
        Some(reason) => skip_or_fail(&format!("cuda case: {reason}")),
    }
    for s in &streams {
        case(s).map_err(|e| format!("on {} ({} threads): {e}", s.device(), s.threads()))?;
    }
    Ok(())
}

/// `n` values uniform in `[lo, hi)`, reproducible from `seed`.
pub fn rand_vec(n: usize, lo: f32, hi: f32, seed: u64) -> Result<Vec<f32>, flodl_tensor::Error> {
    let s = Stream::cpu_with_threads(1);
    Tensor::rand_uniform(&[n], lo, hi, seed, &s)?.to_vec(&s)
}

/// A tensor on `s` holding `data` with `shape`.
pub fn put(data: &[f32], shape: &[usize], s: &Stream) -> Result<Tensor, flodl_tensor::Error> {
    Tensor::from_slice(data, shape, s)
}

/// Checks `|got − want| ≤ tol · max(mag, tiny)` element-wise, where `mag` is the magnitude of the
/// reference computation (the sum of absolute terms), so cancellation does not hide errors nor
/// fake them.
pub fn check_close(what: &str, got: &[f32], want: &[f64], mag: &[f64], tol: f64) -> TestResult {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, expected {}", got.len(), want.len()).into());
    }
    for (i, ((g, w), m)) in got.iter().zip(want).zip(mag).enumerate() {
        let err = (f64::from(*g) - w).abs();
        if err.is_nan() || err > tol * m.max(1e-30) {
            return Err(
                format!("{what}[{i}]: got {g}, want {w} (|err| {err:e}, magnitude {m:e})").into()
            );
        }
    }
    Ok(())
}

/// Checks a scalar against its reference within `tol` relative to `mag`.
pub fn check_scalar(what: &str, got: f64, want: f64, mag: f64, tol: f64) -> TestResult {
    let err = (got - want).abs();
    if err <= tol * mag.max(1e-30) {
        Ok(())
    } else {
        Err(format!("{what}: got {got}, want {want} (|err| {err:e}, magnitude {mag:e})").into())
    }
}

pub fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|x| f64::from(*x)).collect()
}

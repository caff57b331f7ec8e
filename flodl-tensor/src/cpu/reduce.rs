//! Reductions (dot products and squared norms) accumulated in f64 lanes.

use super::CpuWorkers;
use super::multiversion::multiversion;

const LANES: usize = 16;

/// Σ f(a_i, b_i) over a range, with 16 independent f64 accumulators so the loop vectorises.
#[inline(always)]
fn lane_sum(a: &[f32], b: &[f32], f: impl Fn(f64, f64) -> f64) -> f64 {
    let mut acc = [0.0f64; LANES];
    let (ac, ar) = (a.chunks_exact(LANES), a.chunks_exact(LANES).remainder());
    let br = b.chunks_exact(LANES).remainder();
    for (x, y) in ac.zip(b.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += f(f64::from(x[l]), f64::from(y[l]));
        }
    }
    let mut tail = 0.0;
    for (x, y) in ar.iter().zip(br) {
        tail += f(f64::from(*x), f64::from(*y));
    }
    acc.iter().sum::<f64>() + tail
}

multiversion! {
    fn dot_range(a: &[f32], b: &[f32]) -> f64 {
        lane_sum(a, b, |x, y| x * y)
    }
}

multiversion! {
    fn sum_sq_range(a: &[f32]) -> f64 {
        lane_sum(a, a, |x, _| x * x)
    }
}

multiversion! {
    fn sum_sq_diff_range(a: &[f32], b: &[f32]) -> f64 {
        lane_sum(a, b, |x, y| {
            let d = x - y;
            d * d
        })
    }
}

pub(crate) fn dot(w: &CpuWorkers, a: &[f32], b: &[f32]) -> f64 {
    w.sum(a.len(), |r| dot_range(&a[r.clone()], &b[r]))
}

pub(crate) fn sum_sq(w: &CpuWorkers, a: &[f32]) -> f64 {
    w.sum(a.len(), |r| sum_sq_range(&a[r]))
}

pub(crate) fn sum_sq_diff(w: &CpuWorkers, a: &[f32], b: &[f32]) -> f64 {
    w.sum(a.len(), |r| sum_sq_diff_range(&a[r.clone()], &b[r]))
}

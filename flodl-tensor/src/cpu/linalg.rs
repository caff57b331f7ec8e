//! Matrix products on the CPU, through the `gemm` crate.

use super::CpuWorkers;

/// Products with fewer multiply-adds than this run on the calling thread.
const PARALLEL_FLOPS: usize = 1 << 21;

/// The shape of `c[m,n] = alpha · op(a)[m,k] · op(b)[k,n] + beta · c`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GemmShape {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    /// `a` is stored as `[k, m]`.
    pub(crate) trans_a: bool,
    /// `b` is stored as `[n, k]`.
    pub(crate) trans_b: bool,
}

/// `c = alpha · op(a) · op(b) + beta · c`, all row-major; `beta == 0` ignores c's contents.
///
/// The slices must hold exactly `m·k`, `k·n` and `m·n` elements (checked by the caller).
pub(crate) fn gemm(
    w: &CpuWorkers,
    g: GemmShape,
    alpha: f32,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
) {
    let GemmShape { m, n, k, trans_a, trans_b } = g;
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if beta == 0.0 {
            c.fill(0.0);
        } else {
            c.iter_mut().for_each(|v| *v *= beta);
        }
        return;
    }
    let (a_rs, a_cs) = if trans_a { (1, m) } else { (k, 1) };
    let (b_rs, b_cs) = if trans_b { (1, k) } else { (n, 1) };
    let big = m.saturating_mul(n).saturating_mul(k) >= PARALLEL_FLOPS;
    let mut run = move |par: gemm::Parallelism| {
        // SAFETY: the caller checked a.len() == m·k, b.len() == k·n, c.len() == m·n; with the
        // strides above every index the crate forms, (i·rs + p·cs), stays inside those slices;
        // c is uniquely borrowed and does not alias a or b; the element type is f32.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                beta != 0.0,
                a.as_ptr(),
                a_cs as isize,
                a_rs as isize,
                b.as_ptr(),
                b_cs as isize,
                b_rs as isize,
                beta,
                alpha,
                false,
                false,
                false,
                par,
            );
        }
    };
    match w.pool().filter(|_| big) {
        None => run(gemm::Parallelism::None),
        Some(pool) => pool.install(|| run(gemm::Parallelism::Rayon(w.threads()))),
    }
}

//! Matrix kernels: gemm, bias add and row sums.

use super::check;
use crate::cpu::linalg::{self as k, GemmShape};
use crate::cpu::nn;
use crate::stream::StreamInner;
use crate::{DType, Error, Result, Stream, Tensor, cuda};

/// Whether a gemm operand is used as stored or transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transpose {
    /// Use the matrix as stored.
    No,
    /// Use the transpose of the stored matrix.
    Yes,
}

/// `c = alpha · op(a) · op(b) + beta · c` on 2-d row-major f32 tensors, where `op(a)` is
/// `[m, k]`, `op(b)` is `[k, n]` and `c` is `[m, n]`; with `beta == 0` the old contents of `c`
/// are ignored (even NaN).
///
/// # Errors
/// [`Error::RankMismatch`] for non-matrices, [`Error::ShapeMismatch`] when the inner or outer
/// dimensions disagree; device or dtype mismatch; CUDA errors.
// The contract mirrors BLAS gemm, which takes this many arguments.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    alpha: f32,
    a: &Tensor,
    ta: Transpose,
    b: &Tensor,
    tb: Transpose,
    beta: f32,
    c: &mut Tensor,
    s: &Stream,
) -> Result<()> {
    const OP: &str = "gemm";
    check::on(OP, s, DType::F32, &[a, b, c])?;
    let (ar, ac) = check::matrix(OP, a)?;
    let (br, bc) = check::matrix(OP, b)?;
    check::matrix(OP, c)?;
    let (m, k) = if ta == Transpose::Yes { (ac, ar) } else { (ar, ac) };
    let (kb, n) = if tb == Transpose::Yes { (bc, br) } else { (br, bc) };
    if kb != k {
        return Err(Error::ShapeMismatch {
            op: OP,
            expected: if tb == Transpose::Yes { vec![br, k] } else { vec![k, bc] },
            got: b.shape().to_vec(),
        });
    }
    check::shape(OP, c, &[m, n])?;
    let g = GemmShape { m, n, k, trans_a: ta == Transpose::Yes, trans_b: tb == Transpose::Yes };
    match s.inner() {
        StreamInner::Cpu(w) => {
            k::gemm(w, g, alpha, a.as_slice()?, b.as_slice()?, beta, c.as_mut_slice()?);
            Ok(())
        }
        StreamInner::Cuda(cs) => cuda::ops::gemm(
            cs,
            g,
            alpha,
            check::cuda(OP, a)?,
            check::cuda(OP, b)?,
            beta,
            check::cuda_mut(OP, c)?,
        ),
    }
}

/// `y[r, :] += bias` for every row of `y` (`[n, m]` and `[m]`, f32).
///
/// # Errors
/// Rank, shape, device or dtype mismatch.
pub fn bias_add(y: &mut Tensor, bias: &Tensor, s: &Stream) -> Result<()> {
    const OP: &str = "bias_add";
    check::on(OP, s, DType::F32, &[y, bias])?;
    let (_, m) = check::matrix(OP, y)?;
    check::shape(OP, bias, &[m])?;
    match s.inner() {
        StreamInner::Cpu(_) => {
            nn::bias_add(y.as_mut_slice()?, bias.as_slice()?);
            Ok(())
        }
        StreamInner::Cuda(cs) => {
            cuda::ops::bias_add(cs, check::cuda_mut(OP, y)?, check::cuda(OP, bias)?)
        }
    }
}

/// `out[j] = Σ_r x[r, j]`: column sums of `x` (`[n, m]` into `[m]`, f32; the bias gradient).
///
/// # Errors
/// Rank, shape, device or dtype mismatch.
pub fn sum_rows(x: &Tensor, out: &mut Tensor, s: &Stream) -> Result<()> {
    const OP: &str = "sum_rows";
    check::on(OP, s, DType::F32, &[x, out])?;
    let (_, m) = check::matrix(OP, x)?;
    check::shape(OP, out, &[m])?;
    match s.inner() {
        StreamInner::Cpu(_) => {
            nn::sum_rows(x.as_slice()?, out.as_mut_slice()?);
            Ok(())
        }
        StreamInner::Cuda(cs) => {
            cuda::ops::sum_rows(cs, check::cuda(OP, x)?, check::cuda_mut(OP, out)?)
        }
    }
}

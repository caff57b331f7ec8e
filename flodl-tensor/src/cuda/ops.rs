//! The CUDA kernels behind `crate::ops`: NVRTC kernels launched on the stream, cuBLAS gemm.
//!
//! Arguments were checked by `crate::ops` (devices, dtypes, shapes); every launch is checked and
//! its error returned.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::cublas::Sgemm;
use super::kernels::{BLOCK, REDUCE_BLOCKS, grid};
use super::{CudaStorage, CudaStream, cuda_err};
use crate::cpu::linalg::GemmShape;
use crate::cpu::nn::first_bad_label;
use crate::cpu::optim::{Adam, Sgd};
use crate::{DType, Error, Result};

/// Launches kernel `$name` on stream `$s` over `$n` items with the given arguments.
macro_rules! launch {
    ($s:expr, $name:literal, $cfg:expr, $($arg:expr),* $(,)?) => {{
        let kernels = $s.device().kernels()?;
        let f = kernels.get($name)?;
        let mut b = $s.raw().launch_builder(f);
        $( b.arg($arg); )*
        // SAFETY: the arguments match the kernel's C signature in `kernels.rs` in number, order
        // and type (device slices for pointers, f32/i32/usize scalars for float/int/size_t);
        // every slice holds at least the element count the kernel indexes, as the callers
        // checked shapes, and the kernels stop at that count (grid-stride loops).
        unsafe { b.launch($cfg) }.map(|_| ()).map_err(cuda_err($name))
    }};
}

fn f32s<'a>(op: &'static str, t: &'a CudaStorage) -> Result<&'a CudaSlice<f32>> {
    match t {
        CudaStorage::F32(d) => Ok(d),
        _ => Err(Error::DTypeMismatch { op, expected: DType::F32, got: t.dtype() }),
    }
}

fn f32s_mut<'a>(op: &'static str, t: &'a mut CudaStorage) -> Result<&'a mut CudaSlice<f32>> {
    match t {
        CudaStorage::F32(d) => Ok(d),
        _ => Err(Error::DTypeMismatch { op, expected: DType::F32, got: t.dtype() }),
    }
}

fn i32s<'a>(op: &'static str, t: &'a CudaStorage) -> Result<&'a CudaSlice<i32>> {
    match t {
        CudaStorage::I32(d) => Ok(d),
        _ => Err(Error::DTypeMismatch { op, expected: DType::I32, got: t.dtype() }),
    }
}

pub(crate) fn fill(s: &CudaStream, t: &mut CudaStorage, v: f32) -> Result<()> {
    let n = t.len();
    if n == 0 {
        return Ok(());
    }
    match t {
        CudaStorage::F32(d) => launch!(s, "fill_f32", grid(n), d, &v, &n),
        CudaStorage::Bf16(d) => {
            let bits = crate::cpu::elementwise::f32_to_bf16(v).to_bits();
            launch!(s, "fill_u16", grid(n), d, &bits, &n)
        }
        CudaStorage::I32(d) => {
            let i = v as i32;
            launch!(s, "fill_i32", grid(n), d, &i, &n)
        }
    }
}

pub(crate) fn scale(s: &CudaStream, t: &mut CudaStorage, a: f32) -> Result<()> {
    let x = f32s_mut("scale", t)?;
    let n = x.len();
    if n == 0 {
        return Ok(());
    }
    launch!(s, "scale_f32", grid(n), x, &a, &n)
}

pub(crate) fn axpy(s: &CudaStream, a: f32, x: &CudaStorage, y: &mut CudaStorage) -> Result<()> {
    let (x, y) = (f32s("axpy", x)?, f32s_mut("axpy", y)?);
    let n = y.len();
    if n == 0 {
        return Ok(());
    }
    launch!(s, "axpy_f32", grid(n), x, y, &a, &n)
}

pub(crate) fn lerp(s: &CudaStream, a: &mut CudaStorage, b: &CudaStorage, w: f32) -> Result<()> {
    let (a, b) = (f32s_mut("lerp", a)?, f32s("lerp", b)?);
    let n = a.len();
    if n == 0 {
        return Ok(());
    }
    launch!(s, "lerp_f32", grid(n), a, b, &w, &n)
}

pub(crate) fn weighted_sum(
    s: &CudaStream,
    inputs: &[&CudaStorage],
    weights: &[f32],
    out: &mut CudaStorage,
) -> Result<()> {
    let out = f32s_mut("weighted_sum", out)?;
    let xs = inputs.iter().map(|t| f32s("weighted_sum", t)).collect::<Result<Vec<_>>>()?;
    let n = out.len();
    if n == 0 {
        return Ok(());
    }
    // Eight inputs per launch; later launches add to what the earlier ones wrote, so inputs are
    // still summed in order.
    for (chunk, (xc, wc)) in xs.chunks(8).zip(weights.chunks(8)).enumerate() {
        let x = |j: usize| xc[j.min(xc.len() - 1)];
        let mut w = [0.0f32; 8];
        w[..wc.len()].copy_from_slice(wc);
        let count = xc.len() as i32;
        let accumulate = i32::from(chunk > 0);
        launch!(
            s,
            "weighted_sum8_f32",
            grid(n),
            &mut *out,
            x(0),
            x(1),
            x(2),
            x(3),
            x(4),
            x(5),
            x(6),
            x(7),
            &w[0],
            &w[1],
            &w[2],
            &w[3],
            &w[4],
            &w[5],
            &w[6],
            &w[7],
            &count,
            &accumulate,
            &n,
        )?;
    }
    Ok(())
}

/// Σ f(a_i, b_i) in f64: per-block partials on the device, summed in block order on the host.
fn reduce(s: &CudaStream, a: &CudaSlice<f32>, b: &CudaSlice<f32>, mode: i32) -> Result<f64> {
    let n = a.len();
    if n == 0 {
        return Ok(0.0);
    }
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, REDUCE_BLOCKS);
    let mut partials = s.raw().alloc_zeros::<f64>(blocks).map_err(cuda_err("reduce alloc"))?;
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(s, "reduce_f32", cfg, a, b, &mode, &mut partials, &n)?;
    let host = s.raw().clone_dtoh(&partials).map_err(cuda_err("reduce copy"))?;
    s.synchronize()?;
    Ok(host.iter().sum())
}

pub(crate) fn dot(s: &CudaStream, a: &CudaStorage, b: &CudaStorage) -> Result<f64> {
    reduce(s, f32s("dot", a)?, f32s("dot", b)?, 0)
}

pub(crate) fn sum_sq(s: &CudaStream, a: &CudaStorage) -> Result<f64> {
    let a = f32s("l2_norm", a)?;
    reduce(s, a, a, 1)
}

pub(crate) fn sum_sq_diff(s: &CudaStream, a: &CudaStorage, b: &CudaStorage) -> Result<f64> {
    reduce(s, f32s("l2_norm_diff", a)?, f32s("l2_norm_diff", b)?, 2)
}

pub(crate) fn cast(s: &CudaStream, src: &CudaStorage, dst: &mut CudaStorage) -> Result<()> {
    let n = dst.len();
    if n == 0 {
        return Ok(());
    }
    match (src, dst) {
        (CudaStorage::F32(x), CudaStorage::Bf16(y)) => {
            launch!(s, "cast_f32_bf16", grid(n), x, y, &n)
        }
        (CudaStorage::Bf16(x), CudaStorage::F32(y)) => {
            launch!(s, "cast_bf16_f32", grid(n), x, y, &n)
        }
        (CudaStorage::Bf16(x), CudaStorage::Bf16(y)) => launch!(s, "copy_u16", grid(n), x, y, &n),
        (CudaStorage::F32(x), CudaStorage::F32(y)) => {
            s.raw().memcpy_dtod(x, y).map_err(cuda_err("cast copy"))
        }
        (_, d) => Err(Error::UnsupportedDType { op: "cast", dtype: d.dtype() }),
    }
}

fn cublas_dim(x: usize) -> Result<i32> {
    i32::try_from(x)
        .map_err(|_| Error::InvalidArgument { op: "gemm", what: "dimension exceeds i32" })
}

pub(crate) fn gemm(
    s: &CudaStream,
    g: GemmShape,
    alpha: f32,
    a: &CudaStorage,
    b: &CudaStorage,
    beta: f32,
    c: &mut CudaStorage,
) -> Result<()> {
    let (a, b, c) = (f32s("gemm", a)?, f32s("gemm", b)?, f32s_mut("gemm", c)?);
    let GemmShape { m, n, k, trans_a, trans_b } = g;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let blas = s.blas()?;
    let raw = s.raw();
    s.device().ctx.bind_to_thread().map_err(cuda_err("cublas gemm"))?;
    // The addresses are lent for `raw`: it first waits for the buffers' earlier work on other
    // streams, and dropping the guards records the gemm as their latest read and write.
    let (a_ptr, _read_a) = a.device_ptr(raw);
    let (b_ptr, _read_b) = b.device_ptr(raw);
    let (c_ptr, _write_c) = c.device_ptr_mut(raw);
    // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: pass B first.
    let g = Sgemm {
        trans_a: trans_b,
        trans_b: trans_a,
        m: cublas_dim(n)?,
        n: cublas_dim(m)?,
        k: cublas_dim(k)?,
        alpha,
        a: b_ptr,
        lda: cublas_dim(if trans_b { k } else { n }.max(1))?,
        b: a_ptr,
        ldb: cublas_dim(if trans_a { m } else { k }.max(1))?,
        beta,
        c: c_ptr,
        ldc: cublas_dim(n)?,
    };
    // SAFETY: the shapes were checked by `crate::ops::gemm` (a holds m·k, b holds k·n, c holds
    // m·n elements) and the leading dimensions above describe exactly those row-major buffers,
    // so cuBLAS reads and writes only inside them; c does not alias a or b (&mut borrow); the
    // handle is bound to `raw`, a stream of the buffers' device, whose context is current, and
    // the lent addresses keep the buffers ordered until the gemm has run.
    unsafe { blas.sgemm(g) }
}

pub(crate) fn bias_add(s: &CudaStream, y: &mut CudaStorage, bias: &CudaStorage) -> Result<()> {
    let (y, bias) = (f32s_mut("bias_add", y)?, f32s("bias_add", bias)?);
    let (n, m) = (y.len(), bias.len());
    if n == 0 || m == 0 {
        return Ok(());
    }
    launch!(s, "bias_add_f32", grid(n), y, bias, &m, &n)
}

pub(crate) fn sum_rows(s: &CudaStream, x: &CudaStorage, out: &mut CudaStorage) -> Result<()> {
    let (x, out) = (f32s("sum_rows", x)?, f32s_mut("sum_rows", out)?);
    let m = out.len();
    if m == 0 {
        return Ok(());
    }
    let rows = x.len() / m;
    launch!(s, "sum_rows_f32", grid(m), x, out, &rows, &m)
}

pub(crate) fn relu(s: &CudaStream, x: &CudaStorage, y: &mut CudaStorage) -> Result<()> {
    let (x, y) = (f32s("relu", x)?, f32s_mut("relu", y)?);
    let n = y.len();
    if n == 0 {
        return Ok(());
    }
    launch!(s, "relu_f32", grid(n), x, y, &n)
}

pub(crate) fn relu_backward(
    s: &CudaStream,
    dy: &CudaStorage,
    y: &CudaStorage,
    dx: &mut CudaStorage,
) -> Result<()> {
    const OP: &str = "relu_backward";
    let (dy, y, dx) = (f32s(OP, dy)?, f32s(OP, y)?, f32s_mut(OP, dx)?);
    let n = dx.len();
    if n == 0 {
        return Ok(());
    }
    launch!(s, "relu_backward_f32", grid(n), dy, y, dx, &n)
}

/// Copies the labels to the host and checks them against the class count.
fn check_labels(
    op: &'static str,
    s: &CudaStream,
    labels: &CudaStorage,
    classes: usize,
) -> Result<()> {
    let mut host = vec![0i32; labels.len()];
    labels.copy_to_host(&mut host, s)?;
    match first_bad_label(&host, classes) {
        Some((row, label)) => Err(Error::LabelOutOfRange { op, row, label, classes }),
        None => Ok(()),
    }
}

pub(crate) fn log_softmax_nll(
    s: &CudaStream,
    logits: &CudaStorage,
    labels: &CudaStorage,
    dlogits: &mut CudaStorage,
    classes: usize,
) -> Result<f32> {
    const OP: &str = "log_softmax_nll";
    check_labels(OP, s, labels, classes)?;
    let (x, l, d) = (f32s(OP, logits)?, i32s(OP, labels)?, f32s_mut(OP, dlogits)?);
    let rows = l.len();
    let mut row_loss = s.raw().alloc_zeros::<f32>(rows).map_err(cuda_err("nll alloc"))?;
    launch!(s, "softmax_nll_f32", grid(rows), x, l, d, &mut row_loss, &rows, &classes)?;
    let host = s.raw().clone_dtoh(&row_loss).map_err(cuda_err("nll copy"))?;
    s.synchronize()?;
    let total: f64 = host.iter().map(|v| f64::from(*v)).sum();
    Ok((total / rows as f64) as f32)
}

pub(crate) fn argmax_correct(
    s: &CudaStream,
    logits: &CudaStorage,
    labels: &CudaStorage,
    classes: usize,
) -> Result<usize> {
    const OP: &str = "argmax_correct";
    check_labels(OP, s, labels, classes)?;
    let (x, l) = (f32s(OP, logits)?, i32s(OP, labels)?);
    let rows = l.len();
    let mut hit = s.raw().alloc_zeros::<i32>(rows).map_err(cuda_err("argmax alloc"))?;
    launch!(s, "argmax_hit_f32", grid(rows), x, l, &mut hit, &rows, &classes)?;
    let host = s.raw().clone_dtoh(&hit).map_err(cuda_err("argmax copy"))?;
    s.synchronize()?;
    Ok(host.iter().filter(|h| **h != 0).count())
}

pub(crate) fn sgd_step(
    s: &CudaStream,
    h: Sgd,
    p: &mut CudaStorage,
    g: &CudaStorage,
    buf: &mut CudaStorage,
) -> Result<()> {
    const OP: &str = "sgd_step";
    let (p, g, buf) = (f32s_mut(OP, p)?, f32s(OP, g)?, f32s_mut(OP, buf)?);
    let n = p.len();
    if n == 0 {
        return Ok(());
    }
    launch!(s, "sgd_f32", grid(n), p, g, buf, &h.lr, &h.momentum, &h.weight_decay, &n)
}

pub(crate) fn adam_step(
    s: &CudaStream,
    h: Adam,
    p: &mut CudaStorage,
    g: &CudaStorage,
    m: &mut CudaStorage,
    v: &mut CudaStorage,
) -> Result<()> {
    const OP: &str = "adam_step";
    let (p, g) = (f32s_mut(OP, p)?, f32s(OP, g)?);
    let (m, v) = (f32s_mut(OP, m)?, f32s_mut(OP, v)?);
    let n = p.len();
    if n == 0 {
        return Ok(());
    }
    launch!(
        s,
        "adam_f32",
        grid(n),
        p,
        g,
        m,
        v,
        &h.beta1,
        &h.beta2,
        &h.eps,
        &h.weight_decay,
        &h.step_size,
        &h.inv_sqrt_bc2,
        &n,
    )
}

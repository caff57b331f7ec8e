//! The CUDA C source of flodl's kernels and their compiled, per-device module.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig};
use cudarc::nvrtc::Ptx;

use super::cuda_err;
use super::nvrtc::{Nvrtc, Target};
use crate::{Error, Result};

/// Threads per block of every element-wise kernel.
pub(crate) const BLOCK: u32 = 256;

/// Most blocks a grid-stride kernel is launched with.
const MAX_BLOCKS: usize = 4096;

/// Blocks of the reduction kernels (each writes one f64 partial).
pub(crate) const REDUCE_BLOCKS: usize = 512;

/// A grid-stride launch covering `n` items.
pub(crate) fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

const SOURCE: &str = r#"
#define GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

extern "C" __global__ void fill_f32(float* x, float v, size_t n) { GRID_STRIDE(i, n) x[i] = v; }
extern "C" __global__ void fill_u16(unsigned short* x, unsigned short v, size_t n) { GRID_STRIDE(i, n) x[i] = v; }
extern "C" __global__ void fill_i32(int* x, int v, size_t n) { GRID_STRIDE(i, n) x[i] = v; }

extern "C" __global__ void scale_f32(float* x, float a, size_t n) { GRID_STRIDE(i, n) x[i] *= a; }

extern "C" __global__ void axpy_f32(const float* x, float* y, float a, size_t n) {
    GRID_STRIDE(i, n) y[i] += a * x[i];
}

extern "C" __global__ void lerp_f32(float* a, const float* b, float w, size_t n) {
    GRID_STRIDE(i, n) a[i] += w * (b[i] - a[i]);
}

// out = (accumulate ? out : 0) + sum_{j < count} w_j x_j, in input order.
extern "C" __global__ void weighted_sum8_f32(
    float* out,
    const float* x0, const float* x1, const float* x2, const float* x3,
    const float* x4, const float* x5, const float* x6, const float* x7,
    float w0, float w1, float w2, float w3, float w4, float w5, float w6, float w7,
    int count, int accumulate, size_t n) {
    const float* xs[8] = {x0, x1, x2, x3, x4, x5, x6, x7};
    const float ws[8] = {w0, w1, w2, w3, w4, w5, w6, w7};
    GRID_STRIDE(i, n) {
        float acc = accumulate ? out[i] : ws[0] * xs[0][i];
        for (int j = accumulate ? 0 : 1; j < count; ++j) acc += ws[j] * xs[j][i];
        out[i] = acc;
    }
}

// One f64 partial per block of sum(f(a_i, b_i)); mode 0: a*b, 1: a*a, 2: (a-b)^2.
extern "C" __global__ void reduce_f32(const float* a, const float* b, int mode, double* partials, size_t n) {
    __shared__ double sh[256];
    double acc = 0.0;
    GRID_STRIDE(i, n) {
        double x = a[i];
        double y = b[i];
        double d = x - y;
        acc += mode == 0 ? x * y : (mode == 1 ? x * x : d * d);
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sh[0];
}

extern "C" __global__ void cast_f32_bf16(const float* src, unsigned short* dst, size_t n) {
    GRID_STRIDE(i, n) {
        float x = src[i];
        unsigned int b = __float_as_uint(x);
        dst[i] = (x != x) ? (unsigned short)((b >> 16) | 0x40u)
                          : (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    }
}

extern "C" __global__ void cast_bf16_f32(const unsigned short* src, float* dst, size_t n) {
    GRID_STRIDE(i, n) dst[i] = __uint_as_float(((unsigned int)src[i]) << 16);
}

extern "C" __global__ void copy_u16(const unsigned short* src, unsigned short* dst, size_t n) {
    GRID_STRIDE(i, n) dst[i] = src[i];
}

extern "C" __global__ void relu_f32(const float* x, float* y, size_t n) {
    GRID_STRIDE(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

extern "C" __global__ void relu_backward_f32(const float* dy, const float* y, float* dx, size_t n) {
    GRID_STRIDE(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

extern "C" __global__ void bias_add_f32(float* y, const float* bias, size_t m, size_t n) {
    GRID_STRIDE(i, n) y[i] += bias[i % m];
}

// out[j] = sum over rows of x[r, j], in row order.
extern "C" __global__ void sum_rows_f32(const float* x, float* out, size_t rows, size_t m) {
    GRID_STRIDE(j, m) {
        float acc = 0.0f;
        for (size_t r = 0; r < rows; ++r) acc += x[r * m + j];
        out[j] = acc;
    }
}

// One thread per row; labels were checked on the host.
extern "C" __global__ void softmax_nll_f32(const float* logits, const int* labels, float* dlogits,
                                           float* row_loss, size_t rows, size_t c) {
    GRID_STRIDE(r, rows) {
        const float* x = logits + r * c;
        float* d = dlogits + r * c;
        float mx = __int_as_float(0xff800000);
        for (size_t j = 0; j < c; ++j) mx = fmaxf(mx, x[j]);
        float s = 0.0f;
        for (size_t j = 0; j < c; ++j) { float e = expf(x[j] - mx); d[j] = e; s += e; }
        int l = labels[r];
        row_loss[r] = mx + logf(s) - x[l];
        float inv_n = 1.0f / (float)rows;
        float sc = inv_n / s;
        for (size_t j = 0; j < c; ++j) d[j] *= sc;
        d[l] -= inv_n;
    }
}

extern "C" __global__ void argmax_hit_f32(const float* logits, const int* labels, int* hit,
                                          size_t rows, size_t c) {
    GRID_STRIDE(r, rows) {
        const float* x = logits + r * c;
        size_t best = 0;
        for (size_t j = 1; j < c; ++j) if (x[j] > x[best]) best = j;
        hit[r] = (int)best == labels[r];
    }
}

extern "C" __global__ void sgd_f32(float* p, const float* g, float* buf, float lr, float mu,
                                   float wd, size_t n) {
    GRID_STRIDE(i, n) {
        float gi = g[i] + wd * p[i];
        float b = mu * buf[i] + gi;
        buf[i] = b;
        p[i] -= lr * b;
    }
}

extern "C" __global__ void adam_f32(float* p, const float* g, float* m, float* v, float b1,
                                    float b2, float eps, float wd, float step_size,
                                    float inv_sqrt_bc2, size_t n) {
    GRID_STRIDE(i, n) {
        float gi = g[i] + wd * p[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    }
}
"#;

const NAMES: &[&str] = &[
    "fill_f32",
    "fill_u16",
    "fill_i32",
    "scale_f32",
    "axpy_f32",
    "lerp_f32",
    "weighted_sum8_f32",
    "reduce_f32",
    "cast_f32_bf16",
    "cast_bf16_f32",
    "copy_u16",
    "relu_f32",
    "relu_backward_f32",
    "bias_add_f32",
    "sum_rows_f32",
    "softmax_nll_f32",
    "argmax_hit_f32",
    "sgd_f32",
    "adam_f32",
];

/// How the kernels reached the device: what NVRTC produced and the driver loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelImage {
    /// Machine code for the device's own `sm_XY`, loaded as is.
    Cubin(u32),
    /// PTX for `compute_XY`, JIT-compiled by the driver.
    Ptx(u32),
}

/// flodl's kernels compiled for one device.
pub(crate) struct Kernels {
    fns: HashMap<&'static str, CudaFunction>,
    image: KernelImage,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("count", &self.fns.len())
            .field("image", &self.image)
            .finish()
    }
}

/// The PTX architecture to fall back to for a device of `arch`: its own when NVRTC knows it,
/// else the newest NVRTC knows below it (the driver JIT-compiles PTX for any newer device);
/// `None` when NVRTC knows nothing at or below it. An empty `supported` list (an NVRTC that
/// cannot say) means "try the device's own".
pub(crate) fn ptx_arch(arch: u32, supported: &[u32]) -> Option<u32> {
    if supported.is_empty() || supported.contains(&arch) {
        return Some(arch);
    }
    supported.iter().copied().filter(|&a| a <= arch).max()
}

impl Kernels {
    /// Compiles the source for `ctx`'s device and loads every kernel: a CUBIN for the device's
    /// own `sm_XY` first (no JIT, so no dependence on the driver knowing NVRTC's PTX version),
    /// then, if NVRTC cannot target that architecture or the driver refuses the CUBIN, PTX.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] without NVRTC; [`Error::KernelCompile`] when neither form
    /// compiles and loads (both reasons given).
    pub(crate) fn compile(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        let (major, minor) = ctx.compute_capability().map_err(cuda_err("device query"))?;
        let arch = u32::try_from(major * 10 + minor).unwrap_or(0);
        let nvrtc = Nvrtc::get()?;
        let cubin = Kernels::load(ctx, nvrtc, Target::Cubin(arch));
        let cubin_error = match cubin {
            Ok(k) => return Ok(k),
            Err(e) => e,
        };
        let Some(ptx) = ptx_arch(arch, &nvrtc.supported_archs()) else {
            return Err(Error::KernelCompile {
                reason: format!(
                    "NVRTC {}.{} supports no architecture at or below sm_{arch} ({cubin_error})",
                    nvrtc.version.0, nvrtc.version.1
                ),
            });
        };
        tracing::warn!(arch, %cubin_error, "CUBIN unusable, falling back to PTX for compute_{ptx}");
        Kernels::load(ctx, nvrtc, Target::Ptx(ptx)).map_err(|ptx_error| Error::KernelCompile {
            reason: format!(
                "CUBIN for sm_{arch}: {cubin_error}; PTX for compute_{ptx}: {ptx_error}"
            ),
        })
    }

    /// Compiles for `target` and loads every kernel into `ctx`.
    pub(crate) fn load(ctx: &Arc<CudaContext>, nvrtc: &Nvrtc, target: Target) -> Result<Kernels> {
        let image = nvrtc.compile(SOURCE, "flodl_kernels.cu", target)?;
        let module = ctx.load_module(Ptx::from_binary(image)).map_err(cuda_err("module load"))?;
        let mut fns = HashMap::new();
        for &name in NAMES {
            let f = module.load_function(name).map_err(cuda_err("kernel load"))?;
            fns.insert(name, f);
        }
        let image = match target {
            Target::Cubin(arch) => KernelImage::Cubin(arch),
            Target::Ptx(arch) => KernelImage::Ptx(arch),
        };
        tracing::debug!(
            ordinal = ctx.ordinal(),
            kernels = fns.len(),
            ?image,
            "loaded flodl kernels"
        );
        Ok(Kernels { fns, image })
    }

    /// What was loaded.
    pub(crate) fn image(&self) -> KernelImage {
        self.image
    }

    /// The kernel called `name`.
    pub(crate) fn get(&self, name: &'static str) -> Result<&CudaFunction> {
        self.fns
            .get(name)
            .ok_or(Error::InvalidArgument { op: "cuda kernel", what: "unknown kernel" })
    }
}

#[cfg(test)]
mod tests {
    use super::{NAMES, Nvrtc, SOURCE, Target, ptx_arch};

    #[test]
    fn ptx_falls_back_to_the_newest_known_architecture_at_or_below_the_device() {
        let known = [75, 80, 86, 89, 90, 100, 120];
        let cases = [
            (90, &known[..], Some(90)),
            (87, &known[..], Some(86)),
            (130, &known[..], Some(120)),
            (70, &known[..], None),
            (90, &[][..], Some(90)),
        ];
        for (arch, supported, want) in cases {
            assert_eq!(ptx_arch(arch, supported), want, "sm_{arch} with {supported:?}");
        }
    }

    /// NVRTC needs no GPU: wherever the library is found, the kernel source must compile to a
    /// CUBIN for every architecture it supports from sm_75 on (one per major at least) and to
    /// PTX defining every kernel the backend loads.
    #[test]
    fn source_compiles_to_cubin_and_ptx() {
        let nvrtc = match Nvrtc::get() {
            Ok(n) => n,
            Err(e) => {
                crate::skip_or_fail(&format!("NVRTC is not available: {e}"));
                return;
            }
        };
        let archs = nvrtc.supported_archs();
        eprintln!("NVRTC {:?} from {}, architectures {archs:?}", nvrtc.version, nvrtc.path);
        let archs: Vec<u32> = if archs.is_empty() { vec![80] } else { archs };
        // The oldest architecture of each major (NVRTC's list is ascending).
        let mut per_major: Vec<u32> = archs.iter().copied().filter(|&a| a >= 75).collect();
        per_major.dedup_by_key(|a| *a / 10);
        for &arch in &per_major {
            let cubin = nvrtc
                .compile(SOURCE, "k.cu", Target::Cubin(arch))
                .unwrap_or_else(|e| panic!("sm_{arch}: {e}"));
            assert_eq!(&cubin[..4], b"\x7fELF", "sm_{arch}: a CUBIN is an ELF image");
        }
        let arch = archs.iter().copied().filter(|&a| a >= 75).min().unwrap_or(80);
        let ptx = nvrtc
            .compile(SOURCE, "k.cu", Target::Ptx(arch))
            .unwrap_or_else(|e| panic!("compute_{arch}: {e}"));
        let ptx = String::from_utf8_lossy(&ptx);
        assert!(ptx.contains(&format!(".target sm_{arch}")), "PTX for compute_{arch}");
        for name in NAMES {
            assert!(ptx.contains(&format!(".entry {name}(")), "kernel {name} missing from the PTX");
        }
    }
}

#[cfg(test)]
mod gpu_tests {
    use cudarc::driver::PushKernelArg;

    use super::{KernelImage, Kernels, Nvrtc, Target, grid, ptx_arch};
    use crate::cuda::context;

    /// On a GPU: the kernels load as a CUBIN for the device's own architecture, and the PTX
    /// fallback also loads and runs (the path taken when NVRTC cannot target the device).
    #[test]
    fn kernels_load_as_cubin_and_the_ptx_fallback_runs() {
        if let Some(reason) = crate::gpu_skip_reason() {
            crate::skip_or_fail(&reason);
            return;
        }
        let dev = context::device(0).unwrap_or_else(|e| panic!("cuda:0: {e}"));
        let (major, minor) = dev.ctx.compute_capability().unwrap_or_else(|e| panic!("{e}"));
        let arch = u32::try_from(major * 10 + minor).unwrap_or(0);
        let kernels = dev.kernels().unwrap_or_else(|e| panic!("kernels: {e}"));
        assert_eq!(kernels.image(), KernelImage::Cubin(arch), "sm_{arch} loads as a CUBIN");
        let nvrtc = Nvrtc::get().unwrap_or_else(|e| panic!("{e}"));
        let Some(fallback) = ptx_arch(arch, &nvrtc.supported_archs()) else {
            panic!("NVRTC {:?} knows no architecture at or below sm_{arch}", nvrtc.version);
        };
        let ptx = Kernels::load(&dev.ctx, nvrtc, Target::Ptx(fallback))
            .unwrap_or_else(|e| panic!("PTX for compute_{fallback}: {e}"));
        assert_eq!(ptx.image(), KernelImage::Ptx(fallback));
        let stream = dev.ctx.new_stream().unwrap_or_else(|e| panic!("{e}"));
        let n = 1000usize;
        let mut x = stream.alloc_zeros::<f32>(n).unwrap_or_else(|e| panic!("{e}"));
        let f = ptx.get("fill_f32").unwrap_or_else(|e| panic!("{e}"));
        let mut b = stream.launch_builder(f);
        let v = 2.5f32;
        b.arg(&mut x).arg(&v).arg(&n);
        // SAFETY: `fill_f32(float*, float, size_t)` with a slice of `n` floats and `n`.
        unsafe { b.launch(grid(n)) }.unwrap_or_else(|e| panic!("launch: {e}"));
        let host = stream.clone_dtoh(&x).unwrap_or_else(|e| panic!("{e}"));
        assert!(host.iter().all(|&y| y == v), "the PTX-loaded fill wrote {:?}", &host[..4]);
    }
}

//! cuBLAS, loaded by flodl itself (see [`crate::library_search`] for why): a handle per stream
//! and single-precision gemm.

use std::ffi::{c_int, c_void};
use std::sync::{Mutex, OnceLock};

use super::runtime_library::{self, Opened};
use crate::library_search::RuntimeLibrary;
use crate::{Error, Result};

type Handle = *mut c_void;
type CreateFn = unsafe extern "C" fn(*mut Handle) -> c_int;
type DestroyFn = unsafe extern "C" fn(Handle) -> c_int;
type SetStreamFn = unsafe extern "C" fn(Handle, *mut c_void) -> c_int;
type GetPropertyFn = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;
#[allow(clippy::type_complexity)]
type SgemmFn = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const f32,
    *const f32,
    c_int,
    *const f32,
    c_int,
    *const f32,
    *mut f32,
    c_int,
) -> c_int;

/// `CUBLAS_OP_N` and `CUBLAS_OP_T`.
const OP_N: c_int = 0;
const OP_T: c_int = 1;

/// The loaded cuBLAS and the entry points flodl uses.
#[derive(Debug)]
pub(crate) struct Cublas {
    pub(crate) path: String,
    pub(crate) version: (u32, u32, u32),
    create: CreateFn,
    destroy: DestroyFn,
    set_stream: SetStreamFn,
    sgemm: SgemmFn,
    _library: Opened,
}

impl Cublas {
    /// The process-wide cuBLAS, opened on first use.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] naming where it was looked for.
    pub(crate) fn get() -> Result<&'static Cublas> {
        static CUBLAS: OnceLock<std::result::Result<Cublas, String>> = OnceLock::new();
        CUBLAS
            .get_or_init(Cublas::open)
            .as_ref()
            .map_err(|reason| Error::CudaUnavailable { reason: reason.clone() })
    }

    fn open() -> std::result::Result<Cublas, String> {
        let opened = runtime_library::open(RuntimeLibrary::Cublas)?;
        let lib = &opened.library;
        let path = opened.path.clone();
        macro_rules! need {
            ($name:literal) => {
                // SAFETY: the type is the C signature `cublas_api.h` declares for the symbol
                // (the same in CUDA 12 and 13); the pointer is only called while the library
                // stays loaded (it is kept in the same `Cublas`).
                unsafe { lib.get($name.as_bytes()).ok().map(|s| *s) }
                    .ok_or_else(|| format!("{path} lacks `{}`", $name))?
            };
        }
        let property: GetPropertyFn = need!("cublasGetProperty");
        let part = |which: c_int| {
            let mut v: c_int = 0;
            // SAFETY: `cublasGetProperty` writes one int for MAJOR (0), MINOR (1), PATCH (2);
            // it needs no GPU and no handle.
            let code = unsafe { property(which, &mut v) };
            if code == 0 { u32::try_from(v).unwrap_or(0) } else { 0 }
        };
        let cublas = Cublas {
            version: (part(0), part(1), part(2)),
            create: need!("cublasCreate_v2"),
            destroy: need!("cublasDestroy_v2"),
            set_stream: need!("cublasSetStream_v2"),
            sgemm: need!("cublasSgemm_v2"),
            path,
            _library: opened,
        };
        tracing::info!(library = %cublas.path, version = ?cublas.version, "cuBLAS loaded");
        Ok(cublas)
    }
}

/// The arguments of one column-major `C = alpha·op(A)·op(B) + beta·C` (cuBLAS's convention).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sgemm {
    pub(crate) trans_a: bool,
    pub(crate) trans_b: bool,
    pub(crate) m: c_int,
    pub(crate) n: c_int,
    pub(crate) k: c_int,
    pub(crate) alpha: f32,
    pub(crate) a: u64,
    pub(crate) lda: c_int,
    pub(crate) b: u64,
    pub(crate) ldb: c_int,
    pub(crate) beta: f32,
    pub(crate) c: u64,
    pub(crate) ldc: c_int,
}

/// A cuBLAS handle bound to one stream; destroyed on drop.
#[derive(Debug)]
pub(crate) struct BlasHandle {
    lib: &'static Cublas,
    // cuBLAS handles are not safe for concurrent calls: each call holds this lock.
    handle: Mutex<HandlePtr>,
}

#[derive(Debug)]
struct HandlePtr(Handle);

// SAFETY: a cuBLAS handle may be used from any thread, one call at a time; the pointer only
// lives inside `BlasHandle`'s mutex.
unsafe impl Send for HandlePtr {}

impl BlasHandle {
    /// A handle whose work goes to `stream`; the stream's context must be current.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] without cuBLAS; [`Error::Cublas`] if creation fails.
    ///
    /// # Safety
    /// `stream` is a live `CUstream` of the current context, outliving the handle.
    pub(crate) unsafe fn new(stream: *mut c_void) -> Result<BlasHandle> {
        let lib = Cublas::get()?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the caller made the stream's context current.
        let code = unsafe { (lib.create)(&mut handle) };
        if code != 0 {
            return Err(Error::Cublas { op: "create", status: code });
        }
        let blas = BlasHandle { lib, handle: Mutex::new(HandlePtr(handle)) };
        // SAFETY: `handle` was just created; the caller guarantees the stream.
        let code = unsafe { (lib.set_stream)(handle, stream) };
        if code != 0 {
            return Err(Error::Cublas { op: "set stream", status: code });
        }
        Ok(blas)
    }

    /// Enqueues one sgemm on the handle's stream.
    ///
    /// # Errors
    /// [`Error::Cublas`] with the status.
    ///
    /// # Safety
    /// `a`, `b` and `c` are device addresses of the handle's device, holding the matrices the
    /// dimensions and leading dimensions describe, kept alive and unaliased (`c`) until the
    /// stream has run the call; the handle's context is current.
    pub(crate) unsafe fn sgemm(&self, g: Sgemm) -> Result<()> {
        let op = |t: bool| if t { OP_T } else { OP_N };
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the caller guarantees the buffers; alpha and beta are host scalars (the
        // default pointer mode) read before the call returns.
        let code = unsafe {
            (self.lib.sgemm)(
                handle.0,
                op(g.trans_a),
                op(g.trans_b),
                g.m,
                g.n,
                g.k,
                &g.alpha,
                g.a as *const f32,
                g.lda,
                g.b as *const f32,
                g.ldb,
                &g.beta,
                g.c as *mut f32,
                g.ldc,
            )
        };
        if code == 0 { Ok(()) } else { Err(Error::Cublas { op: "sgemm", status: code }) }
    }
}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        let handle = self.handle.get_mut().unwrap_or_else(|p| p.into_inner());
        if !handle.0.is_null() {
            // SAFETY: created by this library, destroyed once; errors are ignored (never panic).
            let _ = unsafe { (self.lib.destroy)(handle.0) };
            handle.0 = std::ptr::null_mut();
        }
    }
}

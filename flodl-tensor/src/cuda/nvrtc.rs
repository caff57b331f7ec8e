//! NVRTC, loaded by flodl itself (see [`crate::library_search`] for why): compiles CUDA C to a
//! CUBIN for one GPU architecture or to PTX.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

use super::runtime_library::{self, Opened};
use crate::library_search::RuntimeLibrary;
use crate::{Error, Result};

type Program = *mut c_void;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type BytesFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> c_int;
type NumArchsFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type ArchsFn = unsafe extern "C" fn(*mut c_int) -> c_int;

/// What NVRTC is asked to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Machine code for `sm_XY` (`XY` = major·10 + minor), loaded without JIT.
    Cubin(u32),
    /// PTX for `compute_XY`, JIT-compiled by the driver at load.
    Ptx(u32),
}

impl Target {
    fn option(self) -> String {
        match self {
            Target::Cubin(arch) => format!("--gpu-architecture=sm_{arch}"),
            Target::Ptx(arch) => format!("--gpu-architecture=compute_{arch}"),
        }
    }
}

/// The loaded NVRTC and the entry points flodl uses.
#[derive(Debug)]
pub(crate) struct Nvrtc {
    pub(crate) path: String,
    pub(crate) version: (u32, u32),
    error_string: ErrorStringFn,
    create: CreateFn,
    compile: CompileFn,
    log_size: SizeFn,
    log: BytesFn,
    ptx_size: SizeFn,
    ptx: BytesFn,
    cubin_size: SizeFn,
    cubin: BytesFn,
    destroy: DestroyFn,
    supported_archs: Option<(NumArchsFn, ArchsFn)>,
    _library: Opened,
}

/// Destroys a program on every path out of [`Nvrtc::compile`].
struct ProgramGuard<'a>(&'a Nvrtc, Program);

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the program was created by this NVRTC and is destroyed exactly once, here.
        let _ = unsafe { (self.0.destroy)(&mut self.1) };
    }
}

impl Nvrtc {
    /// The process-wide NVRTC, opened on first use.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] naming where it was looked for.
    pub(crate) fn get() -> Result<&'static Nvrtc> {
        static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
        NVRTC
            .get_or_init(Nvrtc::open)
            .as_ref()
            .map_err(|reason| Error::CudaUnavailable { reason: reason.clone() })
    }

    fn open() -> std::result::Result<Nvrtc, String> {
        let opened = runtime_library::open(RuntimeLibrary::Nvrtc)?;
        let lib = &opened.library;
        let path = opened.path.clone();
        fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Option<T> {
            // SAFETY: each `T` below is the C signature `nvrtc.h` declares for `name` (the same
            // in CUDA 12 and 13); the pointer is only called while the library stays loaded
            // (it is kept in the same `Nvrtc`).
            unsafe { lib.get::<T>(name.as_bytes()).ok().map(|s| *s) }
        }
        macro_rules! need {
            ($name:literal) => {
                symbol(lib, $name).ok_or_else(|| format!("{path} lacks `{}`", $name))?
            };
        }
        let version_fn: VersionFn = need!("nvrtcVersion");
        let (mut major, mut minor) = (0, 0);
        // SAFETY: `nvrtcVersion` writes two ints through the valid pointers.
        let code = unsafe { version_fn(&mut major, &mut minor) };
        if code != 0 {
            return Err(format!("{path}: nvrtcVersion failed ({code})"));
        }
        let supported_archs =
            match (symbol(lib, "nvrtcGetNumSupportedArchs"), symbol(lib, "nvrtcGetSupportedArchs"))
            {
                (Some(n), Some(a)) => Some((n, a)),
                _ => None,
            };
        let nvrtc = Nvrtc {
            version: (u32::try_from(major).unwrap_or(0), u32::try_from(minor).unwrap_or(0)),
            error_string: need!("nvrtcGetErrorString"),
            create: need!("nvrtcCreateProgram"),
            compile: need!("nvrtcCompileProgram"),
            log_size: need!("nvrtcGetProgramLogSize"),
            log: need!("nvrtcGetProgramLog"),
            ptx_size: need!("nvrtcGetPTXSize"),
            ptx: need!("nvrtcGetPTX"),
            cubin_size: need!("nvrtcGetCUBINSize"),
            cubin: need!("nvrtcGetCUBIN"),
            destroy: need!("nvrtcDestroyProgram"),
            supported_archs,
            path,
            _library: opened,
        };
        tracing::info!(library = %nvrtc.path, version = ?nvrtc.version, "NVRTC loaded");
        Ok(nvrtc)
    }

    /// The GPU architectures (`XY` of `sm_XY`) this NVRTC can compile for, ascending; empty when
    /// the library cannot say.
    pub(crate) fn supported_archs(&self) -> Vec<u32> {
        let Some((count_fn, archs_fn)) = self.supported_archs else { return Vec::new() };
        let mut count: c_int = 0;
        // SAFETY: writes one int through the valid pointer.
        if unsafe { count_fn(&mut count) } != 0 || count <= 0 {
            return Vec::new();
        }
        let mut archs = vec![0 as c_int; count as usize];
        // SAFETY: `archs` holds exactly the `count` ints NVRTC writes.
        if unsafe { archs_fn(archs.as_mut_ptr()) } != 0 {
            return Vec::new();
        }
        let mut archs: Vec<u32> = archs.into_iter().filter_map(|a| u32::try_from(a).ok()).collect();
        archs.sort_unstable();
        archs
    }

    fn describe(&self, code: c_int) -> String {
        // SAFETY: `nvrtcGetErrorString` accepts any code and returns a static string or null.
        let ptr = unsafe { (self.error_string)(code) };
        if ptr.is_null() {
            return format!("NVRTC error {code}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    }

    fn fail(&self, what: &str, code: c_int, log: &str) -> Error {
        let mut reason = format!("nvrtc {what}: {}", self.describe(code));
        if !log.trim().is_empty() {
            reason.push_str(&format!(": {}", log.trim()));
        }
        Error::KernelCompile { reason }
    }

    /// Compiles `source` for `target` and returns the CUBIN or the PTX (NUL-terminated, as the
    /// driver's loader wants it).
    ///
    /// # Errors
    /// [`Error::KernelCompile`] with NVRTC's log.
    pub(crate) fn compile(&self, source: &str, name: &str, target: Target) -> Result<Vec<u8>> {
        let bad = |_| Error::KernelCompile { reason: "source or option holds a NUL byte".into() };
        let (source, name) = (CString::new(source).map_err(bad)?, CString::new(name).map_err(bad)?);
        let options = [CString::new(target.option()).map_err(bad)?];
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let mut program: Program = std::ptr::null_mut();
        // SAFETY: valid out-pointer and NUL-terminated strings; no headers (null arrays, 0).
        let code = unsafe {
            (self.create)(
                &mut program,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if code != 0 {
            return Err(self.fail("create", code, ""));
        }
        let guard = ProgramGuard(self, program);
        let count = c_int::try_from(option_ptrs.len()).unwrap_or(0);
        // SAFETY: `program` is live (guarded); `option_ptrs` holds `count` valid C strings.
        let code = unsafe { (self.compile)(guard.1, count, option_ptrs.as_ptr()) };
        if code != 0 {
            let log = self.read(guard.1, self.log_size, self.log).unwrap_or_default();
            return Err(self.fail("compile", code, &String::from_utf8_lossy(&log)));
        }
        let (size, bytes) = match target {
            Target::Cubin(_) => (self.cubin_size, self.cubin),
            Target::Ptx(_) => (self.ptx_size, self.ptx),
        };
        self.read(guard.1, size, bytes).map_err(|code| self.fail("output", code, ""))
    }

    /// Reads one of the program's outputs (log, PTX, CUBIN) through its size and bytes calls.
    fn read(
        &self,
        program: Program,
        size: SizeFn,
        bytes: BytesFn,
    ) -> std::result::Result<Vec<u8>, c_int> {
        let mut n: usize = 0;
        // SAFETY: `program` is live; `n` is a valid out-pointer.
        let code = unsafe { size(program, &mut n) };
        if code != 0 {
            return Err(code);
        }
        let mut out = vec![0u8; n];
        if n > 0 {
            // SAFETY: `out` holds the `n` bytes NVRTC said it writes.
            let code = unsafe { bytes(program, out.as_mut_ptr().cast()) };
            if code != 0 {
                return Err(code);
            }
        }
        Ok(out)
    }
}

//! The NCCL library, loaded at run time: its entry points as raw function pointers, and its codes.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::fmt;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The environment variable that names the NCCL library to load instead of the default names.
pub const NCCL_LIB_ENV: &str = "FLODL_NCCL_LIB";

/// The names tried when [`NCCL_LIB_ENV`] is unset: the runtime package's soname first (what
/// `libnccl2` and the `nvidia-nccl-cu12`/`-cu13` wheels install), then the development symlink.
const DEFAULT_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// What to load, in order: the file [`NCCL_LIB_ENV`] names (alone: the user said which), else
/// the default names in each of `folders` (`FLODL_CUDA_LIB_DIR`, expanded), then the default
/// names through the system loader.
fn candidates(env: Option<&str>, folders: &[std::path::PathBuf]) -> Vec<String> {
    if let Some(path) = env.filter(|p| !p.is_empty()) {
        return vec![path.to_string()];
    }
    let in_folders = DEFAULT_NAMES
        .iter()
        .flat_map(|n| folders.iter().map(move |f| f.join(n)))
        .filter(|p| p.exists())
        .map(|p| p.to_string_lossy().into_owned());
    in_folders.chain(DEFAULT_NAMES.iter().map(|n| n.to_string())).collect()
}

/// An opaque `ncclComm_t`.
pub(crate) type RawComm = *mut c_void;
/// A raw CUDA stream handle (`cudaStream_t`, the same handle as the driver's `CUstream`).
pub type RawStream = *mut c_void;

/// `ncclResult_t` codes.
pub(crate) const SUCCESS: c_int = 0;
pub(crate) const IN_PROGRESS: c_int = 7;

/// `ncclDataType_t` codes.
pub(crate) const INT32: c_int = 2;
pub(crate) const FLOAT32: c_int = 7;
pub(crate) const BFLOAT16: c_int = 9;

/// `ncclRedOp_t` code of the sum (custom PreMulSum handles are other integers).
pub(crate) const SUM: c_int = 0;
/// `ncclScalarResidence_t`: the scalar is read from host memory when the op is created.
pub(crate) const SCALAR_HOST_IMMEDIATE: c_int = 1;

/// `NCCL_CONFIG_UNDEF_INT`: leave a config field at NCCL's default.
const UNDEF_INT: c_int = c_int::MIN;

/// The symbolic name of an `ncclResult_t`.
pub(crate) fn code_name(code: c_int) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        8 => "ncclTimeout",
        _ => "unknown ncclResult_t",
    }
}

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RawUniqueId {
    pub(crate) internal: [c_char; 128],
}

/// `ncclConfig_t` up to `trafficClass` (NCCL 2.26): 48 bytes, every one of them written.
///
/// NCCL copies `min(size, sizeof(its own struct))` bytes, so this works with newer libraries
/// (their later fields keep NCCL's defaults), and it checks `magic` to know the struct was
/// initialised the way `NCCL_CONFIG_INITIALIZER` does. Bytes 44..48 were padding in the 2.17
/// layout but are `trafficClass` from 2.26 on, so the field is declared and left undefined
/// (`NCCL_CONFIG_UNDEF_INT`) rather than left as uninitialised padding.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct RawConfig {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
    traffic_class: c_int,
}

impl RawConfig {
    /// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`: calls return `ncclInProgress` instead of
    /// blocking, so a stuck rendezvous can be polled against a deadline and aborted.
    pub(crate) fn non_blocking() -> RawConfig {
        RawConfig {
            size: size_of::<RawConfig>(),
            magic: 0xcafe_beef,
            version: 21700,
            blocking: 0,
            cga_cluster_size: UNDEF_INT,
            min_ctas: UNDEF_INT,
            max_ctas: UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: UNDEF_INT,
            traffic_class: UNDEF_INT,
        }
    }
}

/// An NCCL version, decoded from `ncclGetVersion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NcclVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch level.
    pub patch: u32,
}

impl NcclVersion {
    /// Decodes `ncclGetVersion`'s integer (`X·10000 + Y·100 + Z` since 2.9, `X·1000 + Y·100 + Z`
    /// before).
    pub fn from_code(code: u32) -> NcclVersion {
        let (major, rest) =
            if code >= 20900 { (code / 10000, code % 10000) } else { (code / 1000, code % 1000) };
        NcclVersion { major, minor: rest / 100, patch: rest % 100 }
    }

    /// Whether this version is at least `major.minor`.
    pub fn at_least(self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

type GetVersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueIdFn = unsafe extern "C" fn(*mut RawUniqueId) -> c_int;
type CommInitRankConfigFn =
    unsafe extern "C" fn(*mut RawComm, c_int, RawUniqueId, c_int, *mut RawConfig) -> c_int;
type CommGetAsyncErrorFn = unsafe extern "C" fn(RawComm, *mut c_int) -> c_int;
type CommFn = unsafe extern "C" fn(RawComm) -> c_int;
type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    RawStream,
) -> c_int;
type BroadcastFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    RawStream,
) -> c_int;
type GroupFn = unsafe extern "C" fn() -> c_int;
type GetErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type GetLastErrorFn = unsafe extern "C" fn(RawComm) -> *const c_char;
type RedOpCreatePreMulSumFn =
    unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, RawComm) -> c_int;
type RedOpDestroyFn = unsafe extern "C" fn(c_int, RawComm) -> c_int;

/// The loaded NCCL library and the entry points flodl uses.
pub(crate) struct Library {
    /// Where it was loaded from.
    pub(crate) name: String,
    pub(crate) version: NcclVersion,
    pub(crate) get_unique_id: GetUniqueIdFn,
    pub(crate) comm_init_rank_config: CommInitRankConfigFn,
    pub(crate) comm_get_async_error: CommGetAsyncErrorFn,
    pub(crate) comm_abort: CommFn,
    pub(crate) comm_destroy: CommFn,
    pub(crate) all_reduce: AllReduceFn,
    pub(crate) broadcast: BroadcastFn,
    pub(crate) group_start: GroupFn,
    pub(crate) group_end: GroupFn,
    get_error_string: GetErrorStringFn,
    get_last_error: Option<GetLastErrorFn>,
    /// `ncclRedOpCreatePreMulSum` and `ncclRedOpDestroy` (NCCL 2.11+).
    pub(crate) pre_mul_sum: Option<(RedOpCreatePreMulSumFn, RedOpDestroyFn)>,
    /// Keeps the code behind the function pointers mapped.
    _library: libloading::Library,
}

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Library").field("name", &self.name).field("version", &self.version).finish()
    }
}

static LIBRARY: OnceLock<std::result::Result<Library, String>> = OnceLock::new();

impl Library {
    /// The process-wide NCCL library, loaded on first use.
    ///
    /// # Errors
    /// `LibraryMissing` if no candidate loads or a required symbol is missing.
    pub(crate) fn get() -> Result<&'static Library> {
        LIBRARY
            .get_or_init(Library::load)
            .as_ref()
            .map_err(|why| Error::LibraryMissing(why.clone()))
    }

    fn load() -> std::result::Result<Library, String> {
        let env = std::env::var(NCCL_LIB_ENV).ok();
        let names = candidates(env.as_deref(), &flodl_tensor::cuda_lib_folders());
        let mut failures = Vec::new();
        for name in &names {
            // SAFETY: loading a shared library runs its initialisers; NCCL's only set up
            // internal state and have no preconditions on the caller.
            match unsafe { libloading::Library::new(name) } {
                Ok(library) => return Library::bind(name.clone(), library),
                Err(e) => {
                    // libloading says only "dlopen failed" and keeps the loader's message below.
                    let why = std::error::Error::source(&e)
                        .map_or_else(|| e.to_string(), |s| s.to_string());
                    failures.push(format!("{name}: {why}"));
                }
            }
        }
        Err(format!(
            "could not load NCCL ({}); set {NCCL_LIB_ENV} to its path or {} to its folder",
            failures.join("; "),
            flodl_tensor::CUDA_LIB_DIR_ENV
        ))
    }

    fn bind(name: String, library: libloading::Library) -> std::result::Result<Library, String> {
        fn symbol<T: Copy>(library: &libloading::Library, symbol: &str) -> Option<T> {
            // SAFETY: every `T` used below is the C signature NCCL's `nccl.h` declares for
            // `symbol`, and the pointer is only called while `library` stays loaded (it is kept
            // in the same `Library`).
            unsafe { library.get::<T>(symbol.as_bytes()).ok().map(|s| *s) }
        }
        let required = |s: &str| format!("{name} lacks `{s}` (NCCL 2.14 or newer is required)");
        macro_rules! need {
            ($sym:literal) => {
                symbol(&library, $sym).ok_or_else(|| required($sym))?
            };
        }
        let get_version: GetVersionFn = need!("ncclGetVersion");
        let mut code: c_int = 0;
        // SAFETY: `ncclGetVersion` writes one int through the valid pointer.
        let status = unsafe { get_version(&mut code) };
        if status != SUCCESS {
            return Err(format!("{name}: ncclGetVersion failed with {}", code_name(status)));
        }
        let version = NcclVersion::from_code(u32::try_from(code).unwrap_or(0));
        let pre_mul_sum = match (
            symbol::<RedOpCreatePreMulSumFn>(&library, "ncclRedOpCreatePreMulSum"),
            symbol::<RedOpDestroyFn>(&library, "ncclRedOpDestroy"),
        ) {
            (Some(create), Some(destroy)) if version.at_least(2, 11) => Some((create, destroy)),
            _ => None,
        };
        let lib = Library {
            version,
            get_unique_id: need!("ncclGetUniqueId"),
            comm_init_rank_config: need!("ncclCommInitRankConfig"),
            comm_get_async_error: need!("ncclCommGetAsyncError"),
            comm_abort: need!("ncclCommAbort"),
            comm_destroy: need!("ncclCommDestroy"),
            all_reduce: need!("ncclAllReduce"),
            broadcast: need!("ncclBroadcast"),
            group_start: need!("ncclGroupStart"),
            group_end: need!("ncclGroupEnd"),
            get_error_string: need!("ncclGetErrorString"),
            get_last_error: symbol(&library, "ncclGetLastError"),
            pre_mul_sum,
            name,
            _library: library,
        };
        tracing::info!(library = %lib.name, version = %lib.version, "NCCL loaded");
        Ok(lib)
    }

    /// Turns an `ncclResult_t` into `Ok` or an `Nccl` error with NCCL's own description.
    pub(crate) fn check(&self, code: c_int, comm: Option<RawComm>) -> Result<()> {
        if code == SUCCESS {
            return Ok(());
        }
        Err(self.error(code, comm))
    }

    /// The `Nccl` error for `code`, with the library's message (and the comm's last error).
    pub(crate) fn error(&self, code: c_int, comm: Option<RawComm>) -> Error {
        let mut message = self.c_string(
            // SAFETY: `ncclGetErrorString` accepts any code and returns a static string.
            unsafe { (self.get_error_string)(code) },
        );
        if let (Some(last), Some(comm)) = (self.get_last_error, comm) {
            // SAFETY: `comm` is a live communicator (callers pass `None` otherwise); the
            // returned string is owned by NCCL and copied out immediately.
            let detail = self.c_string(unsafe { last(comm) });
            if !detail.is_empty() {
                message = format!("{message}: {detail}");
            }
        }
        Error::Nccl { code, name: code_name(code), message }
    }

    fn c_string(&self, ptr: *const c_char) -> String {
        if ptr.is_null() {
            return String::new();
        }
        // SAFETY: NCCL returns NUL-terminated strings that stay valid at least until the next
        // call on the same thread; we copy before returning.
        unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    }
}

/// Why NCCL collectives cannot run in this process (no loadable NCCL library, no CUDA driver or
/// no GPU), or `None` when they can. Never panics; suitable as a test skip reason.
pub fn nccl_skip_reason() -> Option<String> {
    if let Err(e) = Library::get() {
        return Some(e.to_string());
    }
    flodl_tensor::gpu_skip_reason()
}

/// The NCCL library this process loads: the name or path it was loaded by, and its version.
///
/// # Errors
/// `LibraryMissing` if NCCL cannot be loaded (see [`NCCL_LIB_ENV`]).
pub fn nccl_library() -> Result<(String, NcclVersion)> {
    Library::get().map(|lib| (lib.name.clone(), lib.version))
}

/// The version of the NCCL library this process can load.
///
/// # Errors
/// `LibraryMissing` if NCCL cannot be loaded (see [`NCCL_LIB_ENV`]).
pub fn nccl_version() -> Result<NcclVersion> {
    Library::get().map(|lib| lib.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode_both_encodings() {
        let cases = [
            (2708, (2, 7, 8)),
            (2804, (2, 8, 4)),
            (20903, (2, 9, 3)),
            (21105, (2, 11, 5)),
            (22304, (2, 23, 4)),
            (22703, (2, 27, 3)),
        ];
        for (code, (major, minor, patch)) in cases {
            assert_eq!(NcclVersion::from_code(code), NcclVersion { major, minor, patch }, "{code}");
        }
        assert!(NcclVersion::from_code(21100).at_least(2, 11));
        assert!(!NcclVersion::from_code(21003).at_least(2, 11));
        assert_eq!(NcclVersion::from_code(22304).to_string(), "2.23.4");
    }

    /// The config's bytes, as NCCL reads them: every byte up to `size` is a declared field at
    /// the offset `nccl.h` gives it (2.26 layout), none is padding.
    #[test]
    fn the_config_bytes_match_the_2_26_layout() {
        let config = RawConfig::non_blocking();
        assert_eq!(size_of::<RawConfig>(), 48);
        assert_eq!(config.size, 48);
        // SAFETY: `RawConfig` is `repr(C)` with no padding (the offsets below cover all 48
        // bytes), so every byte is initialised and may be read as a `u8`.
        let bytes: &[u8] =
            unsafe { std::slice::from_raw_parts((&config as *const RawConfig).cast::<u8>(), 48) };
        let int = |at: usize| i32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
        let undef = i32::MIN;
        let expected: [(usize, &str, i64); 8] = [
            (8, "magic", 0xcafe_beef_u32 as i32 as i64),
            (12, "version", 21700),
            (16, "blocking", 0),
            (20, "cgaClusterSize", undef as i64),
            (24, "minCTAs", undef as i64),
            (28, "maxCTAs", undef as i64),
            (40, "splitShare", undef as i64),
            (44, "trafficClass", undef as i64),
        ];
        for (at, field, want) in expected {
            assert_eq!(int(at) as i64, want, "{field} at byte {at}");
        }
        assert_eq!(u64::from_ne_bytes(bytes[0..8].try_into().unwrap_or([0; 8])), 48, "size");
        assert_eq!(&bytes[32..40], &[0; 8], "netName (null)");
        assert_eq!(std::mem::offset_of!(RawConfig, traffic_class), 44);
        assert_eq!(std::mem::offset_of!(RawConfig, net_name), 32);
    }

    #[test]
    fn nccl_is_looked_for_where_the_user_said_first() -> std::io::Result<()> {
        let dir = std::env::temp_dir().join(format!("flodl-nccl-cands-{}", std::process::id()));
        let (with, without) = (dir.join("nccl/lib"), dir.join("empty/lib"));
        std::fs::create_dir_all(&with)?;
        std::fs::create_dir_all(&without)?;
        std::fs::write(with.join("libnccl.so.2"), b"")?;
        let folders = [without.clone(), with.clone()];
        let found = with.join("libnccl.so.2").to_string_lossy().into_owned();
        let cases: [(Option<&str>, &[std::path::PathBuf], Vec<&str>); 4] = [
            (Some("/x/libnccl.so.2.30.7"), &folders, vec!["/x/libnccl.so.2.30.7"]),
            (Some(""), &[], vec!["libnccl.so.2", "libnccl.so"]),
            (None, &[], vec!["libnccl.so.2", "libnccl.so"]),
            (None, &folders, vec![found.as_str(), "libnccl.so.2", "libnccl.so"]),
        ];
        let got: Vec<Vec<String>> = cases.iter().map(|(env, f, _)| candidates(*env, f)).collect();
        std::fs::remove_dir_all(&dir)?;
        for ((env, _, want), got) in cases.iter().zip(got) {
            assert_eq!(got, *want, "{env:?}");
        }
        Ok(())
    }

    #[test]
    fn result_codes_have_their_nccl_names() {
        let cases = [
            (0, "ncclSuccess"),
            (1, "ncclUnhandledCudaError"),
            (2, "ncclSystemError"),
            (3, "ncclInternalError"),
            (4, "ncclInvalidArgument"),
            (5, "ncclInvalidUsage"),
            (6, "ncclRemoteError"),
            (7, "ncclInProgress"),
            (8, "ncclTimeout"),
            (9, "unknown ncclResult_t"),
            (-1, "unknown ncclResult_t"),
        ];
        for (code, name) in cases {
            assert_eq!(code_name(code), name, "code {code}");
        }
    }
}

//! A CUDA runtime library (NVRTC, cuBLAS) opened with `libloading` from the candidate list of
//! [`crate::library_search`]: the first candidate that opens wins.

use std::path::{Path, PathBuf};

use crate::library_search::{
    CUDA_LIB_DIR_ENV, Candidate, RuntimeLibrary, candidates, cuda_lib_folders,
};

/// An opened runtime library and where it came from.
#[derive(Debug)]
pub(crate) struct Opened {
    /// The file the process mapped (the candidate itself when it cannot be told).
    pub(crate) path: String,
    pub(crate) library: libloading::Library,
    /// The companion loaded first from the same folder (kept mapped as long as the library).
    _companion: Option<libloading::Library>,
}

/// Opens `library` from the first candidate that loads.
///
/// # Errors
/// A one-line reason naming what was tried and why the candidates that exist failed.
pub(crate) fn open(library: RuntimeLibrary) -> Result<Opened, String> {
    let folders = cuda_lib_folders();
    let driver_major = super::context::driver_version().map(|(major, _)| major);
    let mut failures = Vec::new();
    for candidate in candidates(library, &folders, driver_major) {
        if let Candidate::File(path) = &candidate
            && !path.exists()
        {
            continue;
        }
        let companion = match (&candidate, library.companion()) {
            (Candidate::File(path), Some(stem)) => open_companion(path, library, stem),
            _ => None,
        };
        // SAFETY: loading a CUDA runtime library runs its initialisers, which only set up
        // internal state and have no preconditions on the caller.
        match unsafe { libloading::Library::new(candidate.target()) } {
            Ok(lib) => {
                let path = mapped_path(library.stem())
                    .unwrap_or_else(|| candidate.target().to_string_lossy().into_owned());
                return Ok(Opened { path, library: lib, _companion: companion });
            }
            Err(e) => {
                let e = describe(&e);
                let missing = matches!(candidate, Candidate::Soname(_))
                    && e.contains("No such file or directory");
                if !missing {
                    failures.push(e);
                }
            }
        }
    }
    let searched = if folders.is_empty() {
        format!("the loader path (set {CUDA_LIB_DIR_ENV} to add folders)")
    } else {
        format!("{CUDA_LIB_DIR_ENV} ({} folders) and the loader path", folders.len())
    };
    let mut reason =
        format!("{} ({}.so.13 or .so.12) not found on {searched}", library.name(), library.stem());
    if !failures.is_empty() {
        reason.push_str(&format!("; failed to load: {}", failures.join("; ")));
    }
    Err(reason)
}

/// The loader's own message (libloading's error only says "dlopen failed" and keeps the
/// message as its source).
fn describe(e: &libloading::Error) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
}

/// Loads `stem` of the same version as `path` from `path`'s folder, if it is there, so that
/// `path`'s own dependency on it resolves to that file whatever the loader path says.
fn open_companion(path: &Path, library: RuntimeLibrary, stem: &str) -> Option<libloading::Library> {
    let name = path.file_name()?.to_str()?;
    let suffix = name.strip_prefix(library.stem())?;
    let companion: PathBuf = path.with_file_name(format!("{stem}{suffix}"));
    if !companion.exists() {
        return None;
    }
    // SAFETY: as for the library itself: its initialisers have no preconditions.
    unsafe { libloading::Library::new(&companion) }.ok()
}

/// The file mapped into this process whose name starts with `stem.so` (Linux: from
/// `/proc/self/maps`), i.e. the real file behind a soname or a link.
pub(crate) fn mapped_path(stem: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let wanted = format!("/{stem}.so");
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.contains(&wanted))
        .map(str::to_string)
}

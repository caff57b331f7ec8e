//! The CUDA libraries this process finds: the driver, NVRTC and cuBLAS, with where each came
//! from and its version (what `fdl devices` lists).

use crate::cuda;

/// One CUDA library as this process finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryReport {
    /// The library: "CUDA driver", "NVRTC", "cuBLAS".
    pub name: &'static str,
    /// Whether it was found, and what.
    pub status: LibraryStatus,
}

/// Whether a library was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibraryStatus {
    /// Loaded from `path`, at `version` (for the driver: the CUDA version it supports).
    Found {
        /// The file mapped into the process (or the name the loader was given).
        path: String,
        /// `major.minor` or `major.minor.patch`.
        version: String,
    },
    /// Not usable, and why (what was searched, what failed to load).
    Missing {
        /// A one-line reason.
        reason: String,
    },
}

/// The driver, NVRTC and cuBLAS, each loaded (once per process) if it can be; never panics.
/// NVRTC and cuBLAS are searched in [`crate::CUDA_LIB_DIR_ENV`]'s folders, then on the loader
/// path, CUDA 13 and 12 alike.
pub fn cuda_libraries() -> Vec<LibraryReport> {
    cuda::library_reports()
}

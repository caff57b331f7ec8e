//! Reports of the driver, NVRTC and cuBLAS as this process loads them.

use super::context::driver_version;
use super::cublas::Cublas;
use super::nvrtc::Nvrtc;
use super::runtime_library::mapped_path;
use crate::{LibraryReport, LibraryStatus};

fn missing(e: impl std::fmt::Display) -> LibraryStatus {
    LibraryStatus::Missing { reason: e.to_string() }
}

/// See [`crate::cuda_libraries`].
pub(crate) fn library_reports() -> Vec<LibraryReport> {
    let driver = match driver_version() {
        Some((major, minor)) => LibraryStatus::Found {
            path: mapped_path("libcuda").unwrap_or_else(|| "libcuda.so.1".into()),
            version: format!("{major}.{minor}"),
        },
        None => missing("the CUDA driver library (libcuda) is not installed"),
    };
    let nvrtc = match Nvrtc::get() {
        Ok(n) => LibraryStatus::Found {
            path: n.path.clone(),
            version: format!("{}.{}", n.version.0, n.version.1),
        },
        Err(e) => missing(e),
    };
    let cublas = match Cublas::get() {
        Ok(c) => LibraryStatus::Found {
            path: c.path.clone(),
            version: format!("{}.{}.{}", c.version.0, c.version.1, c.version.2),
        },
        Err(e) => missing(e),
    };
    vec![
        LibraryReport { name: "CUDA driver", status: driver },
        LibraryReport { name: "NVRTC", status: nvrtc },
        LibraryReport { name: "cuBLAS", status: cublas },
    ]
}

//! Where the CUDA runtime libraries flodl loads itself (NVRTC, cuBLAS) are looked for: the
//! candidate list, as a pure function of the user's folders and the driver's CUDA version.
//!
//! Why flodl loads them itself: cudarc 0.19 with the `cuda-12080` bindings looks for
//! `lib{nvrtc,cublas}.so`, `.so.12`, `.so.11`, … by bare name only, and has no way to be given
//! another name or a folder. A CUDA 13 runtime (`libnvrtc.so.13`, `libcublas.so.13`, as CUDA 13
//! images and the cu13 Python wheels install) is therefore never found. Preloading the right
//! file by full path does not help: glibc's `dlopen("libnvrtc.so.12")` reuses an already loaded
//! object only when that name equals the object's soname (`libnvrtc.so.13`), and cudarc looks up
//! its symbols through its own handle, so `RTLD_GLOBAL` changes nothing either. Moving cudarc to
//! 13.x bindings would find `.so.13` but would also make the driver layer call entry points
//! that 12.x drivers lack. So NVRTC and cuBLAS, of which flodl calls about ten entry points
//! whose signatures are the same in CUDA 12 and 13, are loaded with `libloading` from the list
//! built here, and cudarc keeps the driver (`libcuda.so.1`, one name for every CUDA version).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The environment variable naming extra folders to search first (a `:`-separated list; each
/// folder is searched itself and through its `*/lib` subfolders, so a Python
/// `site-packages/nvidia` folder works as it is).
pub const CUDA_LIB_DIR_ENV: &str = "FLODL_CUDA_LIB_DIR";

/// The CUDA runtime major versions whose libraries flodl can use, newest first.
const MAJORS: [u32; 2] = [13, 12];

/// A CUDA runtime library flodl loads itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuntimeLibrary {
    /// NVRTC, the run-time compiler of flodl's kernels.
    Nvrtc,
    /// cuBLAS, for gemm.
    Cublas,
}

impl RuntimeLibrary {
    /// The file-name stem: `libnvrtc`, `libcublas`.
    pub fn stem(self) -> &'static str {
        match self {
            RuntimeLibrary::Nvrtc => "libnvrtc",
            RuntimeLibrary::Cublas => "libcublas",
        }
    }

    /// A library that must be loaded from the same folder first, if that folder has it (cuBLAS
    /// calls into cuBLASLt of its own version).
    pub(crate) fn companion(self) -> Option<&'static str> {
        match self {
            RuntimeLibrary::Nvrtc => None,
            RuntimeLibrary::Cublas => Some("libcublasLt"),
        }
    }

    /// What to call it in messages.
    pub fn name(self) -> &'static str {
        match self {
            RuntimeLibrary::Nvrtc => "NVRTC",
            RuntimeLibrary::Cublas => "cuBLAS",
        }
    }
}

/// One place to try: a file in a named folder, or a soname the system loader resolves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Candidate {
    /// A full path (from [`CUDA_LIB_DIR_ENV`]).
    File(PathBuf),
    /// A bare name, resolved by the loader (`LD_LIBRARY_PATH`, the ld cache, the default folders).
    Soname(String),
}

impl Candidate {
    /// What is handed to `dlopen`.
    pub(crate) fn target(&self) -> &OsStr {
        match self {
            Candidate::File(path) => path.as_os_str(),
            Candidate::Soname(name) => OsStr::new(name.as_str()),
        }
    }
}

/// The folders named by the value of [`CUDA_LIB_DIR_ENV`], in order: each entry, then its
/// `*/lib` subfolders as `lib_subfolders` lists them (sorted here). Empty entries are skipped;
/// a folder reached twice is kept once, at its first place.
pub(crate) fn search_folders(
    value: Option<&OsStr>,
    lib_subfolders: impl Fn(&Path) -> Vec<PathBuf>,
) -> Vec<PathBuf> {
    let mut folders: Vec<PathBuf> = Vec::new();
    let Some(value) = value else { return folders };
    for entry in std::env::split_paths(value).filter(|p| !p.as_os_str().is_empty()) {
        let mut subs = lib_subfolders(&entry);
        subs.sort();
        for folder in std::iter::once(entry).chain(subs) {
            if !folders.contains(&folder) {
                folders.push(folder);
            }
        }
    }
    folders
}

/// The folders [`CUDA_LIB_DIR_ENV`] names, expanded (each entry, then its `*/lib` subfolders),
/// in search order: the one rule every CUDA library search of flodl uses (NCCL's too).
pub fn cuda_lib_folders() -> Vec<PathBuf> {
    search_folders(std::env::var_os(CUDA_LIB_DIR_ENV).as_deref(), lib_subfolders_on_disk)
}

/// The existing `*/lib` folders under `folder` (nothing when it cannot be read).
pub(crate) fn lib_subfolders_on_disk(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else { return Vec::new() };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("lib"))
        .filter(|lib| lib.is_dir())
        .collect()
}

/// The majors in the order to try: with a driver of CUDA `driver_major`, the versions it can
/// run (≤ its major) newest first, then the newer ones (tried last, so a lone newer library is
/// still reported and its failure explained); without a known driver, newest first.
fn major_order(driver_major: Option<u32>) -> Vec<u32> {
    match driver_major {
        None => MAJORS.to_vec(),
        Some(d) => {
            let runnable = MAJORS.iter().copied().filter(|&m| m <= d);
            let newer = MAJORS.iter().copied().filter(|&m| m > d).rev();
            runnable.chain(newer).collect()
        }
    }
}

/// Every candidate for `library`, in the order to try: the versioned names in the named
/// folders (by [`major_order`] first, folder order second: the newest version the driver runs
/// wins wherever it is), the unversioned development name in each folder, then the same names
/// through the system loader.
pub(crate) fn candidates(
    library: RuntimeLibrary,
    folders: &[PathBuf],
    driver_major: Option<u32>,
) -> Vec<Candidate> {
    let stem = library.stem();
    let names: Vec<String> = major_order(driver_major)
        .into_iter()
        .map(|m| format!("{stem}.so.{m}"))
        .chain(std::iter::once(format!("{stem}.so")))
        .collect();
    let files = names
        .iter()
        .flat_map(|n| folders.iter().map(move |folder| Candidate::File(folder.join(n))));
    files.chain(names.iter().cloned().map(Candidate::Soname)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(path: &Path) -> Vec<PathBuf> {
        match path.to_str() {
            // Unsorted on purpose: the builder sorts.
            Some("/sp/nvidia") => vec![
                PathBuf::from("/sp/nvidia/cuda_nvrtc/lib"),
                PathBuf::from("/sp/nvidia/cublas/lib"),
            ],
            Some("/sp/nvidia/cu13") => Vec::new(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn folders_come_from_the_variable_with_their_lib_subfolders() {
        let cases: [(Option<&str>, Vec<&str>); 5] = [
            (None, vec![]),
            (Some(""), vec![]),
            (Some("/opt/cuda/lib64"), vec!["/opt/cuda/lib64"]),
            (
                Some("/sp/nvidia"),
                vec!["/sp/nvidia", "/sp/nvidia/cublas/lib", "/sp/nvidia/cuda_nvrtc/lib"],
            ),
            (
                Some("/sp/nvidia/cu13/lib::/sp/nvidia:/sp/nvidia/cublas/lib"),
                vec![
                    "/sp/nvidia/cu13/lib",
                    "/sp/nvidia",
                    "/sp/nvidia/cublas/lib",
                    "/sp/nvidia/cuda_nvrtc/lib",
                ],
            ),
        ];
        for (value, want) in cases {
            let got = search_folders(value.map(OsStr::new), listing);
            let want: Vec<PathBuf> = want.into_iter().map(PathBuf::from).collect();
            assert_eq!(got, want, "{value:?}");
        }
    }

    #[test]
    fn versions_the_driver_can_run_come_first() {
        let cases = [
            (None, vec![13, 12]),
            (Some(13), vec![13, 12]),
            (Some(14), vec![13, 12]),
            (Some(12), vec![12, 13]),
            (Some(11), vec![12, 13]),
        ];
        for (driver, want) in cases {
            assert_eq!(major_order(driver), want, "driver {driver:?}");
        }
    }

    #[test]
    fn candidates_search_named_folders_then_the_loader() {
        let folders = [PathBuf::from("/a"), PathBuf::from("/b")];
        let file = |p: &str| Candidate::File(PathBuf::from(p));
        let soname = |n: &str| Candidate::Soname(n.to_string());
        let cases = [
            (
                RuntimeLibrary::Nvrtc,
                &folders[..],
                Some(13),
                vec![
                    file("/a/libnvrtc.so.13"),
                    file("/b/libnvrtc.so.13"),
                    file("/a/libnvrtc.so.12"),
                    file("/b/libnvrtc.so.12"),
                    file("/a/libnvrtc.so"),
                    file("/b/libnvrtc.so"),
                    soname("libnvrtc.so.13"),
                    soname("libnvrtc.so.12"),
                    soname("libnvrtc.so"),
                ],
            ),
            (
                RuntimeLibrary::Cublas,
                &folders[..0],
                Some(12),
                vec![soname("libcublas.so.12"), soname("libcublas.so.13"), soname("libcublas.so")],
            ),
        ];
        for (library, folders, driver, want) in cases {
            assert_eq!(candidates(library, folders, driver), want, "{library:?} {driver:?}");
        }
    }

    #[test]
    fn lib_subfolders_are_found_on_disk() -> std::io::Result<()> {
        let root = std::env::temp_dir().join(format!("flodl-libsearch-{}", std::process::id()));
        for sub in ["cu13/lib", "cublas/lib", "no_lib_here/include"] {
            std::fs::create_dir_all(root.join(sub))?;
        }
        let found = search_folders(Some(root.as_os_str()), lib_subfolders_on_disk);
        std::fs::remove_dir_all(&root)?;
        let want = vec![root.clone(), root.join("cu13/lib"), root.join("cublas/lib")];
        assert_eq!(found, want);
        Ok(())
    }
}

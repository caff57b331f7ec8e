//! A self-contained GPU test bundle: stripped test binaries, `fdl` for the matrix's jobs, the
//! MNIST data, this xtask as the matrix runner, and a run.sh, for a GPU machine with no Rust
//! toolchain.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::cargo_artifact::{TestBinary, TestBuild};
use crate::matrix::Job;
use crate::workspace;

/// The bundle's manifest file.
pub(crate) const MANIFEST: &str = "bundle.json";
/// The largest bundle that can travel to a device machine.
const SIZE_LIMIT: u64 = 64 * 1024 * 1024;

/// What a bundle holds: its test binaries, with paths relative to the bundle.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BundleManifest {
    /// The commit the binaries were built from (`git describe --always --dirty`).
    pub(crate) source: String,
    /// Every test target compiled (false: built with `--keep-going` past compile errors).
    pub(crate) complete: bool,
    /// The test binaries: `exe` under `bin/`, `manifest_dir` a folder named after the package's.
    pub(crate) binaries: Vec<TestBinary>,
    /// `fdl` for the matrix's jobs (`bin/fdl`), when it was built.
    #[serde(default)]
    pub(crate) fdl: Option<PathBuf>,
}

/// Writes a bundle of `build` into `dir` (created; an earlier bundle there is replaced), with
/// `fdl` for `jobs`, whose flags are checked against its help first (a stale job would cost GPU
/// time to find).
///
/// # Errors
/// When `dir` holds something other than a bundle, `fdl` was not built or does not know a job's
/// flag, or a copy fails.
pub(crate) fn make(dir: &Path, build: &TestBuild, jobs: &[Job]) -> Result<()> {
    let fdl = build.fdl.as_deref().context("the build made no fdl binary for the matrix's jobs")?;
    check_job_flags(fdl, jobs)?;
    let (binaries, complete) = (&build.binaries, build.complete);
    if dir.exists() && fs::read_dir(dir)?.next().is_some() {
        if !dir.join(MANIFEST).exists() {
            bail!(
                "{} is not empty and holds no {MANIFEST}: refusing to overwrite it",
                dir.display()
            );
        }
        fs::remove_dir_all(dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).with_context(|| format!("cannot create {}", bin.display()))?;
    let mut packer = Packer::new();
    let mut bundled = Vec::new();
    for binary in binaries {
        let name = format!("{}.{}.{}", binary.package, binary.kind, binary.target);
        packer.pack(&binary.exe, &bin.join(&name))?;
        let package_dir = binary
            .manifest_dir
            .file_name()
            .map(PathBuf::from)
            .unwrap_or_else(|| binary.package.clone().into());
        fs::create_dir_all(dir.join(&package_dir))?;
        bundled.push(TestBinary {
            exe: Path::new("bin").join(&name),
            manifest_dir: package_dir,
            ..binary.clone()
        });
    }
    let xtask = env::current_exe().context("cannot find the running xtask")?;
    packer.pack(&xtask, &bin.join("xtask"))?;
    packer.pack(fdl, &bin.join(FDL_EXE))?;
    let mnist = dir.join("data").join("mnist");
    fs::create_dir_all(&mnist)?;
    for entry in fs::read_dir(workspace::mnist_dir()).context("cannot read data/mnist")? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            fs::copy(entry.path(), mnist.join(entry.file_name()))?;
        }
    }
    let script = dir.join("run.sh");
    fs::write(&script, run_script())?;
    make_executable(&script)?;
    let manifest = BundleManifest {
        source: git_describe(),
        complete,
        binaries: bundled,
        fdl: Some(Path::new("bin").join(FDL_EXE)),
    };
    fs::write(dir.join(MANIFEST), serde_json::to_string_pretty(&manifest)? + "\n")?;
    let size = folder_size(dir)?;
    eprintln!(
        "bundle: {} test binaries, {:.1} MiB in {} ({})",
        manifest.binaries.len(),
        size as f64 / (1024.0 * 1024.0),
        dir.display(),
        packer.describe()
    );
    if !complete {
        eprintln!("bundle: warning: some tests did not compile and are not in the bundle");
    }
    if size > SIZE_LIMIT {
        eprintln!("bundle: warning: larger than {} MiB", SIZE_LIMIT / (1024 * 1024));
    }
    Ok(())
}

/// `fdl`'s file name under the bundle's `bin/`.
const FDL_EXE: &str = "fdl";

/// Fails naming the job and the flag when `fdl <subcommand> --help` does not list a flag a job
/// uses.
fn check_job_flags(fdl: &Path, jobs: &[Job]) -> Result<()> {
    for job in jobs {
        let Some(subcommand) = job.args.first() else { continue };
        let help = Command::new(fdl)
            .args([subcommand, "--help"])
            .output()
            .with_context(|| format!("cannot start {}", fdl.display()))?;
        let help = String::from_utf8_lossy(&help.stdout);
        for flag in job.flags() {
            let listed = help
                .split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[')
                .any(|word| word == flag);
            if !listed {
                bail!(
                    "the matrix's job {:?} uses {flag}, which `fdl {subcommand}` does not know",
                    job.name
                );
            }
        }
    }
    Ok(())
}

/// Reads a bundle's manifest, with paths made absolute.
///
/// # Errors
/// When `dir` holds no readable manifest.
pub(crate) fn load(dir: &Path) -> Result<TestBuild> {
    let dir = dir.canonicalize().with_context(|| format!("no bundle at {}", dir.display()))?;
    let path = dir.join(MANIFEST);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let manifest: BundleManifest =
        serde_json::from_str(&text).with_context(|| format!("bad {}", path.display()))?;
    let completeness =
        if manifest.complete { "" } else { " (incomplete: some tests did not compile)" };
    eprintln!("bundle: built from {}{completeness}", manifest.source);
    let binaries = manifest
        .binaries
        .into_iter()
        .map(|b| TestBinary { exe: dir.join(&b.exe), manifest_dir: dir.join(&b.manifest_dir), ..b })
        .collect();
    let fdl = manifest.fdl.map(|fdl| dir.join(fdl)).filter(|fdl| fdl.exists());
    Ok(TestBuild { binaries, complete: manifest.complete, fdl })
}

/// Whether an external tool works here (tried on first use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    Untried,
    Works,
    Unavailable,
}

impl Tool {
    /// Runs `program args path` unless it already failed once; records whether it worked.
    fn apply(&mut self, program: &str, args: &[&str], path: &Path) -> bool {
        if *self == Tool::Unavailable {
            return false;
        }
        let worked = Command::new(program)
            .args(args)
            .arg(path)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !worked {
            eprintln!(
                "bundle: warning: `{program}` failed on {}; going on without it",
                path.display()
            );
        }
        *self = if worked { Tool::Works } else { Tool::Unavailable };
        worked
    }
}

/// Copies binaries into the bundle, stripped (`strip --strip-all`) and gzipped (`gzip -9`) when
/// those tools work; run.sh unpacks them.
#[derive(Debug, Clone, Copy)]
struct Packer {
    strip: Tool,
    gzip: Tool,
}

impl Packer {
    fn new() -> Packer {
        Packer { strip: Tool::Untried, gzip: Tool::Untried }
    }

    /// Copies `from` to `to` (or `to.gz`).
    fn pack(&mut self, from: &Path, to: &Path) -> Result<()> {
        fs::copy(from, to).with_context(|| format!("cannot copy {}", from.display()))?;
        self.strip.apply("strip", &["--strip-all"], to);
        self.gzip.apply("gzip", &["-9", "-n", "-f"], to);
        Ok(())
    }

    fn describe(self) -> String {
        let said = |tool: Tool, yes: &str, no: &str| {
            if tool == Tool::Works { yes } else { no }.to_string()
        };
        format!(
            "{}, {}",
            said(self.strip, "stripped", "not stripped"),
            said(self.gzip, "gzipped", "not compressed")
        )
    }
}

fn make_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut permissions = fs::metadata(path)?.permissions();
    permissions.set_mode(0o755);
    fs::set_permissions(path, permissions)?;
    Ok(())
}

fn folder_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            total += folder_size(&entry.path())?;
        } else if kind.is_file() {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

fn git_describe() -> String {
    Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .current_dir(workspace::root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string())
}

/// The bundle's run.sh: finds the CUDA libraries, exports the environment, runs the matrix.
pub(crate) fn run_script() -> String {
    r#"#!/usr/bin/env bash
# flodl GPU test bundle, made by `cargo xtask gpu-test --bundle`: runs the GPU test matrix on a
# machine with no Rust toolchain.
#
#   ./run.sh                 every case and fdl job the visible GPUs allow, with
#                            FLODL_REQUIRE_GPU=1: a row needing more GPUs than are visible is
#                            "not run" and fails; without a GPU every row is "not run" and it
#                            exits 77 (nothing was tested)
#   ./run.sh --allow-no-gpu  with no GPU, run the CPU cases instead
#   ./run.sh --gpus N        take N GPUs as visible (also: --cases-only, --timeout SECS)
#
# Results (matrix.txt, matrix.json, matrix.log, run.log, and the fdl jobs' run directories under
# jobs/) go to $OUT when set, else ./out. The matrix is printed as a table at the end.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-$here/out}"
mkdir -p "$out"

# The binaries travel gzipped; unpack them once, in place.
for packed in "$here"/bin/*.gz; do
    [ -e "$packed" ] || continue
    gzip -dc "$packed" >"${packed%.gz}" && chmod +x "${packed%.gz}" && rm -f "$packed" || {
        echo "run.sh: cannot unpack $packed (is the bundle folder writable?)" >&2
        exit 1
    }
done

# flodl finds NVRTC, cuBLAS (CUDA 13 or 12) and NCCL in the folders FLODL_CUDA_LIB_DIR names
# (each folder and its */lib subfolders), then on the loader path; cudarc loads the driver
# (libcuda.so.1) from the loader path. Python wheels (site-packages/nvidia/*/lib: the cu13 and
# cu12 runtime, cuBLAS and NCCL packages) and toolkit folders are found here and named there.
add_dir() { # add_dir VAR DIR: appends DIR to the :-list in VAR unless already there
    local current="${!1:-}"
    case ":$current:" in *":$2:"*) ;; *) printf -v "$1" '%s' "${current:+$current:}$2" ;; esac
}
cuda_dirs="${FLODL_CUDA_LIB_DIR:-}"
for py in python3 python; do
    command -v "$py" >/dev/null 2>&1 || continue
    while IFS= read -r sp; do
        [ -d "$sp/nvidia" ] || continue
        for lib in "$sp"/nvidia/*/lib; do
            [ -d "$lib" ] && add_dir cuda_dirs "$lib"
        done
    done < <("$py" -c 'import site, sys
paths = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()] + sys.path
print("\n".join(p for p in paths if p))' 2>/dev/null)
done
found="$(find / \( -path /proc -o -path /sys -o -path /dev -o -path "$here" \) -prune -o \
    \( -name 'libcuda.so.1' -o -name 'libnccl.so.2' -o -name 'libnvrtc.so.1[23]' \
       -o -name 'libcublas.so.1[23]' \) -print 2>/dev/null | grep -v -e '/stubs/' -e '/compat/')"
while IFS= read -r f; do
    [ -n "$f" ] && add_dir cuda_dirs "$(dirname "$f")"
done < <(printf '%s\n' "$found" | grep -v '/libcuda\.so\.1$')
if [ -n "$cuda_dirs" ]; then export FLODL_CUDA_LIB_DIR="$cuda_dirs"; fi
echo "run.sh: FLODL_CUDA_LIB_DIR=${FLODL_CUDA_LIB_DIR:-}"
# The newest NCCL found, unless the caller named one.
if [ -z "${FLODL_NCCL_LIB:-}" ]; then
    nccl="$(printf '%s\n' "$found" | grep '/libnccl\.so\.2$' | while IFS= read -r f; do
        printf '%s\t%s\n' "$(readlink -f "$f")" "$f"; done | sort -V | tail -n 1 | cut -f 2)"
    if [ -n "$nccl" ]; then export FLODL_NCCL_LIB="$nccl"; fi
fi
echo "run.sh: FLODL_NCCL_LIB=${FLODL_NCCL_LIB:-(not found)}"
# The driver: on the loader path already, or its folder added.
driver="$(printf '%s\n' "$found" | grep '/libcuda\.so\.1$' | head -n 1)"
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' && [ -n "$driver" ]; then
    export LD_LIBRARY_PATH="$(dirname "$driver")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "run.sh: LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

# Tests find the vendored MNIST here; each binary runs from its package's folder in the bundle.
export FLODL_MNIST_DIR="${FLODL_MNIST_DIR:-$here/data/mnist}"
case " $* " in
    *" --allow-no-gpu "*) ;;
    *) export FLODL_REQUIRE_GPU=1 ;;
esac
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; fi

"$here/bin/xtask" run-bundle --bundle "$here" --out "$out" "$@" 2>&1 | tee "$out/run.log"
status="${PIPESTATUS[0]}"
# The matrix as a table, last, whatever happened above (xtask wrote it to matrix.txt).
if [ -f "$out/matrix.txt" ]; then
    echo
    echo "== the matrix (also in $out/matrix.txt)"
    cat "$out/matrix.txt"
else
    echo "run.sh: no matrix was written (xtask exited $status before running it)"
fi | tee -a "$out/run.log"
exit "$status"
"#
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_script_is_valid_bash_that_sets_up_and_runs_the_matrix() -> Result<()> {
        let script = run_script();
        assert!(script.starts_with("#!/usr/bin/env bash\n"));
        for want in [
            "gzip -dc",
            "-name 'libnccl.so.2'",
            "-name 'libnvrtc.so.1[23]'",
            "-name 'libcublas.so.1[23]'",
            "-name 'libcuda.so.1'",
            "\"$sp\"/nvidia/*/lib",
            "export FLODL_CUDA_LIB_DIR=",
            "export FLODL_NCCL_LIB=",
            "export LD_LIBRARY_PATH=",
            "export FLODL_MNIST_DIR=",
            "export FLODL_REQUIRE_GPU=1",
            "${OUT:-$here/out}",
            "bin/xtask\" run-bundle --bundle \"$here\" --out \"$out\" \"$@\"",
            "cat \"$out/matrix.txt\"",
            "exit \"$status\"",
        ] {
            assert!(script.contains(want), "run.sh lacks {want}");
        }
        let path = env::temp_dir().join(format!("flodl-xtask-run-{}.sh", std::process::id()));
        fs::write(&path, &script)?;
        let checked = Command::new("bash").arg("-n").arg(&path).output();
        fs::remove_file(&path)?;
        let checked = checked?;
        assert!(checked.status.success(), "bash -n: {}", String::from_utf8_lossy(&checked.stderr));
        Ok(())
    }

    #[test]
    fn manifest_paths_are_relative_and_load_absolute() -> Result<()> {
        let dir = env::temp_dir().join(format!("flodl-xtask-bundle-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let binary = TestBinary {
            package: "flodl-nccl".into(),
            target: "nccl".into(),
            kind: "test".into(),
            exe: PathBuf::from("bin/flodl-nccl.test.nccl"),
            manifest_dir: PathBuf::from("flodl-nccl"),
        };
        let manifest = BundleManifest {
            source: "abc123".into(),
            complete: true,
            binaries: vec![binary.clone()],
            fdl: Some(PathBuf::from("bin/fdl")),
        };
        fs::write(dir.join(MANIFEST), serde_json::to_string(&manifest)?)?;
        let loaded = load(&dir);
        let canonical = dir.canonicalize();
        fs::remove_dir_all(&dir)?;
        let (loaded, canonical) = (loaded?, canonical?);
        assert_eq!(loaded.fdl, None, "an fdl the bundle does not hold is not offered");
        let loaded = loaded.binaries;
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].exe, canonical.join("bin/flodl-nccl.test.nccl"));
        assert_eq!(loaded[0].manifest_dir, canonical.join("flodl-nccl"));
        assert_eq!(loaded[0].id(), binary.id());
        Ok(())
    }
}

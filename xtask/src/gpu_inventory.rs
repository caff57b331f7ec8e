//! Which GPUs this machine shows: nvidia-smi, the CUDA driver library, `CUDA_VISIBLE_DEVICES`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

/// Folders where a driver's `libcuda.so.1` usually lives, besides `ldconfig`'s cache.
const DRIVER_DIRS: [&str; 5] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/local/nvidia/lib64",
    "/usr/lib/wsl/lib",
    "/usr/lib/aarch64-linux-gnu",
];

/// The GPUs this run will use, and how we know.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct GpuInventory {
    /// How many GPUs the matrix may use.
    pub(crate) count: usize,
    /// Their names, as nvidia-smi reports them (empty when it is absent).
    pub(crate) names: Vec<String>,
    /// The CUDA driver library found on the loader path, if any.
    pub(crate) driver_library: Option<PathBuf>,
    /// One line per fact that led to `count`.
    pub(crate) evidence: Vec<String>,
}

/// What the probes saw, before deciding on a count.
#[derive(Debug, Clone, Default)]
pub(crate) struct Probes {
    /// `Some(names)` when nvidia-smi ran, `None` when it is absent or failed.
    pub(crate) smi_names: Option<Vec<String>>,
    /// Where `libcuda.so.1` is, if anywhere.
    pub(crate) driver_library: Option<PathBuf>,
    /// The value of `CUDA_VISIBLE_DEVICES`, if set.
    pub(crate) visible_devices: Option<String>,
    /// A count given on the command line (`--gpus`).
    pub(crate) forced: Option<usize>,
}

impl GpuInventory {
    /// Probes this machine (nvidia-smi, ldconfig, driver folders, `CUDA_VISIBLE_DEVICES`).
    pub(crate) fn detect(forced: Option<usize>) -> GpuInventory {
        let probes = Probes {
            smi_names: nvidia_smi_names(),
            driver_library: find_driver_library(),
            visible_devices: env::var("CUDA_VISIBLE_DEVICES").ok(),
            forced,
        };
        GpuInventory::from_probes(probes)
    }

    /// Decides the count from what the probes saw.
    pub(crate) fn from_probes(probes: Probes) -> GpuInventory {
        let mut evidence = Vec::new();
        match &probes.smi_names {
            Some(names) => evidence.push(format!("nvidia-smi lists {} GPU(s)", names.len())),
            None => evidence.push("nvidia-smi: not found or failed".to_string()),
        }
        match &probes.driver_library {
            Some(path) => evidence.push(format!("driver library: {}", path.display())),
            None => {
                evidence.push("driver library libcuda.so.1: not on the loader path".to_string())
            }
        }
        let mut count = match (&probes.smi_names, &probes.driver_library) {
            (Some(names), _) => names.len(),
            (None, Some(_)) => {
                evidence.push("assuming 1 GPU without nvidia-smi (use --gpus N)".to_string());
                1
            }
            (None, None) => 0,
        };
        if let Some(value) = &probes.visible_devices {
            let visible = visible_device_count(value);
            evidence.push(format!("CUDA_VISIBLE_DEVICES={value:?} allows {visible}"));
            count = count.min(visible);
        }
        if let Some(forced) = probes.forced {
            evidence.push(format!("--gpus {forced} overrides the detected {count}"));
            count = forced;
        }
        GpuInventory {
            count,
            names: probes.smi_names.unwrap_or_default(),
            driver_library: probes.driver_library,
            evidence,
        }
    }
}

/// The number of devices a `CUDA_VISIBLE_DEVICES` value allows (CUDA stops at the first invalid
/// entry; an empty value or `-1` hides every device).
pub(crate) fn visible_device_count(value: &str) -> usize {
    let value = value.trim();
    if value.is_empty() {
        return 0;
    }
    value
        .split(',')
        .map(str::trim)
        .take_while(|item| {
            let numeric = item.parse::<i64>().map(|n| n >= 0).unwrap_or(false);
            numeric || item.starts_with("GPU-") || item.starts_with("MIG-")
        })
        .count()
}

/// GPU names from `nvidia-smi --query-gpu=name --format=csv,noheader` output.
pub(crate) fn parse_smi_names(output: &str) -> Vec<String> {
    output.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect()
}

/// The path `ldconfig -p` gives for `name`, if any.
pub(crate) fn parse_ldconfig(output: &str, name: &str) -> Option<PathBuf> {
    output.lines().find_map(|line| {
        let (left, path) = line.split_once("=>")?;
        (left.split_whitespace().next() == Some(name)).then(|| PathBuf::from(path.trim()))
    })
}

fn nvidia_smi_names() -> Option<Vec<String>> {
    let output = Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .output()
        .ok()?;
    output.status.success().then(|| parse_smi_names(&String::from_utf8_lossy(&output.stdout)))
}

fn find_driver_library() -> Option<PathBuf> {
    const NAME: &str = "libcuda.so.1";
    let from_ldconfig = ["ldconfig", "/sbin/ldconfig"].iter().find_map(|program| {
        let output = Command::new(program).arg("-p").output().ok()?;
        parse_ldconfig(&String::from_utf8_lossy(&output.stdout), NAME)
    });
    if from_ldconfig.is_some() {
        return from_ldconfig;
    }
    let library_path = env::var("LD_LIBRARY_PATH").unwrap_or_default();
    library_path
        .split(':')
        .filter(|dir| !dir.is_empty())
        .chain(DRIVER_DIRS)
        .map(|dir| Path::new(dir).join(NAME))
        .find(|path| path.exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_devices_count_until_the_first_invalid_entry() {
        let cases = [
            ("", 0),
            ("-1", 0),
            ("0", 1),
            ("0,1", 2),
            ("1, 3 ,2", 3),
            ("0,-1,2", 1),
            ("GPU-8d6f,GPU-1a2b", 2),
            ("MIG-abc", 1),
            ("NoDevFiles", 0),
        ];
        for (value, want) in cases {
            assert_eq!(visible_device_count(value), want, "{value:?}");
        }
    }

    #[test]
    fn smi_and_ldconfig_outputs_parse() {
        let smi = "NVIDIA H200\nNVIDIA H200\n\n";
        assert_eq!(parse_smi_names(smi), vec!["NVIDIA H200", "NVIDIA H200"]);
        assert!(parse_smi_names("").is_empty());
        let ldconfig = "\
1024 libs found in cache `/etc/ld.so.cache'
\tlibcudart.so.12 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudart.so.12
\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
\tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so
";
        assert_eq!(
            parse_ldconfig(ldconfig, "libcuda.so.1"),
            Some(PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1"))
        );
        assert_eq!(parse_ldconfig(ldconfig, "libnccl.so.2"), None);
    }

    #[test]
    fn count_follows_smi_then_driver_then_visibility_then_override() {
        let driver = Some(PathBuf::from("/usr/lib/libcuda.so.1"));
        let two = Some(vec!["A".to_string(), "B".to_string()]);
        let cases = [
            (Probes::default(), 0),
            (Probes { driver_library: driver.clone(), ..Probes::default() }, 1),
            (
                Probes {
                    smi_names: two.clone(),
                    driver_library: driver.clone(),
                    ..Probes::default()
                },
                2,
            ),
            (
                Probes {
                    smi_names: Some(Vec::new()),
                    driver_library: driver.clone(),
                    ..Probes::default()
                },
                0,
            ),
            (
                Probes {
                    smi_names: two.clone(),
                    visible_devices: Some("1".into()),
                    ..Probes::default()
                },
                1,
            ),
            (
                Probes {
                    smi_names: two.clone(),
                    visible_devices: Some("0,1,2".into()),
                    ..Probes::default()
                },
                2,
            ),
            (Probes { forced: Some(4), ..Probes::default() }, 4),
            (Probes { smi_names: two, forced: Some(0), ..Probes::default() }, 0),
        ];
        for (probes, want) in cases {
            let inventory = GpuInventory::from_probes(probes.clone());
            assert_eq!(inventory.count, want, "{probes:?} -> {:?}", inventory.evidence);
            assert!(!inventory.evidence.is_empty());
        }
    }
}

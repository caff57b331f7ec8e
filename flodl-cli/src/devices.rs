//! `fdl devices`: the device table.

use std::fmt::Write as _;

use flodl_tensor::{DeviceDetails, DeviceInfo, LibraryReport, LibraryStatus};

/// Prints every device of this machine, one line each, then the CUDA libraries found.
pub(crate) fn run() {
    print!("{}", table(&flodl_tensor::devices()));
    if let Some(reason) = flodl_tensor::gpu_skip_reason() {
        println!("no GPU: {reason}");
    }
    let mut libraries = flodl_tensor::cuda_libraries();
    libraries.push(nccl());
    print!("\n{}", library_table(&libraries));
}

/// NCCL as this process loads it.
fn nccl() -> LibraryReport {
    #[cfg(feature = "cuda")]
    let status = match flodl_nccl::nccl_library() {
        Ok((path, version)) => LibraryStatus::Found { path, version: version.to_string() },
        Err(e) => LibraryStatus::Missing { reason: e.to_string() },
    };
    #[cfg(not(feature = "cuda"))]
    let status =
        LibraryStatus::Missing { reason: "flodl was built without the cuda feature".into() };
    LibraryReport { name: "NCCL", status }
}

/// The libraries as text: a header, then one line each with its version and file, or `-` and
/// why it is missing.
pub(crate) fn library_table(libraries: &[LibraryReport]) -> String {
    let mut out = String::new();
    let name_w = libraries.iter().map(|l| l.name.len()).max().unwrap_or(7).max(7);
    let _ = writeln!(out, "{:<name_w$} {:<10} FROM", "LIBRARY", "VERSION");
    for l in libraries {
        let (version, from) = match &l.status {
            LibraryStatus::Found { path, version } => (version.as_str(), path.as_str()),
            LibraryStatus::Missing { reason } => ("-", reason.as_str()),
        };
        let _ = writeln!(out, "{:<name_w$} {version:<10} {from}", l.name);
    }
    out
}

/// The device table as text (a header and one line per device).
pub(crate) fn table(devices: &[DeviceInfo]) -> String {
    let mut out = String::new();
    let name_w = devices.iter().map(|d| d.name.chars().count()).max().unwrap_or(4).max(4);
    let _ = writeln!(
        out,
        "{:<8} {:<name_w$} {:>10} {:>10}  DETAILS",
        "DEVICE", "NAME", "TOTAL", "FREE"
    );
    for d in devices {
        let details = match d.details {
            DeviceDetails::Cpu { cores } => format!("{cores} cores"),
            DeviceDetails::Cuda { compute_capability: (major, minor), sm_count } => {
                format!("compute capability {major}.{minor}, {sm_count} SMs")
            }
        };
        let _ = writeln!(
            out,
            "{:<8} {:<name_w$} {:>10} {:>10}  {details}",
            d.device.to_string(),
            d.name,
            gib(d.total_memory),
            gib(d.free_memory)
        );
    }
    out
}

/// Bytes as GiB with one decimal, or `?` when unknown (0).
fn gib(bytes: u64) -> String {
    if bytes == 0 {
        "?".to_owned()
    } else {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flodl_tensor::Device;

    #[test]
    fn library_table_gives_each_library_its_version_and_file_or_why_not() {
        let found = |path: &str, version: &str| LibraryStatus::Found {
            path: path.into(),
            version: version.into(),
        };
        let libraries = [
            LibraryReport { name: "CUDA driver", status: found("/usr/lib/libcuda.so.580", "13.0") },
            LibraryReport {
                name: "NVRTC",
                status: found("/sp/nvidia/cu13/lib/libnvrtc.so.13", "13.0"),
            },
            LibraryReport {
                name: "cuBLAS",
                status: LibraryStatus::Missing { reason: "cuBLAS not found".into() },
            },
        ];
        let text = library_table(&libraries);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        let cases = [
            (1, ["CUDA driver", "13.0", "/usr/lib/libcuda.so.580"]),
            (2, ["NVRTC", "13.0", "/sp/nvidia/cu13/lib/libnvrtc.so.13"]),
            (3, ["cuBLAS", " - ", "cuBLAS not found"]),
        ];
        for (line, parts) in cases {
            for part in parts {
                assert!(lines[line].contains(part), "line {line} lacks {part:?}: {}", lines[line]);
            }
        }
    }

    #[test]
    fn table_lists_each_device_with_memory_and_capability() {
        let devices = [
            DeviceInfo {
                device: Device::Cpu,
                name: "Some CPU".into(),
                total_memory: 24 << 30,
                free_memory: 0,
                details: DeviceDetails::Cpu { cores: 2 },
            },
            DeviceInfo {
                device: Device::Cuda(0),
                name: "Some GPU".into(),
                total_memory: 16 << 30,
                free_memory: 15 << 30,
                details: DeviceDetails::Cuda { compute_capability: (12, 0), sm_count: 36 },
            },
        ];
        let text = table(&devices);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[1].starts_with("cpu") && lines[1].contains("24.0 GiB") && lines[1].contains(" ?")
        );
        assert!(lines[2].starts_with("cuda:0") && lines[2].contains("compute capability 12.0"));
        assert!(lines[2].contains("15.0 GiB"));
    }
}

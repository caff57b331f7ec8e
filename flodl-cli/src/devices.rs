//! `fdl devices`: the device table.

use std::fmt::Write as _;

use flodl_tensor::{DeviceDetails, DeviceInfo};

/// Prints every device of this machine, one line each.
pub(crate) fn run() {
    print!("{}", table(&flodl_tensor::devices()));
    if let Some(reason) = flodl_tensor::gpu_skip_reason() {
        println!("no GPU: {reason}");
    }
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

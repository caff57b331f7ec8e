//! Devices and device discovery.

use std::fmt;
use std::str::FromStr;

use crate::{Error, cuda};

/// Where a tensor lives and a stream runs: host memory or one CUDA device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// Host memory; kernels run on the calling thread (plus the stream's worker threads).
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

impl Device {
    /// Whether this is the host.
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// Whether this is a CUDA device.
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    /// Parses `cpu`, `cuda` (meaning `cuda:0`) or `cuda:N`.
    fn from_str(s: &str) -> Result<Self, Error> {
        let t = s.trim();
        match t {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => t
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .map(Device::Cuda)
                .ok_or_else(|| Error::ParseDevice(s.to_owned())),
        }
    }
}

/// What kind of device a [`DeviceInfo`] describes, with the facts specific to that kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceDetails {
    /// The host.
    Cpu {
        /// Hardware threads available to this process.
        cores: usize,
    },
    /// A CUDA GPU.
    Cuda {
        /// Compute capability (major, minor).
        compute_capability: (i32, i32),
        /// Number of streaming multiprocessors.
        sm_count: u32,
    },
}

/// One device found by [`devices`]: its name and memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device.
    pub device: Device,
    /// Marketing name (CPU model name, GPU name).
    pub name: String,
    /// Total memory in bytes (RAM for the CPU, VRAM for a GPU); 0 when unknown.
    pub total_memory: u64,
    /// Free memory in bytes at the time of the query; 0 when unknown.
    pub free_memory: u64,
    /// Kind-specific facts.
    pub details: DeviceDetails,
}

/// Lists the devices of this machine: the CPU first, then every CUDA device a driver reports.
///
/// Never fails: without a CUDA library, driver or device the list holds only the CPU.
pub fn devices() -> Vec<DeviceInfo> {
    let mut list = vec![cpu_info()];
    list.extend(cuda::device_infos());
    list
}

/// Number of usable CUDA devices: 0 without the library, a driver or the `cuda` feature. Never panics.
pub fn cuda_device_count() -> usize {
    cuda::device_count()
}

/// Why CUDA cannot be used here, or `None` when at least one CUDA device is usable.
pub fn gpu_skip_reason() -> Option<String> {
    cuda::unavailable_reason()
}

fn cpu_info() -> DeviceInfo {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let name = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "cpu".to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |key: &str| -> u64 {
        meminfo
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    DeviceInfo {
        device: Device::Cpu,
        name,
        total_memory: field("MemTotal:"),
        free_memory: field("MemAvailable:"),
        details: DeviceDetails::Cpu { cores },
    }
}

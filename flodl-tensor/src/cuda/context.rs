//! Driver probing and the per-device state (primary context, compiled kernels), created once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, sys};

use super::cuda_err;
use super::kernels::Kernels;
use crate::{Device, DeviceDetails, DeviceInfo, Error, Result};

/// What probing the driver found; probed once per process (a driver does not come and go).
#[derive(Debug)]
enum Probe {
    Usable(usize),
    Unusable(String),
}

fn probe() -> &'static Probe {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    PROBE.get_or_init(|| {
        // SAFETY: only tries to load the library; it neither panics nor touches CUDA state.
        if !unsafe { sys::is_culib_present() } {
            return Probe::Unusable("the CUDA driver library (libcuda) is not installed".into());
        }
        match CudaContext::device_count() {
            Ok(n) if n > 0 => Probe::Usable(n as usize),
            Ok(_) => Probe::Unusable("the CUDA driver reports no device".into()),
            Err(e) => Probe::Unusable(format!("the CUDA driver failed to initialise: {e}")),
        }
    })
}

/// The CUDA version the driver supports (`cuDriverGetVersion`, e.g. (13, 0)), or `None` without
/// a driver library. Asked once per process.
pub(crate) fn driver_version() -> Option<(u32, u32)> {
    static VERSION: OnceLock<Option<(u32, u32)>> = OnceLock::new();
    *VERSION.get_or_init(|| {
        // SAFETY: only tries to load the library; it neither panics nor touches CUDA state.
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        let mut v: std::ffi::c_int = 0;
        // SAFETY: the driver library is present (checked above), so the symbol loads; the
        // call writes one int and needs no `cuInit`.
        let r = unsafe { sys::cuDriverGetVersion(&mut v) };
        let v = u32::try_from(v).ok().filter(|_| r == sys::cudaError_enum::CUDA_SUCCESS)?;
        Some((v / 1000, (v % 1000) / 10))
    })
}

pub(crate) fn device_count() -> usize {
    match probe() {
        Probe::Usable(n) => *n,
        Probe::Unusable(_) => 0,
    }
}

pub(crate) fn unavailable_reason() -> Option<String> {
    match probe() {
        Probe::Usable(_) => None,
        Probe::Unusable(reason) => Some(reason.clone()),
    }
}

/// One CUDA device as this process uses it: its primary context and its kernels.
pub(crate) struct DeviceState {
    pub(crate) ctx: Arc<CudaContext>,
    // Compiled on first kernel launch, so memory-only use needs no NVRTC.
    kernels: Mutex<Option<Arc<Kernels>>>,
}

impl std::fmt::Debug for DeviceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceState").field("ordinal", &self.ctx.ordinal()).finish_non_exhaustive()
    }
}

impl DeviceState {
    /// The device's kernels, compiled with NVRTC on first use and cached for the process.
    pub(crate) fn kernels(&self) -> Result<Arc<Kernels>> {
        let mut slot = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = slot.as_ref() {
            return Ok(k.clone());
        }
        let k = Arc::new(Kernels::compile(&self.ctx)?);
        tracing::info!(ordinal = self.ctx.ordinal(), image = ?k.image(), "flodl kernels ready");
        *slot = Some(k.clone());
        Ok(k)
    }
}

/// The state of `cuda:ordinal`, created on first use.
///
/// # Errors
/// [`Error::CudaUnavailable`], [`Error::NoSuchDevice`], or a driver error creating the context.
pub(crate) fn device(ordinal: usize) -> Result<Arc<DeviceState>> {
    let count = match probe() {
        Probe::Usable(n) => *n,
        Probe::Unusable(reason) => return Err(Error::CudaUnavailable { reason: reason.clone() }),
    };
    if ordinal >= count {
        return Err(Error::NoSuchDevice { ordinal, count });
    }
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<DeviceState>>>> = OnceLock::new();
    let mut map = DEVICES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let ctx = CudaContext::new(ordinal).map_err(cuda_err("context create"))?;
    let d = Arc::new(DeviceState { ctx, kernels: Mutex::new(None) });
    map.insert(ordinal, d.clone());
    Ok(d)
}

fn info(ordinal: usize) -> Result<DeviceInfo> {
    let ctx = &device(ordinal)?.ctx;
    let e = cuda_err("device query");
    let (free, total) = ctx.mem_get_info().map_err(&e)?;
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(&e)?;
    Ok(DeviceInfo {
        device: Device::Cuda(ordinal),
        name: ctx.name().map_err(&e)?,
        total_memory: total as u64,
        free_memory: free as u64,
        details: DeviceDetails::Cuda {
            compute_capability: ctx.compute_capability().map_err(&e)?,
            sm_count: u32::try_from(sms).unwrap_or(0),
        },
    })
}

/// One entry per CUDA device that answers; a device whose query fails is logged and left out.
pub(crate) fn device_infos() -> Vec<DeviceInfo> {
    (0..device_count())
        .filter_map(|i| {
            info(i).map_err(|e| tracing::warn!("cuda:{i} left out of the device list: {e}")).ok()
        })
        .collect()
}

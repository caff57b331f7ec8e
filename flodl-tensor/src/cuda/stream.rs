//! A CUDA stream with the device it belongs to and its cuBLAS handle.

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaStream as RawStream;

use super::context::{self, DeviceState};
use super::cublas::BlasHandle;
use super::{CudaEvent, cuda_err};
use crate::Result;

/// A non-blocking CUDA stream; clones share it.
#[derive(Clone)]
pub(crate) struct CudaStream(Arc<StreamState>);

struct StreamState {
    // Created on the first gemm: a cuBLAS handle bound to this stream. Declared first so it is
    // dropped before the stream it is bound to.
    blas: Mutex<Option<Arc<BlasHandle>>>,
    dev: Arc<DeviceState>,
    raw: Arc<RawStream>,
}

impl std::fmt::Debug for CudaStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaStream").field("ordinal", &self.ordinal()).finish_non_exhaustive()
    }
}

impl CudaStream {
    pub(crate) fn new(ordinal: usize) -> Result<CudaStream> {
        let dev = context::device(ordinal)?;
        let raw = dev.ctx.new_stream().map_err(cuda_err("stream create"))?;
        Ok(CudaStream(Arc::new(StreamState { dev, raw, blas: Mutex::new(None) })))
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.0.dev.ctx.ordinal()
    }

    pub(crate) fn raw(&self) -> &Arc<RawStream> {
        &self.0.raw
    }

    /// The `CUstream` handle, for work issued outside cudarc (NCCL).
    pub(crate) fn handle(&self) -> *mut std::ffi::c_void {
        self.0.raw.cu_stream().cast()
    }

    pub(crate) fn device(&self) -> &DeviceState {
        &self.0.dev
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.0.raw.synchronize().map_err(cuda_err("stream synchronize"))
    }

    pub(crate) fn wait_event(&self, e: &CudaEvent) -> Result<()> {
        self.0.raw.wait(e.raw()).map_err(cuda_err("stream wait event"))
    }

    /// This stream's cuBLAS handle, created on first use.
    pub(crate) fn blas(&self) -> Result<Arc<BlasHandle>> {
        let mut slot = self.0.blas.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = slot.as_ref() {
            return Ok(b.clone());
        }
        self.0.dev.ctx.bind_to_thread().map_err(cuda_err("cublas create"))?;
        // SAFETY: the handle is this stream's live `CUstream`, whose context was just made
        // current; the handle is kept in this stream's state and dropped before the stream.
        let b = Arc::new(unsafe { BlasHandle::new(self.handle()) }?);
        *slot = Some(b.clone());
        Ok(b)
    }
}

//! A CUDA event, with timing enabled only when elapsed time will be read.

use cudarc::driver::{CudaEvent as RawEvent, sys};

use super::{CudaStream, context, cuda_err};
use crate::Result;

/// A CUDA event on one device; created with timing disabled unless it is to be measured.
#[derive(Debug)]
pub(crate) struct CudaEvent {
    ordinal: usize,
    raw: RawEvent,
}

impl CudaEvent {
    pub(crate) fn new(ordinal: usize, timed: bool) -> Result<CudaEvent> {
        let dev = context::device(ordinal)?;
        let flags = if timed {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let raw = dev.ctx.new_event(Some(flags)).map_err(cuda_err("event create"))?;
        Ok(CudaEvent { ordinal, raw })
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub(crate) fn raw(&self) -> &RawEvent {
        &self.raw
    }

    pub(crate) fn record(&self, s: &CudaStream) -> Result<()> {
        self.raw.record(s.raw()).map_err(cuda_err("event record"))
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.raw.synchronize().map_err(cuda_err("event synchronize"))
    }

    pub(crate) fn elapsed_ms(&self, end: &CudaEvent) -> Result<f32> {
        self.raw.elapsed_ms(&end.raw).map_err(cuda_err("event elapsed"))
    }
}

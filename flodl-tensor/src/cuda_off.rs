//! The CUDA backend's stand-in when the `cuda` feature is off: the same names, no values.
//!
//! Every type here is uninhabited, so code matching on a CUDA variant compiles and can never run;
//! the constructors return [`Error::CudaNotCompiled`].

use std::convert::Infallible;
use std::marker::PhantomData;

use crate::cpu::CpuStorage;
use crate::cpu::linalg::GemmShape;
use crate::cpu::optim::{Adam, Sgd};
use crate::{DType, DeviceInfo, Element, Error, Result};

pub(crate) fn device_count() -> usize {
    0
}

pub(crate) fn unavailable_reason() -> Option<String> {
    Some("flodl-tensor was built without the `cuda` feature".to_owned())
}

pub(crate) fn device_infos() -> Vec<DeviceInfo> {
    Vec::new()
}

#[derive(Debug, Clone)]
pub(crate) enum CudaStream {}

/// Stands in for the record a CUDA device address drops; never built.
pub(crate) type WriteRecord<'a> = PhantomData<&'a ()>;

impl CudaStream {
    pub(crate) fn new(_ordinal: usize) -> Result<CudaStream> {
        Err(Error::CudaNotCompiled)
    }
    pub(crate) fn handle(&self) -> *mut std::ffi::c_void {
        match *self {}
    }
    pub(crate) fn ordinal(&self) -> usize {
        match *self {}
    }
    pub(crate) fn synchronize(&self) -> Result<()> {
        match *self {}
    }
    pub(crate) fn wait_event(&self, _e: &CudaEvent) -> Result<()> {
        match *self {}
    }
}

#[derive(Debug)]
pub(crate) enum CudaEvent {}

impl CudaEvent {
    pub(crate) fn new(_ordinal: usize, _timed: bool) -> Result<CudaEvent> {
        Err(Error::CudaNotCompiled)
    }
    pub(crate) fn ordinal(&self) -> usize {
        match *self {}
    }
    pub(crate) fn record(&self, _s: &CudaStream) -> Result<()> {
        match *self {}
    }
    pub(crate) fn synchronize(&self) -> Result<()> {
        match *self {}
    }
    pub(crate) fn elapsed_ms(&self, _end: &CudaEvent) -> Result<f32> {
        match *self {}
    }
}

#[derive(Debug)]
pub(crate) struct PinnedHost<T>(Infallible, PhantomData<T>);

impl<T: Element> PinnedHost<T> {
    pub(crate) fn new(_n: usize, _ordinal: usize) -> Result<PinnedHost<T>> {
        Err(Error::CudaNotCompiled)
    }
    pub(crate) fn ordinal(&self) -> usize {
        match self.0 {}
    }
    pub(crate) fn len(&self) -> usize {
        match self.0 {}
    }
    pub(crate) fn as_slice(&self) -> Result<&[T]> {
        match self.0 {}
    }
    pub(crate) fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        match self.0 {}
    }
}

#[derive(Debug)]
pub(crate) enum CudaStorage {}

impl CudaStorage {
    pub(crate) fn zeros(_dtype: DType, _n: usize, s: &CudaStream) -> Result<CudaStorage> {
        match *s {}
    }
    pub(crate) fn from_host<T: Element>(_data: &[T], s: &CudaStream) -> Result<CudaStorage> {
        match *s {}
    }
    pub(crate) fn dtype(&self) -> DType {
        match *self {}
    }
    pub(crate) fn ordinal(&self) -> usize {
        match *self {}
    }
    pub(crate) fn copy_to_host<T: Element>(&self, _dst: &mut [T], _s: &CudaStream) -> Result<()> {
        match *self {}
    }
    pub(crate) fn copy_from_host<T: Element>(&mut self, _src: &[T], _s: &CudaStream) -> Result<()> {
        match *self {}
    }
    pub(crate) fn copy_to_pinned<T: Element>(
        &self,
        _dst: &mut PinnedHost<T>,
        _s: &CudaStream,
    ) -> Result<()> {
        match *self {}
    }
    pub(crate) fn copy_from_pinned<T: Element>(
        &mut self,
        _src: &PinnedHost<T>,
        _s: &CudaStream,
    ) -> Result<()> {
        match *self {}
    }
    pub(crate) fn copy_from_cpu(
        &mut self,
        _src: &CpuStorage,
        _s: Option<&CudaStream>,
    ) -> Result<()> {
        match *self {}
    }
    pub(crate) fn copy_to_cpu(&self, _dst: &mut CpuStorage, _s: Option<&CudaStream>) -> Result<()> {
        match *self {}
    }
    pub(crate) fn copy_from_device(&mut self, _src: &CudaStorage, _s: &CudaStream) -> Result<()> {
        match *self {}
    }
    pub(crate) fn try_clone(&self, _s: &CudaStream) -> Result<CudaStorage> {
        match *self {}
    }
    pub(crate) fn device_address<'a>(&'a mut self, _s: &'a CudaStream) -> crate::DeviceAddress<'a> {
        match *self {}
    }
}

/// The CUDA kernels; unreachable without the feature (their stream argument has no values).
pub(crate) mod ops {
    use super::*;

    pub(crate) fn fill(s: &CudaStream, _t: &mut CudaStorage, _v: f32) -> Result<()> {
        match *s {}
    }
    pub(crate) fn scale(s: &CudaStream, _t: &mut CudaStorage, _a: f32) -> Result<()> {
        match *s {}
    }
    pub(crate) fn axpy(
        s: &CudaStream,
        _a: f32,
        _x: &CudaStorage,
        _y: &mut CudaStorage,
    ) -> Result<()> {
        match *s {}
    }
    pub(crate) fn lerp(
        s: &CudaStream,
        _a: &mut CudaStorage,
        _b: &CudaStorage,
        _w: f32,
    ) -> Result<()> {
        match *s {}
    }
    pub(crate) fn weighted_sum(
        s: &CudaStream,
        _inputs: &[&CudaStorage],
        _weights: &[f32],
        _out: &mut CudaStorage,
    ) -> Result<()> {
        match *s {}
    }
    pub(crate) fn dot(s: &CudaStream, _a: &CudaStorage, _b: &CudaStorage) -> Result<f64> {
        match *s {}
    }
    pub(crate) fn sum_sq(s: &CudaStream, _a: &CudaStorage) -> Result<f64> {
        match *s {}
    }
    pub(crate) fn sum_sq_diff(s: &CudaStream, _a: &CudaStorage, _b: &CudaStorage) -> Result<f64> {
        match *s {}
    }
    pub(crate) fn cast(s: &CudaStream, _src: &CudaStorage, _dst: &mut CudaStorage) -> Result<()> {
        match *s {}
    }
    pub(crate) fn gemm(
        s: &CudaStream,
        _g: GemmShape,
        _alpha: f32,
        _a: &CudaStorage,
        _b: &CudaStorage,
        _beta: f32,
        _c: &mut CudaStorage,
    ) -> Result<()> {
        match *s {}
    }
    pub(crate) fn bias_add(
        s: &CudaStream,
        _y: &mut CudaStorage,
        _bias: &CudaStorage,
    ) -> Result<()> {
        match *s {}
    }
    pub(crate) fn sum_rows(s: &CudaStream, _x: &CudaStorage, _out: &mut CudaStorage) -> Result<()> {
        match *s {}
    }
    pub(crate) fn relu(s: &CudaStream, _x: &CudaStorage, _y: &mut CudaStorage) -> Result<()> {
        match *s {}
    }
    pub(crate) fn relu_backward(
        s: &CudaStream,
        _dy: &CudaStorage,
        _y: &CudaStorage,
        _dx: &mut CudaStorage,
    ) -> Result<()> {
        match *s {}
    }
    pub(crate) fn log_softmax_nll(
        s: &CudaStream,
        _logits: &CudaStorage,
        _labels: &CudaStorage,
        _dlogits: &mut CudaStorage,
        _classes: usize,
    ) -> Result<f32> {
        match *s {}
    }
    pub(crate) fn argmax_correct(
        s: &CudaStream,
        _logits: &CudaStorage,
        _labels: &CudaStorage,
        _classes: usize,
    ) -> Result<usize> {
        match *s {}
    }
    pub(crate) fn sgd_step(
        s: &CudaStream,
        _h: Sgd,
        _p: &mut CudaStorage,
        _g: &CudaStorage,
        _buf: &mut CudaStorage,
    ) -> Result<()> {
        match *s {}
    }
    pub(crate) fn adam_step(
        s: &CudaStream,
        _h: Adam,
        _p: &mut CudaStorage,
        _g: &CudaStorage,
        _m: &mut CudaStorage,
        _v: &mut CudaStorage,
    ) -> Result<()> {
        match *s {}
    }
}

/// Without the `cuda` feature nothing is loaded.
pub(crate) fn library_reports() -> Vec<crate::LibraryReport> {
    ["CUDA driver", "NVRTC", "cuBLAS"]
        .into_iter()
        .map(|name| crate::LibraryReport {
            name,
            status: crate::LibraryStatus::Missing {
                reason: "flodl was built without the cuda feature".into(),
            },
        })
        .collect()
}

//! The tensor: a shape, a dtype and contiguous storage on one device.

use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::cpu::{CpuStorage, elementwise};
use crate::pinned::PinnedInner;
use crate::stream::StreamInner;
use crate::{DType, Device, DeviceAddress, Element, Error, PinnedBuffer, Result, Stream, cuda};

/// A dense, contiguous, row-major array of one [`DType`] on one [`Device`].
///
/// Not `Clone`: copying may allocate device memory and fail, so it is [`Tensor::try_clone`].
/// `Debug` shows the shape, dtype and device, never the elements.
pub struct Tensor {
    shape: Vec<usize>,
    storage: Storage,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype())
            .field("device", &self.device())
            .finish()
    }
}

/// Where the elements live.
pub(crate) enum Storage {
    Cpu(CpuStorage),
    Cuda(cuda::CudaStorage),
}

/// Number of elements of `shape` (1 for the empty shape, a scalar).
fn numel_of(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, d| acc.checked_mul(*d))
        .ok_or_else(|| Error::ShapeOverflow { shape: shape.to_vec() })
}

fn check_len(op: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got { Ok(()) } else { Err(Error::LengthMismatch { op, expected, got }) }
}

impl Tensor {
    /// A tensor of zeros on the stream's device.
    ///
    /// # Errors
    /// [`Error::ShapeOverflow`], [`Error::OutOfMemory`], or a CUDA error.
    pub fn zeros(shape: &[usize], dtype: DType, stream: &Stream) -> Result<Tensor> {
        let n = numel_of(shape)?;
        let storage = match stream.inner() {
            StreamInner::Cpu(_) => Storage::Cpu(CpuStorage::zeros(dtype, n)?),
            StreamInner::Cuda(s) => Storage::Cuda(cuda::CudaStorage::zeros(dtype, n, s)?),
        };
        Ok(Tensor { shape: shape.to_vec(), storage })
    }

    /// A tensor holding a copy of `data` (row-major) on the stream's device.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `data` does not hold exactly the shape's element count;
    /// [`Error::OutOfMemory`] or a CUDA error.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], stream: &Stream) -> Result<Tensor> {
        check_len("from_slice", numel_of(shape)?, data.len())?;
        let storage = match stream.inner() {
            StreamInner::Cpu(_) => Storage::Cpu(CpuStorage::from_slice(data)?),
            StreamInner::Cuda(s) => Storage::Cuda(cuda::CudaStorage::from_host(data, s)?),
        };
        Ok(Tensor { shape: shape.to_vec(), storage })
    }

    /// An f32 tensor of values drawn uniformly from `[lo, hi)`, reproducible from `seed`
    /// (the same seed gives the same values on every device).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `lo < hi` and both are finite; allocation errors.
    pub fn rand_uniform(
        shape: &[usize],
        lo: f32,
        hi: f32,
        seed: u64,
        stream: &Stream,
    ) -> Result<Tensor> {
        if !(lo.is_finite() && hi.is_finite() && lo < hi) {
            return Err(Error::InvalidArgument { op: "rand_uniform", what: "need finite lo < hi" });
        }
        let n = numel_of(shape)?;
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let span = hi - lo;
        let data: Vec<f32> =
            (0..n).map(|_| (lo + span * rng.random::<f32>()).min(hi.next_down())).collect();
        Tensor::from_slice(&data, shape, stream)
    }

    /// An f32 tensor of normally distributed values, reproducible from `seed`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `mean` is finite and `std` finite and ≥ 0; allocation
    /// errors.
    pub fn rand_normal(
        shape: &[usize],
        mean: f32,
        std: f32,
        seed: u64,
        stream: &Stream,
    ) -> Result<Tensor> {
        let normal = rand_distr::Normal::new(mean, std)
            .ok()
            .filter(|_| mean.is_finite() && std.is_finite() && std >= 0.0)
            .ok_or(Error::InvalidArgument {
                op: "rand_normal",
                what: "need a finite mean and a finite std >= 0",
            })?;
        let n = numel_of(shape)?;
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let data: Vec<f32> = (0..n).map(|_| rng.sample(normal)).collect();
        Tensor::from_slice(&data, shape, stream)
    }

    /// The shape (row-major dimensions).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match &self.storage {
            Storage::Cpu(s) => s.dtype(),
            Storage::Cuda(s) => s.dtype(),
        }
    }

    /// The device holding the elements.
    pub fn device(&self) -> Device {
        match &self.storage {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(s) => Device::Cuda(s.ordinal()),
        }
    }

    /// Bytes of element storage.
    pub fn size_in_bytes(&self) -> usize {
        self.numel() * self.dtype().size_in_bytes()
    }

    /// The same elements under another shape with the same element count.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the element counts differ.
    pub fn reshape(self, shape: &[usize]) -> Result<Tensor> {
        if numel_of(shape)? != self.numel() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                expected: self.shape.clone(),
                got: shape.to_vec(),
            });
        }
        Ok(Tensor { shape: shape.to_vec(), storage: self.storage })
    }

    /// The elements of a CPU tensor, zero-copy.
    ///
    /// # Errors
    /// [`Error::NotOnCpu`] for device tensors, [`Error::DTypeMismatch`] when `T` is not the dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check_dtype("as_slice", T::DTYPE)?;
        match &self.storage {
            Storage::Cpu(s) => s.as_slice().ok_or(Error::DTypeMismatch {
                op: "as_slice",
                expected: s.dtype(),
                got: T::DTYPE,
            }),
            Storage::Cuda(_) => Err(Error::NotOnCpu { op: "as_slice", device: self.device() }),
        }
    }

    /// The elements of a CPU tensor, mutable and zero-copy.
    ///
    /// # Errors
    /// [`Error::NotOnCpu`] for device tensors, [`Error::DTypeMismatch`] when `T` is not the dtype.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check_dtype("as_mut_slice", T::DTYPE)?;
        let device = self.device();
        match &mut self.storage {
            Storage::Cpu(s) => {
                let dtype = s.dtype();
                s.as_mut_slice().ok_or(Error::DTypeMismatch {
                    op: "as_mut_slice",
                    expected: dtype,
                    got: T::DTYPE,
                })
            }
            Storage::Cuda(_) => Err(Error::NotOnCpu { op: "as_mut_slice", device }),
        }
    }

    /// Copies the elements to a new host vector, waiting for the copy.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`], [`Error::DeviceMismatch`] (stream on another device), CUDA errors.
    pub fn to_vec<T: Element>(&self, stream: &Stream) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); self.numel()];
        self.copy_to_host(&mut v, stream)?;
        Ok(v)
    }

    /// Copies the elements into `dst`, waiting for the copy.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`], [`Error::LengthMismatch`], [`Error::DeviceMismatch`], CUDA errors.
    pub fn copy_to_host<T: Element>(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        const OP: &str = "copy_to_host";
        self.check_dtype(OP, T::DTYPE)?;
        check_len(OP, self.numel(), dst.len())?;
        stream.check_device(OP, self.device())?;
        match (&self.storage, stream.inner()) {
            (Storage::Cpu(_), StreamInner::Cpu(w)) => {
                elementwise::copy(w, self.as_slice::<T>()?, dst);
                Ok(())
            }
            (Storage::Cuda(c), StreamInner::Cuda(s)) => c.copy_to_host(dst, s),
            _ => Err(self.mismatch(OP, stream)),
        }
    }

    /// Overwrites the elements with `src` (synchronous on the CPU; ordered on the CUDA stream,
    /// and `src` may be reused once this returns: a page-locked `src`, e.g. a slice of a
    /// [`PinnedBuffer`], is waited for, since the driver reads it after the call; for an upload
    /// that overlaps later work use [`Tensor::copy_from_pinned_async`], which tracks the copy).
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`], [`Error::LengthMismatch`], [`Error::DeviceMismatch`], CUDA errors.
    pub fn copy_from_host<T: Element>(&mut self, src: &[T], stream: &Stream) -> Result<()> {
        const OP: &str = "copy_from_host";
        self.check_dtype(OP, T::DTYPE)?;
        check_len(OP, self.numel(), src.len())?;
        stream.check_device(OP, self.device())?;
        if let (Storage::Cuda(c), StreamInner::Cuda(s)) = (&mut self.storage, stream.inner()) {
            return c.copy_from_host(src, s);
        }
        match stream.inner() {
            StreamInner::Cpu(w) => {
                elementwise::copy(w, src, self.as_mut_slice::<T>()?);
                Ok(())
            }
            StreamInner::Cuda(_) => Err(self.mismatch(OP, stream)),
        }
    }

    /// Starts copying the elements into a pinned host buffer on `stream` (device to host); read
    /// the buffer through [`PinnedBuffer::as_slice`], which waits for the copy.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`], [`Error::LengthMismatch`], [`Error::DeviceMismatch`] (also for a
    /// buffer made for another GPU than the stream's, checked before any driver call), CUDA
    /// errors.
    pub fn copy_to_pinned_async<T: Element>(
        &self,
        dst: &mut PinnedBuffer<T>,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "copy_to_pinned_async";
        self.check_dtype(OP, T::DTYPE)?;
        check_len(OP, self.numel(), dst.len())?;
        stream.check_device(OP, self.device())?;
        dst.check_stream(OP, stream.device())?;
        match (&self.storage, dst.inner_mut(), stream.inner()) {
            (Storage::Cuda(c), PinnedInner::Cuda(p), StreamInner::Cuda(s)) => {
                c.copy_to_pinned(p, s)
            }
            (Storage::Cuda(c), PinnedInner::Cpu(v), StreamInner::Cuda(s)) => c.copy_to_host(v, s),
            (Storage::Cpu(_), PinnedInner::Cpu(v), StreamInner::Cpu(w)) => {
                elementwise::copy(w, self.as_slice::<T>()?, v);
                Ok(())
            }
            (Storage::Cpu(_), PinnedInner::Cuda(p), StreamInner::Cpu(w)) => {
                elementwise::copy(w, self.as_slice::<T>()?, p.as_mut_slice()?);
                Ok(())
            }
            _ => Err(self.mismatch(OP, stream)),
        }
    }

    /// Starts overwriting the elements from a pinned host buffer on `stream` (host to device);
    /// [`PinnedBuffer::as_mut_slice`] waits for this copy before handing the buffer out again.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`], [`Error::LengthMismatch`], [`Error::DeviceMismatch`] (also for a
    /// buffer made for another GPU than the stream's, checked before any driver call), CUDA
    /// errors.
    pub fn copy_from_pinned_async<T: Element>(
        &mut self,
        src: &PinnedBuffer<T>,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "copy_from_pinned_async";
        self.check_dtype(OP, T::DTYPE)?;
        check_len(OP, self.numel(), src.len())?;
        stream.check_device(OP, self.device())?;
        src.check_stream(OP, stream.device())?;
        match (&mut self.storage, src.inner(), stream.inner()) {
            (Storage::Cuda(c), PinnedInner::Cuda(p), StreamInner::Cuda(s)) => {
                c.copy_from_pinned(p, s)
            }
            (Storage::Cuda(c), PinnedInner::Cpu(v), StreamInner::Cuda(s)) => c.copy_from_host(v, s),
            (Storage::Cpu(c), inner, StreamInner::Cpu(w)) => {
                let src = match inner {
                    PinnedInner::Cpu(v) => v.as_slice(),
                    PinnedInner::Cuda(p) => p.as_slice()?,
                };
                let dtype = c.dtype();
                let dst = c.as_mut_slice::<T>().ok_or(Error::DTypeMismatch {
                    op: OP,
                    expected: dtype,
                    got: T::DTYPE,
                })?;
                elementwise::copy(w, src, dst);
                Ok(())
            }
            _ => Err(Error::DeviceMismatch { op: OP, expected: stream.device(), got: Device::Cpu }),
        }
    }

    /// Overwrites the elements with those of `src` (same shape and dtype, any pair of devices).
    ///
    /// `stream` must be on `self`'s or `src`'s device; a copy between the CPU and a GPU issued on
    /// a CPU stream runs on the GPU tensor's own stream and waits for it.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`], [`Error::DTypeMismatch`], [`Error::DeviceMismatch`], CUDA errors.
    pub fn copy_from(&mut self, src: &Tensor, stream: &Stream) -> Result<()> {
        const OP: &str = "copy_from";
        if self.shape != src.shape {
            return Err(Error::ShapeMismatch {
                op: OP,
                expected: self.shape.clone(),
                got: src.shape.clone(),
            });
        }
        self.check_dtype(OP, src.dtype())?;
        let on = stream.device();
        if on != self.device() && on != src.device() {
            return Err(Error::DeviceMismatch { op: OP, expected: on, got: self.device() });
        }
        match (&mut self.storage, &src.storage, stream.inner()) {
            (Storage::Cpu(d), Storage::Cpu(s), StreamInner::Cpu(w)) => {
                copy_cpu(w, s, d);
                Ok(())
            }
            (Storage::Cuda(d), Storage::Cuda(s), StreamInner::Cuda(cs)) => {
                d.copy_from_device(s, cs)
            }
            (Storage::Cuda(d), Storage::Cpu(s), inner) => d.copy_from_cpu(s, cuda_of(inner)),
            (Storage::Cpu(d), Storage::Cuda(s), inner) => s.copy_to_cpu(d, cuda_of(inner)),
            (Storage::Cpu(_), Storage::Cpu(_), StreamInner::Cuda(_))
            | (Storage::Cuda(_), Storage::Cuda(_), StreamInner::Cpu(_)) => {
                Err(Error::DeviceMismatch { op: OP, expected: on, got: src.device() })
            }
        }
    }

    /// A copy of this tensor on `device`.
    ///
    /// # Errors
    /// As [`Tensor::zeros`] and [`Tensor::copy_from`].
    pub fn to_device(&self, device: Device, stream: &Stream) -> Result<Tensor> {
        let mut t = match (device, stream.inner()) {
            (Device::Cpu, _) => Tensor {
                shape: self.shape.clone(),
                storage: Storage::Cpu(CpuStorage::zeros(self.dtype(), self.numel())?),
            },
            (Device::Cuda(o), StreamInner::Cuda(s)) if s.ordinal() == o => {
                Tensor::zeros(&self.shape, self.dtype(), stream)?
            }
            (Device::Cuda(_), _) => {
                let on_device = Stream::new(device)?;
                Tensor::zeros(&self.shape, self.dtype(), &on_device)?
            }
        };
        t.copy_from(self, stream)?;
        Ok(t)
    }

    /// A copy of this tensor on the same device.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when the stream is on another device; allocation errors.
    pub fn try_clone(&self, stream: &Stream) -> Result<Tensor> {
        stream.check_device("try_clone", self.device())?;
        let storage = match (&self.storage, stream.inner()) {
            (Storage::Cpu(s), _) => Storage::Cpu(s.try_clone()?),
            (Storage::Cuda(c), StreamInner::Cuda(s)) => Storage::Cuda(c.try_clone(s)?),
            (Storage::Cuda(_), StreamInner::Cpu(_)) => {
                return Err(self.mismatch("try_clone", stream));
            }
        };
        Ok(Tensor { shape: self.shape.clone(), storage })
    }

    /// The device address of this CUDA tensor's first element, lent for work issued on `stream`
    /// outside flodl (an NCCL collective, a foreign kernel) that may read and write the tensor.
    ///
    /// `stream` is first made to wait for every earlier read and write of the tensor made through
    /// flodl on other streams; dropping the returned [`DeviceAddress`] records `stream`'s queued
    /// work as the tensor's latest write. So: take the address, enqueue the work on
    /// [`Stream::raw_cuda_stream`] of this same `stream`, then drop the address. The tensor stays
    /// borrowed, hence alive and untouched by flodl, while the address lives; once it is dropped
    /// the raw value must not be used again.
    ///
    /// # Errors
    /// [`Error::NotOnCuda`] for a CPU tensor; [`Error::DeviceMismatch`] when `stream` is not a
    /// CUDA stream of the tensor's device.
    pub fn cuda_device_ptr<'a>(&'a mut self, stream: &'a Stream) -> Result<DeviceAddress<'a>> {
        const OP: &str = "cuda_device_ptr";
        let device = self.device();
        match (&mut self.storage, stream.inner()) {
            (Storage::Cpu(_), _) => Err(Error::NotOnCuda { op: OP, device }),
            (Storage::Cuda(c), StreamInner::Cuda(s)) if s.ordinal() == c.ordinal() => {
                Ok(c.device_address(s))
            }
            (Storage::Cuda(_), _) => {
                Err(Error::DeviceMismatch { op: OP, expected: stream.device(), got: device })
            }
        }
    }

    pub(crate) fn storage(&self) -> &Storage {
        &self.storage
    }

    pub(crate) fn storage_mut(&mut self) -> &mut Storage {
        &mut self.storage
    }

    pub(crate) fn check_dtype(&self, op: &'static str, expected: DType) -> Result<()> {
        let got = self.dtype();
        if got == expected { Ok(()) } else { Err(Error::DTypeMismatch { op, expected, got }) }
    }

    fn mismatch(&self, op: &'static str, stream: &Stream) -> Error {
        Error::DeviceMismatch { op, expected: stream.device(), got: self.device() }
    }
}

/// The CUDA stream of a stream, if it is one.
fn cuda_of(s: &StreamInner) -> Option<&cuda::CudaStream> {
    match s {
        StreamInner::Cuda(cs) => Some(cs),
        StreamInner::Cpu(_) => None,
    }
}

fn copy_cpu(w: &crate::cpu::CpuWorkers, src: &CpuStorage, dst: &mut CpuStorage) {
    match (src, dst) {
        (CpuStorage::F32(s), CpuStorage::F32(d)) => elementwise::copy(w, s, d),
        (CpuStorage::Bf16(s), CpuStorage::Bf16(d)) => elementwise::copy(w, s, d),
        (CpuStorage::I32(s), CpuStorage::I32(d)) => elementwise::copy(w, s, d),
        // Dtypes were checked equal by the caller.
        _ => {}
    }
}

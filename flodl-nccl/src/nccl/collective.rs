//! `Collective` for `NcclComm`: CUDA tensors reduced in place by NCCL on the caller's stream.

use std::time::Duration;

use flodl_tensor::{DType, Device, Stream, Tensor, ops};

use super::comm::{DeviceBuffer, NcclComm, NcclDType, Reduction};
use super::library::RawStream;
use crate::abort::AbortHandle;
use crate::collective::Collective;
use crate::error::{Error, Result};

/// The one-element device buffer and the private stream a barrier all-reduces, made on the first
/// barrier and kept for the next ones.
#[derive(Debug)]
pub(crate) struct BarrierBuffer {
    stream: Stream,
    flag: Tensor,
}

impl BarrierBuffer {
    fn new(device: usize) -> Result<BarrierBuffer> {
        let stream = Stream::new(Device::Cuda(device))?;
        let flag = Tensor::zeros(&[1], DType::F32, &stream)?;
        Ok(BarrierBuffer { stream, flag })
    }
}

fn nccl_dtype(dtype: DType) -> NcclDType {
    match dtype {
        DType::F32 => NcclDType::F32,
        DType::Bf16 => NcclDType::Bf16,
        DType::I32 => NcclDType::I32,
    }
}

impl NcclComm {
    /// Checks, before any NCCL call, that `stream` and every tensor are on this communicator's
    /// GPU, and that the tensors are f32 when `f32_only`.
    fn check_tensors(
        &self,
        op: &str,
        tensors: &[&mut Tensor],
        stream: &Stream,
        f32_only: bool,
    ) -> Result<()> {
        let here = Device::Cuda(self.device());
        if stream.device() != here {
            return Err(Error::InvalidArgument(format!(
                "{op}: the NcclComm of {here} needs a stream on {here}, got one on {}",
                stream.device()
            )));
        }
        for (i, t) in tensors.iter().enumerate() {
            if t.device() != here {
                return Err(Error::InvalidArgument(format!(
                    "{op}: the NcclComm of {here} needs tensors on {here}, tensor {i} is on {}",
                    t.device()
                )));
            }
            if f32_only && t.dtype() != DType::F32 {
                return Err(Error::InvalidArgument(format!(
                    "{op}: needs f32 tensors, tensor {i} is {}",
                    t.dtype()
                )));
            }
        }
        Ok(())
    }
}

/// Lends every tensor's device address for `stream` (which first waits for the tensors' earlier
/// reads and writes on other streams), runs `call` with the buffers and `stream`'s raw handle,
/// then records the call's work on `stream` as each tensor's latest write.
fn with_buffers(
    tensors: &mut [&mut Tensor],
    stream: &Stream,
    call: impl FnOnce(&[DeviceBuffer], RawStream) -> Result<()>,
) -> Result<()> {
    let Some(raw) = stream.raw_cuda_stream() else {
        return Err(Error::InvalidArgument("NCCL needs a CUDA stream, got a cpu stream".into()));
    };
    let mut lent = Vec::with_capacity(tensors.len());
    let mut bufs = Vec::with_capacity(tensors.len());
    for t in tensors.iter_mut() {
        let (len, dtype) = (t.numel(), nccl_dtype(t.dtype()));
        let addr = t.cuda_device_ptr(stream)?;
        bufs.push(DeviceBuffer { ptr: addr.get(), len, dtype });
        lent.push(addr);
    }
    let result = call(&bufs, raw);
    // The collective is enqueued (and has even finished): record it as the tensors' last write.
    drop(lent);
    result
}

/// CUDA tensors on this communicator's GPU, reduced in place on the caller's stream; every
/// operation returns once the collective has finished on that stream.
///
/// The weighted all-reduce needs f32 tensors and uses NCCL's PreMulSum when the library has it
/// (NCCL 2.11+); otherwise each rank scales its tensors by its weight on the same stream
/// ([`ops::scale`]) and then sums, which gives the same result up to rounding (and leaves the
/// tensors scaled if the sum then fails). Sum and broadcast take f32, bf16 and i32 tensors.
///
/// A tensor or stream on another device (or a cpu one), or a non-f32 tensor for the weighted
/// all-reduce, is rejected with `InvalidArgument` before any NCCL call: this rank then does not
/// take part, so its peers wait until their timeout unless the caller aborts the group with
/// [`NcclComm::abort_handle`].
///
/// The barrier all-reduces a one-element buffer on a private stream of the communicator's GPU,
/// made on the first barrier.
impl Collective for NcclComm {
    fn rank(&self) -> usize {
        NcclComm::rank(self)
    }

    fn world_size(&self) -> usize {
        NcclComm::world_size(self)
    }

    fn all_reduce_weighted(
        &mut self,
        tensors: &mut [&mut Tensor],
        weight: f32,
        stream: &Stream,
    ) -> Result<()> {
        self.check_tensors("all_reduce_weighted", tensors, stream, true)?;
        let reduction = if self.has_pre_mul_sum() {
            Reduction::WeightedSum(weight)
        } else {
            for t in tensors.iter_mut() {
                ops::scale(t, weight, stream)?;
            }
            Reduction::Sum
        };
        with_buffers(tensors, stream, |bufs, raw| {
            // SAFETY: every buffer is the device address of a tensor checked to live on this
            // communicator's GPU, lent for `stream` with its element count and type: it stays
            // allocated and untouched by flodl while lent, and `stream` already waits for the
            // tensor's earlier work on other streams. `raw` is the handle of `stream`, a live
            // stream of the same GPU (checked) held by the caller for the whole call.
            unsafe { self.all_reduce_raw(bufs, reduction, raw) }
        })
    }

    fn all_reduce_sum(&mut self, tensors: &mut [&mut Tensor], stream: &Stream) -> Result<()> {
        self.check_tensors("all_reduce_sum", tensors, stream, false)?;
        with_buffers(tensors, stream, |bufs, raw| {
            // SAFETY: as in `all_reduce_weighted`: checked, lent device addresses and the live
            // handle of a stream of this communicator's GPU.
            unsafe { self.all_reduce_raw(bufs, Reduction::Sum, raw) }
        })
    }

    fn broadcast(
        &mut self,
        tensors: &mut [&mut Tensor],
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        if root >= self.world_size() {
            return Err(Error::InvalidArgument(format!(
                "broadcast root {root} is not in a world of {}",
                self.world_size()
            )));
        }
        self.check_tensors("broadcast", tensors, stream, false)?;
        with_buffers(tensors, stream, |bufs, raw| {
            // SAFETY: as in `all_reduce_weighted`: checked, lent device addresses and the live
            // handle of a stream of this communicator's GPU.
            unsafe { self.broadcast_raw(bufs, root, raw) }
        })
    }

    fn barrier(&mut self) -> Result<()> {
        let mut buf = match self.barrier.take() {
            Some(buf) => buf,
            None => BarrierBuffer::new(self.device())?,
        };
        let result = with_buffers(&mut [&mut buf.flag], &buf.stream, |bufs, raw| {
            // SAFETY: the flag is a one-element f32 tensor made on this communicator's GPU, lent
            // for the private stream `buf.stream` of the same GPU, which lives in `buf` for the
            // whole call.
            unsafe { self.all_reduce_raw(bufs, Reduction::Sum, raw) }
        });
        self.barrier = Some(buf);
        result
    }

    fn abort_handle(&self) -> AbortHandle {
        NcclComm::abort_handle(self)
    }

    fn timeout(&self) -> Duration {
        NcclComm::timeout(self)
    }

    fn set_timeout(&mut self, timeout: Duration) {
        NcclComm::set_timeout(self, timeout);
    }
}

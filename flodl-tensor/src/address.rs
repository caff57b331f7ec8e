//! The device address of a CUDA tensor, lent out for work flodl does not issue itself.

use crate::cuda;

/// The device address (`CUdeviceptr`) of a CUDA tensor's first element, lent out for work that
/// flodl does not issue itself (an NCCL collective, a foreign kernel) on one stream.
///
/// Taken with [`Tensor::cuda_device_ptr`](crate::Tensor::cuda_device_ptr). While it lives the
/// tensor stays mutably borrowed, so flodl cannot free, move or touch its memory, and the stream
/// it was taken for already waits for every earlier read and write of the tensor issued through
/// flodl on other streams. Dropping it records that stream's queued work as the tensor's latest
/// write, so later flodl work on any stream waits for it.
///
/// The obligations left to the user of the address: enqueue the foreign work on that same stream
/// (see [`Stream::raw_cuda_stream`](crate::Stream::raw_cuda_stream)), touch at most
/// [`Tensor::size_in_bytes`](crate::Tensor::size_in_bytes) bytes from it, and drop this value
/// only after the work is enqueued. Work issued on another stream is not ordered by flodl.
#[must_use = "dropping the address records the stream's write; enqueue the work first"]
pub struct DeviceAddress<'a> {
    addr: u64,
    // Records the stream's work as the tensor's latest write when dropped.
    _record: cuda::WriteRecord<'a>,
}

impl<'a> DeviceAddress<'a> {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn new(addr: u64, record: cuda::WriteRecord<'a>) -> DeviceAddress<'a> {
        DeviceAddress { addr, _record: record }
    }

    /// The device address of the first element (a `CUdeviceptr`; 0 for an empty tensor).
    pub fn get(&self) -> u64 {
        self.addr
    }
}

impl std::fmt::Debug for DeviceAddress<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceAddress({:#x})", self.addr)
    }
}

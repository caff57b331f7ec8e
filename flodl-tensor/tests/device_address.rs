//! Device addresses and raw stream handles lent for foreign work (NCCL): typed errors on the CPU,
//! and on a GPU, foreign reads and writes ordered against flodl's own work on other streams.

mod common;

use common::TestResult;
use flodl_tensor::{DType, Device, Error, Stream, Tensor};

#[test]
fn cpu_tensors_and_streams_have_no_device_address() -> TestResult {
    for s in [Stream::cpu_with_threads(1), Stream::cpu()] {
        assert!(s.raw_cuda_stream().is_none());
        for dtype in [DType::F32, DType::Bf16, DType::I32] {
            let mut t = Tensor::zeros(&[3, 5], dtype, &s)?;
            match t.cuda_device_ptr(&s) {
                Err(e @ Error::NotOnCuda { op: "cuda_device_ptr", device: Device::Cpu }) => {
                    assert!(e.to_string().contains("cuda"), "{e}");
                }
                other => return Err(format!("{dtype}: expected NotOnCuda, got {other:?}").into()),
            }
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
#[test]
fn foreign_work_through_an_address_is_ordered_with_flodl_work() -> TestResult {
    use common::rand_vec;
    use cudarc::driver::{result, sys};
    if let Some(reason) = flodl_tensor::gpu_skip_reason() {
        flodl_tensor::skip_or_fail(&reason);
        return Ok(());
    }
    let (a, b) = (Stream::new(Device::Cuda(0))?, Stream::new(Device::Cuda(0))?);
    let raw_b = b.raw_cuda_stream().ok_or("a cuda stream has a handle")?;
    assert!(!raw_b.is_null());
    for (seed, n) in [(1u64, 1usize), (2, 1023), (3, (1 << 22) + 5)] {
        let data = rand_vec(n, -4.0, 4.0, seed)?;
        let mut t = Tensor::from_slice(&data, &[n], &a)?;
        match t.cuda_device_ptr(&Stream::cpu_with_threads(1)) {
            Err(Error::DeviceMismatch { op: "cuda_device_ptr", .. }) => {}
            other => return Err(format!("expected DeviceMismatch, got {other:?}").into()),
        }
        // Read through the address on `b`: ordered after the upload issued on `a`.
        let mut host = vec![0.0f32; n];
        {
            let addr = t.cuda_device_ptr(&b)?;
            assert_ne!(addr.get(), 0);
            // SAFETY: `addr` is the live allocation of `n` f32 on cuda:0, `raw_b` a live stream
            // of cuda:0's primary context (current on this thread after the flodl calls above),
            // and `host` holds `n` f32; the copy from pageable memory completes before returning.
            unsafe { result::memcpy_dtoh_async(&mut host, addr.get(), raw_b.cast()) }?;
        }
        b.synchronize()?;
        assert!(host.iter().zip(&data).all(|(x, y)| x.to_bits() == y.to_bits()), "read n={n}");
        // Write through the address on `b`: flodl's read on `a` waits for it.
        let value = data[n / 2] + 1.0;
        {
            let addr = t.cuda_device_ptr(&b)?;
            // SAFETY: as above; the memset writes exactly `n` 32-bit words of the allocation.
            unsafe { sys::cuMemsetD32Async(addr.get(), value.to_bits(), n, raw_b.cast()) }
                .result()?;
        }
        let back = t.to_vec::<f32>(&a)?;
        assert!(back.iter().all(|x| x.to_bits() == value.to_bits()), "write n={n}");
    }
    Ok(())
}

//! Tensors, copies, pinned buffers, events and device discovery, per device.

mod common;

use common::{SIZES, TestResult, check_close, f64s, on_each_device, put, rand_vec};
use flodl_tensor::{
    DType, Device, DeviceDetails, Event, PinnedBuffer, Stream, Tensor, bf16, cuda_device_count,
    devices, gpu_skip_reason,
};

#[test]
fn host_round_trips_are_exact_for_every_dtype() -> TestResult {
    on_each_device(|s| {
        for (i, &n) in SIZES.iter().enumerate() {
            let x = rand_vec(n, -100.0, 100.0, 7000 + i as u64)?;
            let t = put(&x, &[n], s)?;
            assert_eq!(
                (t.shape(), t.numel(), t.dtype(), t.device()),
                (&[n][..], n, DType::F32, s.device())
            );
            assert_eq!(t.size_in_bytes(), 4 * n);
            if t.to_vec::<f32>(s)? != x {
                return Err("f32 round trip".into());
            }
            let h: Vec<bf16> = x.iter().map(|v| bf16::from_f32(*v)).collect();
            let ht = Tensor::from_slice(&h, &[n], s)?;
            assert_eq!(ht.size_in_bytes(), 2 * n);
            if ht.to_vec::<bf16>(s)? != h {
                return Err("bf16 round trip".into());
            }
            let l: Vec<i32> = x.iter().map(|v| *v as i32).collect();
            let mut lt = Tensor::zeros(&[n], DType::I32, s)?;
            lt.copy_from_host(&l, s)?;
            let mut back = vec![0i32; n];
            lt.copy_to_host(&mut back, s)?;
            if back != l {
                return Err("i32 round trip".into());
            }
        }
        Ok(())
    })
}

#[test]
fn zeros_are_zero_and_reshape_keeps_elements() -> TestResult {
    on_each_device(|s| {
        for dtype in [DType::F32, DType::Bf16, DType::I32] {
            let t = Tensor::zeros(&[3, 5, 7], dtype, s)?;
            let zero = match dtype {
                DType::F32 => t.to_vec::<f32>(s)?.iter().all(|v| *v == 0.0),
                DType::Bf16 => t.to_vec::<bf16>(s)?.iter().all(|v| v.to_f32() == 0.0),
                DType::I32 => t.to_vec::<i32>(s)?.iter().all(|v| *v == 0),
            };
            assert!(zero, "{dtype} zeros");
        }
        let x = rand_vec(105, -1.0, 1.0, 1)?;
        let t = put(&x, &[3, 5, 7], s)?.reshape(&[15, 7])?;
        assert_eq!(t.shape(), &[15, 7]);
        assert_eq!(t.to_vec::<f32>(s)?, x);
        let scalar = Tensor::from_slice(&[2.5f32], &[], s)?;
        assert_eq!(scalar.numel(), 1);
        Ok(())
    })
}

#[test]
fn random_constructors_are_seeded_and_have_the_right_moments() -> TestResult {
    on_each_device(|s| {
        let n = (1 << 20) + 3;
        let u = Tensor::rand_uniform(&[n], -2.0, 3.0, 9, s)?.to_vec::<f32>(s)?;
        assert_eq!(u, Tensor::rand_uniform(&[n], -2.0, 3.0, 9, s)?.to_vec::<f32>(s)?);
        assert_ne!(u, Tensor::rand_uniform(&[n], -2.0, 3.0, 10, s)?.to_vec::<f32>(s)?);
        assert!(u.iter().all(|v| (-2.0..3.0).contains(v)), "uniform out of range");
        let mean = f64s(&u).iter().sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "uniform mean {mean}");
        let g = Tensor::rand_normal(&[n], 1.5, 2.0, 11, s)?.to_vec::<f32>(s)?;
        let mean = f64s(&g).iter().sum::<f64>() / n as f64;
        let var = f64s(&g).iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean - 1.5).abs() < 0.01, "normal mean {mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.01, "normal std {}", var.sqrt());
        Ok(())
    })
}

#[test]
fn copies_between_tensors_devices_and_pinned_buffers() -> TestResult {
    on_each_device(|s| {
        for (i, &n) in SIZES.iter().enumerate() {
            let x = rand_vec(n, -1.0, 1.0, 7100 + i as u64)?;
            let src = put(&x, &[n], s)?;
            let mut dst = Tensor::zeros(&[n], DType::F32, s)?;
            dst.copy_from(&src, s)?;
            let clone = dst.try_clone(s)?;
            let host = clone.to_device(Device::Cpu, s)?;
            assert_eq!(host.device(), Device::Cpu);
            assert_eq!(host.as_slice::<f32>()?, &x[..]);
            let back = host.to_device(s.device(), s)?;
            assert_eq!(back.device(), s.device());

            let mut pinned = PinnedBuffer::<f32>::new(n, s.device())?;
            assert_eq!((pinned.len(), pinned.device()), (n, s.device()));
            back.copy_to_pinned_async(&mut pinned, s)?;
            s.synchronize()?;
            assert_eq!(pinned.as_slice()?, &x[..]);
            for v in pinned.as_mut_slice()? {
                *v *= 2.0;
            }
            let mut doubled = Tensor::zeros(&[n], DType::F32, s)?;
            doubled.copy_from_pinned_async(&pinned, s)?;
            let want: Vec<f64> = x.iter().map(|v| 2.0 * f64::from(*v)).collect();
            check_close("pinned h2d", &doubled.to_vec(s)?, &want, &vec![1.0; n], 0.0)?;
        }
        Ok(())
    })
}

#[test]
fn events_order_and_time_work() -> TestResult {
    on_each_device(|s| {
        let start = Event::timed(s.device())?;
        let end = Event::timed(s.device())?;
        start.record(s)?;
        let mut t = Tensor::zeros(&[1 << 20], DType::F32, s)?;
        flodl_tensor::ops::fill(&mut t, 1.0, s)?;
        end.record(s)?;
        s.wait_event(&end)?;
        end.synchronize()?;
        let ms = start.elapsed_ms(&end)?;
        assert!(ms >= 0.0 && ms.is_finite(), "elapsed {ms}");
        assert_eq!(end.device(), s.device());
        Ok(())
    })
}

#[test]
fn device_discovery_lists_the_cpu_first() -> TestResult {
    let list = devices();
    let cpu = list.first().ok_or("no devices")?;
    assert_eq!(cpu.device, Device::Cpu);
    assert!(matches!(cpu.details, DeviceDetails::Cpu { cores } if cores >= 1));
    assert!(cpu.free_memory <= cpu.total_memory);
    assert_eq!(list.len(), 1 + cuda_device_count());
    assert_eq!(gpu_skip_reason().is_none(), cuda_device_count() > 0);
    for (i, d) in list.iter().skip(1).enumerate() {
        assert_eq!(d.device, Device::Cuda(i));
        assert!(d.total_memory > 0 && d.free_memory <= d.total_memory, "{d:?}");
    }
    Ok(())
}

#[test]
fn devices_parse_and_print() -> TestResult {
    for (text, device) in
        [("cpu", Device::Cpu), ("cuda", Device::Cuda(0)), ("cuda:3", Device::Cuda(3))]
    {
        assert_eq!(text.parse::<Device>()?, device);
    }
    for device in [Device::Cpu, Device::Cuda(0), Device::Cuda(12)] {
        assert_eq!(device.to_string().parse::<Device>()?, device);
    }
    assert_eq!(Stream::cpu_with_threads(0).threads(), 1);
    Ok(())
}

#[test]
fn handles_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Stream>();
    send_sync::<Tensor>();
    send_sync::<Event>();
    send_sync::<PinnedBuffer<f32>>();
    send_sync::<flodl_tensor::Error>();
}

#[test]
fn debug_shows_metadata_not_elements() -> TestResult {
    let s = Stream::cpu_with_threads(1);
    let t = put(&[123.25; 4], &[2, 2], &s)?;
    let text = format!("{t:?}");
    assert!(text.contains("[2, 2]") && text.contains("F32") && !text.contains("123.25"), "{text}");
    Ok(())
}

/// Finding 5 of issue 13: a plain-slice upload from page-locked memory (what a host batch hands
/// out) is read by the driver after the call returns, so `copy_from_host` waits for it: the
/// buffer refilled right after the call must not change what arrived.
#[test]
fn a_pinned_slice_upload_is_done_before_the_buffer_is_refilled() -> TestResult {
    if let Some(reason) = gpu_skip_reason() {
        flodl_tensor::skip_or_fail(&reason);
        return Ok(());
    }
    let s = Stream::new(Device::Cuda(0))?;
    let n = 1 << 24;
    let mut buf = PinnedBuffer::<f32>::new(n, Device::Cuda(0))?;
    let mut t = Tensor::zeros(&[n], DType::F32, &s)?;
    for round in 0..4u8 {
        let value = f32::from(round) + 1.0;
        buf.as_mut_slice()?.fill(value);
        // Queue work ahead of the copy so that it would still be in flight on return.
        for _ in 0..8 {
            flodl_tensor::ops::scale(&mut t, 1.0, &s)?;
        }
        t.copy_from_host(buf.as_slice()?, &s)?;
        buf.as_mut_slice()?.fill(-1.0);
        let got = t.to_vec::<f32>(&s)?;
        if let Some(i) = got.iter().position(|&v| v != value) {
            return Err(format!("round {round}: element {i} is {} not {value}", got[i]).into());
        }
    }
    Ok(())
}

/// Finding 6 of issue 13: a page-locked buffer made for one GPU used on a stream of another is
/// refused with `DeviceMismatch` before any driver call (not a deferred invalid-context error).
#[test]
fn a_pinned_buffer_of_another_gpu_is_refused_up_front() -> TestResult {
    if let Some(reason) = gpu_skip_reason() {
        flodl_tensor::skip_or_fail(&reason);
        return Ok(());
    }
    if cuda_device_count() < 2 {
        flodl_tensor::skip(&format!("needs 2 GPUs, found {}", cuda_device_count()));
        return Ok(());
    }
    let s1 = Stream::new(Device::Cuda(1))?;
    let mut buf = PinnedBuffer::<f32>::new(16, Device::Cuda(0))?;
    let mut t = Tensor::zeros(&[16], DType::F32, &s1)?;
    let refused = |r: flodl_tensor::Result<()>| {
        matches!(
            r,
            Err(flodl_tensor::Error::DeviceMismatch {
                expected: Device::Cuda(1),
                got: Device::Cuda(0),
                ..
            })
        )
    };
    assert!(refused(t.copy_from_pinned_async(&buf, &s1)), "upload from a cuda:0 buffer");
    assert!(refused(t.copy_to_pinned_async(&mut buf, &s1)), "download into a cuda:0 buffer");
    // The stream is still healthy: later work on it succeeds.
    flodl_tensor::ops::fill(&mut t, 3.0, &s1)?;
    assert_eq!(t.to_vec::<f32>(&s1)?, vec![3.0; 16]);
    Ok(())
}

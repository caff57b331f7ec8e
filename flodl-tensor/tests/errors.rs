//! Bad inputs: every error variant comes back as a typed error, never a panic.

mod common;

use common::{TestResult, put};
use flodl_tensor::ops::{self, Transpose};
use flodl_tensor::{
    DType, Device, Error, Event, PinnedBuffer, Stream, Tensor, cuda_device_count, gpu_skip_reason,
    skip_or_fail,
};

fn expect(
    what: &str,
    r: Result<impl std::fmt::Debug, Error>,
    ok: impl Fn(&Error) -> bool,
) -> TestResult {
    match r {
        Err(e) if ok(&e) => {
            assert!(!e.to_string().is_empty());
            Ok(())
        }
        other => Err(format!("{what}: unexpected {other:?}").into()),
    }
}

#[test]
fn shape_errors() -> TestResult {
    let s = Stream::cpu_with_threads(1);
    let a = put(&[1.0; 6], &[2, 3], &s)?;
    let mut b = Tensor::zeros(&[3, 2], DType::F32, &s)?;
    expect("axpy shapes", ops::axpy(1.0, &a, &mut b, &s), |e| {
        matches!(e, Error::ShapeMismatch { op: "axpy", .. })
    })?;
    let mut c = Tensor::zeros(&[2, 2], DType::F32, &s)?;
    expect(
        "gemm inner",
        ops::gemm(1.0, &a, Transpose::No, &a, Transpose::No, 0.0, &mut c, &s),
        |e| matches!(e, Error::ShapeMismatch { op: "gemm", .. }),
    )?;
    let v = put(&[1.0; 6], &[6], &s)?;
    expect(
        "gemm rank",
        ops::gemm(1.0, &v, Transpose::No, &a, Transpose::No, 0.0, &mut c, &s),
        |e| matches!(e, Error::RankMismatch { expected: 2, .. }),
    )?;
    expect("from_slice len", Tensor::from_slice(&[1.0f32; 5], &[2, 3], &s), |e| {
        matches!(e, Error::LengthMismatch { expected: 6, got: 5, .. })
    })?;
    let mut out = Tensor::zeros(&[2, 3], DType::F32, &s)?;
    expect("weights len", ops::weighted_sum(&[&a], &[0.5, 0.5], &mut out, &s), |e| {
        matches!(e, Error::LengthMismatch { expected: 1, got: 2, .. })
    })?;
    expect("overflow", Tensor::zeros(&[usize::MAX, 2], DType::F32, &s), |e| {
        matches!(e, Error::ShapeOverflow { .. })
    })?;
    expect("reshape", a.reshape(&[4]), |e| {
        matches!(e, Error::ShapeMismatch { op: "reshape", .. })
    })?;
    let mut host = vec![0.0f32; 5];
    expect("copy_to_host len", out.copy_to_host(&mut host, &s), |e| {
        matches!(e, Error::LengthMismatch { .. })
    })?;
    Ok(())
}

#[test]
fn dtype_errors() -> TestResult {
    let s = Stream::cpu_with_threads(1);
    let x = Tensor::zeros(&[4], DType::Bf16, &s)?;
    let mut y = Tensor::zeros(&[4], DType::F32, &s)?;
    expect("axpy bf16", ops::axpy(1.0, &x, &mut y, &s), |e| {
        matches!(e, Error::DTypeMismatch { expected: DType::F32, got: DType::Bf16, .. })
    })?;
    expect("as_slice", y.as_slice::<i32>(), |e| matches!(e, Error::DTypeMismatch { .. }))?;
    expect("to_vec", y.to_vec::<Bf16>(&s), |e| matches!(e, Error::DTypeMismatch { .. }))?;
    let l = Tensor::zeros(&[4], DType::I32, &s)?;
    expect("cast i32", ops::cast(&l, &mut y, &s), |e| {
        matches!(e, Error::UnsupportedDType { dtype: DType::I32, .. })
    })?;
    Ok(())
}

use flodl_tensor::bf16 as Bf16;

#[test]
fn label_errors_leave_outputs_untouched() -> TestResult {
    let s = Stream::cpu_with_threads(1);
    let logits = put(&[0.5; 12], &[4, 3], &s)?;
    for bad in [-1, 3, i32::MAX] {
        let labels = Tensor::from_slice(&[0, 1, bad, 2], &[4], &s)?;
        let mut dl = put(&[7.0; 12], &[4, 3], &s)?;
        expect(
            "nll label",
            ops::log_softmax_nll(&logits, &labels, &mut dl, &s),
            |e| matches!(e, Error::LabelOutOfRange { row: 2, label, classes: 3, .. } if *label == bad),
        )?;
        assert!(dl.as_slice::<f32>()?.iter().all(|v| *v == 7.0), "dlogits written on error");
        expect("argmax label", ops::argmax_correct(&logits, &labels, &s), |e| {
            matches!(e, Error::LabelOutOfRange { row: 2, .. })
        })?;
    }
    Ok(())
}

#[test]
fn invalid_arguments() -> TestResult {
    let s = Stream::cpu_with_threads(1);
    let mut p = Tensor::zeros(&[4], DType::F32, &s)?;
    let g = Tensor::zeros(&[4], DType::F32, &s)?;
    let (mut m, mut v) =
        (Tensor::zeros(&[4], DType::F32, &s)?, Tensor::zeros(&[4], DType::F32, &s)?);
    expect(
        "adam step 0",
        ops::adam_step(&mut p, &g, &mut m, &mut v, 1e-3, 0.9, 0.999, 1e-8, 0.0, 0, &s),
        |e| matches!(e, Error::InvalidArgument { op: "adam_step", .. }),
    )?;
    expect("no inputs", ops::weighted_sum(&[], &[], &mut p, &s), |e| {
        matches!(e, Error::InvalidArgument { .. })
    })?;
    expect("clip 0", ops::clip_global_norm(&mut [&mut p], 0.0, &s), |e| {
        matches!(e, Error::InvalidArgument { .. })
    })?;
    expect("uniform lo>=hi", Tensor::rand_uniform(&[2], 1.0, 1.0, 0, &s), |e| {
        matches!(e, Error::InvalidArgument { .. })
    })?;
    expect("normal std<0", Tensor::rand_normal(&[2], 0.0, -1.0, 0, &s), |e| {
        matches!(e, Error::InvalidArgument { .. })
    })?;
    let mut l = Tensor::zeros(&[4], DType::I32, &s)?;
    expect("i32 fill", ops::fill(&mut l, 0.5, &s), |e| matches!(e, Error::InvalidArgument { .. }))?;
    let empty_logits = Tensor::zeros(&[0, 3], DType::F32, &s)?;
    let empty_labels = Tensor::zeros(&[0], DType::I32, &s)?;
    expect("empty batch", ops::argmax_correct(&empty_logits, &empty_labels, &s), |e| {
        matches!(e, Error::InvalidArgument { .. })
    })?;
    expect("parse", "gpu:0".parse::<Device>(), |e| matches!(e, Error::ParseDevice(_)))?;
    expect("parse", "cuda:x".parse::<Device>(), |e| matches!(e, Error::ParseDevice(_)))?;
    let (a, b) = (Event::timed(Device::Cpu)?, Event::timed(Device::Cpu)?);
    a.record(&s)?;
    expect("unrecorded", a.elapsed_ms(&b), |e| matches!(e, Error::EventNotRecorded { .. }))?;
    let (m, n) = (Event::new(Device::Cpu)?, Event::new(Device::Cpu)?);
    m.record(&s)?;
    n.record(&s)?;
    let not_timed = |e: &Error| matches!(e, Error::EventNotTimed { .. });
    expect("marker to marker", m.elapsed_ms(&n), not_timed)?;
    b.record(&s)?;
    expect("timed to marker", a.elapsed_ms(&n), not_timed)?;
    expect("marker to timed", m.elapsed_ms(&b), not_timed)?;
    Ok(())
}

#[test]
fn out_of_memory_is_an_error() -> TestResult {
    let s = Stream::cpu_with_threads(1);
    expect("huge zeros", Tensor::zeros(&[1 << 45], DType::F32, &s), |e| {
        matches!(e, Error::OutOfMemory { device: Device::Cpu, .. })
    })?;
    expect("huge pinned", PinnedBuffer::<f32>::new(1 << 45, Device::Cpu), |e| {
        matches!(e, Error::OutOfMemory { .. })
    })?;
    Ok(())
}

#[test]
fn cuda_unavailable_or_absent_device_is_an_error() -> TestResult {
    let beyond = Device::Cuda(cuda_device_count());
    let check = |e: &Error| match e {
        Error::CudaNotCompiled => cfg!(not(feature = "cuda")),
        Error::CudaUnavailable { reason } => cfg!(feature = "cuda") && !reason.is_empty(),
        Error::NoSuchDevice { ordinal, count } => *ordinal == *count && *count > 0,
        _ => false,
    };
    expect("stream", Stream::new(beyond), check)?;
    expect("event", Event::new(beyond), check)?;
    expect("pinned", PinnedBuffer::<f32>::new(4, beyond), check)?;
    let s = Stream::cpu_with_threads(1);
    expect("to_device", put(&[1.0; 4], &[4], &s)?.to_device(beyond, &s), check)?;
    Ok(())
}

#[test]
fn device_mismatches_are_errors() -> TestResult {
    if let Some(reason) = gpu_skip_reason() {
        skip_or_fail(&format!("device mismatch needs a second device: {reason}"));
        return Ok(());
    }
    let cpu = Stream::cpu_with_threads(1);
    let gpu = Stream::new(Device::Cuda(0))?;
    let on_gpu = Tensor::zeros(&[4], DType::F32, &gpu)?;
    let mut on_cpu = Tensor::zeros(&[4], DType::F32, &cpu)?;
    expect("axpy across devices", ops::axpy(1.0, &on_gpu, &mut on_cpu, &cpu), |e| {
        matches!(e, Error::DeviceMismatch { expected: Device::Cpu, got: Device::Cuda(0), .. })
    })?;
    expect("as_slice", on_gpu.as_slice::<f32>(), |e| matches!(e, Error::NotOnCpu { .. }))?;
    expect("to_vec on cpu stream", on_gpu.to_vec::<f32>(&cpu), |e| {
        matches!(e, Error::DeviceMismatch { .. })
    })?;
    let ev = Event::new(Device::Cuda(0))?;
    expect("record on cpu", ev.record(&cpu), |e| matches!(e, Error::DeviceMismatch { .. }))?;
    Ok(())
}

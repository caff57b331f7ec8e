//! NCCL: typed errors without a GPU; on a GPU machine, init, weighted all-reduce, broadcast,
//! abort and timeouts (multi-GPU cases with two or more GPUs).
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtrMut};
use flodl_nccl::{
    DeviceBuffer, Error, NcclComm, NcclDType, Reduction, UniqueId, nccl_skip_reason, nccl_version,
};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn gpu_count() -> usize {
    CudaContext::device_count().map_or(0, |n| usize::try_from(n).unwrap_or(0))
}

/// Prints `skipped: <reason>` and returns true, or fails the test under `FLODL_REQUIRE_GPU=1`.
fn skipped() -> bool {
    match nccl_skip_reason() {
        None => false,
        Some(reason) => {
            flodl_tensor::skip_or_fail(&reason);
            true
        }
    }
}

fn to_err(e: impl std::fmt::Display) -> Box<dyn std::error::Error + Send + Sync> {
    e.to_string().into()
}

/// A device copy of `host` on `stream`, as a raw buffer for NCCL.
fn upload(
    stream: &Arc<CudaStream>,
    host: &[f32],
) -> Result<(CudaSlice<f32>, DeviceBuffer), Box<dyn std::error::Error + Send + Sync>> {
    let mut slice = stream.clone_htod(host).map_err(to_err)?;
    let ptr = {
        let (ptr, _sync) = slice.device_ptr_mut(stream);
        ptr
    };
    let buf = DeviceBuffer { ptr, len: host.len(), dtype: NcclDType::F32 };
    Ok((slice, buf))
}

#[test]
fn missing_pieces_are_typed_errors_not_panics() -> TestResult {
    println!("NCCL usable: {:?}", nccl_skip_reason().map_or("yes".to_owned(), |why| why));
    match nccl_version() {
        Ok(version) => println!("NCCL {version}"),
        Err(Error::LibraryMissing(why)) => println!("NCCL not loadable: {why}"),
        Err(other) => return Err(format!("unexpected error {other:?}").into()),
    }
    let id = UniqueId::from_bytes([7; UniqueId::LEN]);
    match NcclComm::new(&id, 0, 1, usize::MAX, Duration::from_secs(1)) {
        Err(Error::LibraryMissing(_) | Error::NoGpu(_)) => {}
        other => return Err(format!("expected LibraryMissing or NoGpu, got {other:?}").into()),
    }
    assert!(matches!(
        NcclComm::new(&id, 2, 2, 0, Duration::from_secs(1)),
        Err(Error::InvalidArgument(_))
    ));
    Ok(())
}

#[test]
fn unique_ids_round_trip_as_bytes() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x1d);
    for _ in 0..16 {
        let bytes: [u8; UniqueId::LEN] = std::array::from_fn(|_| rng.random_range(0..=255u8));
        let id = UniqueId::from_bytes(bytes);
        let wire: Vec<u8> = id.clone().into();
        assert_eq!(UniqueId::try_from(wire)?, id);
        assert_eq!(id.as_bytes(), &bytes);
    }
    // The wire format of the control plane (bincode over serde): bytes in, the same id out.
    let id = UniqueId::from_bytes(std::array::from_fn(|i| i as u8));
    let config = bincode::config::standard();
    let frame = bincode::serde::encode_to_vec(&id, config)?;
    let (back, used): (UniqueId, usize) = bincode::serde::decode_from_slice(&frame, config)?;
    assert_eq!((back, used), (id, frame.len()));
    let short = bincode::serde::encode_to_vec(vec![1u8; 100], config)?;
    assert!(bincode::serde::decode_from_slice::<UniqueId, _>(&short, config).is_err());
    for len in [0usize, 127, 129] {
        assert!(matches!(UniqueId::try_from(vec![0u8; len]), Err(Error::InvalidArgument(_))));
    }
    Ok(())
}

#[test]
fn one_rank_reduces_broadcasts_and_aborts() -> TestResult {
    if skipped() {
        return Ok(());
    }
    let id = UniqueId::new()?;
    let mut comm = NcclComm::new(&id, 0, 1, 0, Duration::from_secs(30))?;
    println!("NCCL {} (PreMulSum: {})", comm.version(), comm.has_pre_mul_sum());
    let ctx = CudaContext::new(0).map_err(to_err)?;
    let stream = ctx.new_stream().map_err(to_err)?;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x9a);
    let host: Vec<f32> = (0..100_003).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let w = 0.37f32;
    let (slice, buf) = upload(&stream, &host)?;
    // SAFETY: `slice` is a live allocation of `host.len()` f32s on device 0, used by nothing
    // else until the call returns; `stream` is a live stream of device 0.
    unsafe { comm.all_reduce_raw(&[buf], Reduction::WeightedSum(w), stream.cu_stream().cast())? };
    let out = stream.clone_dtoh(&slice).map_err(to_err)?;
    for (i, (&x, &y)) in host.iter().zip(&out).enumerate() {
        let exact = f64::from(w) * f64::from(x);
        assert!((f64::from(y) - exact).abs() <= 1e-6 * exact.abs() + 1e-30, "element {i}");
    }
    // SAFETY: as above.
    unsafe { comm.broadcast_raw(&[buf], 0, stream.cu_stream().cast())? };
    // SAFETY: as above.
    unsafe { comm.all_reduce_raw(&[buf], Reduction::Sum, stream.cu_stream().cast())? };
    assert_eq!(stream.clone_dtoh(&slice).map_err(to_err)?, out);
    let handle = comm.abort_handle();
    handle.abort();
    handle.abort();
    // SAFETY: as above.
    let after = unsafe { comm.all_reduce_raw(&[buf], Reduction::Sum, stream.cu_stream().cast()) };
    assert!(matches!(after, Err(Error::Aborted)), "{after:?}");
    drop(comm);
    let rebuilt = NcclComm::new(&UniqueId::new()?, 0, 1, 0, Duration::from_secs(30))?;
    rebuilt.destroy()?;
    Ok(())
}

#[test]
fn init_times_out_when_a_rank_never_joins() -> TestResult {
    if skipped() {
        return Ok(());
    }
    let id = UniqueId::new()?;
    let started = Instant::now();
    let result = NcclComm::new(&id, 0, 2, 0, Duration::from_secs(3));
    println!("init of a half-empty world gave up after {:?}", started.elapsed());
    assert!(matches!(result, Err(Error::TimedOut { op: "init", .. })), "{result:?}");
    Ok(())
}

#[test]
fn ranks_on_several_gpus_reduce_and_abort_unblocks_a_waiting_rank() -> TestResult {
    if skipped() {
        return Ok(());
    }
    let world = gpu_count();
    if world < 2 {
        flodl_tensor::skip(&format!("the multi-GPU cases need 2 or more GPUs, found {world}"));
        return Ok(());
    }
    let id = UniqueId::new()?;
    let len = 65_537;
    let inputs: Vec<Vec<f32>> = (0..world)
        .map(|r| (0..len).map(|i| ((i * 31 + r * 7) % 97) as f32 / 97.0).collect())
        .collect();
    let weights: Vec<f32> = (0..world).map(|r| 1.0 / (r + 2) as f32).collect();
    let outputs = thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let (id, inputs, weights) = (&id, &inputs, &weights);
                s.spawn(move || -> Result<Vec<f32>, Box<dyn std::error::Error + Send + Sync>> {
                    let mut comm = NcclComm::new(id, rank, world, rank, Duration::from_secs(60))?;
                    let ctx = CudaContext::new(rank).map_err(to_err)?;
                    let stream = ctx.new_stream().map_err(to_err)?;
                    let (slice, buf) = upload(&stream, &inputs[rank])?;
                    // SAFETY: a live allocation on this rank's device and a live stream of it.
                    unsafe {
                        comm.all_reduce_raw(
                            &[buf],
                            Reduction::WeightedSum(weights[rank]),
                            stream.cu_stream().cast(),
                        )?
                    };
                    let out = stream.clone_dtoh(&slice).map_err(to_err)?;
                    if rank == 0 {
                        // Rank 0 waits in a broadcast nobody else joins; its handle frees it.
                        // (The abort may land before or during the call: both must fail it.)
                        let handle = comm.abort_handle();
                        let (go, wait) = std::sync::mpsc::sync_channel::<()>(1);
                        let aborter = thread::spawn(move || {
                            let _ = wait.recv();
                            let at = Instant::now();
                            handle.abort();
                            at
                        });
                        go.send(()).map_err(to_err)?;
                        // SAFETY: as above.
                        let stuck =
                            unsafe { comm.broadcast_raw(&[buf], 0, stream.cu_stream().cast()) };
                        let woke = Instant::now();
                        let at = aborter.join().map_err(|_| "aborter panicked")?;
                        println!(
                            "abort unblocked rank 0 after {:?}",
                            woke.saturating_duration_since(at)
                        );
                        assert!(matches!(stuck, Err(Error::Aborted)), "{stuck:?}");
                    }
                    Ok(out)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect::<Vec<_>>()
    });
    for out in outputs {
        let out = out.map_err(|_| "rank panicked")??;
        for i in 0..len {
            let exact: f64 =
                (0..world).map(|r| f64::from(weights[r]) * f64::from(inputs[r][i])).sum();
            assert!((f64::from(out[i]) - exact).abs() <= 1e-5, "element {i}");
        }
    }
    Ok(())
}

//! The `Collective` contract over CPU tensors, driven through `HostComm` as a trait object.

use std::thread;

use flodl_nccl::{Collective, Error, HostComm};
use flodl_tensor::{DType, Stream, Tensor};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// One rank's tensors before and after, as host vectors.
type BeforeAfter = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// One rank's replica: the tensors it averages.
struct Replica {
    params: Vec<Tensor>,
}

/// Work-weighted averaging as the DDP runtime does it, written against the trait alone.
fn average(
    comm: &mut dyn Collective,
    replica: &mut Replica,
    weight: f32,
    stream: &Stream,
) -> flodl_nccl::Result<()> {
    let mut refs: Vec<&mut Tensor> = replica.params.iter_mut().collect();
    comm.all_reduce_weighted(&mut refs, weight, stream)?;
    comm.broadcast(&mut refs[..1], 0, stream)?;
    comm.barrier()
}

#[test]
fn weighted_average_of_cpu_tensors_matches_the_reference() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0xc011);
    let shapes: [&[usize]; 3] = [&[64, 33], &[33], &[7, 5, 3]];
    for world in 1..=5 {
        let counts: Vec<f32> = (0..world).map(|_| rng.random_range(1.0f32..20.0)).collect();
        let total: f32 = counts.iter().sum();
        let weights: Vec<f32> = counts.iter().map(|c| c / total).collect();
        let seeds: Vec<u64> = (0..world).map(|_| rng.random_range(0..u64::MAX)).collect();
        let comms = HostComm::group(world);
        let outputs = thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|comm| {
                    let (weights, seeds) = (&weights, &seeds);
                    s.spawn(move || -> flodl_nccl::Result<BeforeAfter> {
                        let stream = Stream::cpu_with_threads(1);
                        let rank = comm.rank();
                        let mut comm: Box<dyn Collective> = Box::new(comm);
                        let params = shapes
                            .iter()
                            .enumerate()
                            .map(|(i, shape)| {
                                Tensor::rand_normal(
                                    shape,
                                    0.0,
                                    1.0,
                                    seeds[rank] + i as u64,
                                    &stream,
                                )
                            })
                            .collect::<Result<Vec<_>, _>>()?;
                        let before = params
                            .iter()
                            .map(|t| t.to_vec::<f32>(&stream))
                            .collect::<Result<_, _>>()?;
                        let mut replica = Replica { params };
                        average(comm.as_mut(), &mut replica, weights[rank], &stream)?;
                        let after = replica
                            .params
                            .iter()
                            .map(|t| t.to_vec::<f32>(&stream))
                            .collect::<Result<_, _>>()?;
                        Ok((before, after))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join()).collect::<Vec<_>>()
        });
        let outputs: Vec<BeforeAfter> = outputs
            .into_iter()
            .map(|o| o.map_err(|_| "rank panicked")?.map_err(Into::into))
            .collect::<Result<_, Box<dyn std::error::Error + Send + Sync>>>()?;
        for (t, shape) in shapes.iter().enumerate() {
            let n: usize = shape.iter().product();
            for i in 0..n {
                let exact: f64 =
                    (0..world).map(|r| f64::from(weights[r]) * f64::from(outputs[r].0[t][i])).sum();
                let scale: f64 = (0..world)
                    .map(|r| (f64::from(weights[r]) * f64::from(outputs[r].0[t][i])).abs())
                    .sum();
                for (rank, (_, after)) in outputs.iter().enumerate() {
                    let got = f64::from(after[t][i]);
                    assert!(
                        (got - exact).abs()
                            <= 2.0 * world as f64 * f64::from(f32::EPSILON) * scale + 1e-30,
                        "world {world} rank {rank} tensor {t} element {i}: {got} vs {exact}"
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn tensors_the_host_collective_cannot_reduce_are_rejected() -> TestResult {
    let stream = Stream::cpu_with_threads(1);
    let mut comm = HostComm::group(1).pop().ok_or("empty group")?;
    let mut ints = Tensor::zeros(&[4], DType::I32, &stream)?;
    let mut floats = Tensor::zeros(&[4], DType::F32, &stream)?;
    let result = Collective::all_reduce_sum(&mut comm, &mut [&mut floats, &mut ints], &stream);
    assert!(matches!(result, Err(Error::InvalidArgument(_))), "{result:?}");
    let result = Collective::broadcast(&mut comm, &mut [&mut floats], 1, &stream);
    assert!(matches!(result, Err(Error::InvalidArgument(_))), "{result:?}");
    Collective::all_reduce_weighted(&mut comm, &mut [&mut floats], 2.0, &stream)?;
    assert_eq!(floats.to_vec::<f32>(&stream)?, vec![0.0; 4]);
    Ok(())
}

//! HostComm against an f64 reference, bitwise determinism, abort, timeout, shrink and stress.

use std::thread;
use std::time::{Duration, Instant};

use flodl_nccl::{Error, HostComm};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Runs `f(comm)` for every rank of a fresh group of `world` on its own thread.
fn on_ranks<T: Send>(world: usize, f: impl Fn(HostComm) -> T + Sync) -> Vec<thread::Result<T>> {
    let comms = HostComm::group(world);
    thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let f = &f;
                s.spawn(move || f(comm))
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    })
}

/// Random inputs for `world` ranks: per rank a list of buffers with the given lengths.
fn random_inputs(rng: &mut Xoshiro256PlusPlus, world: usize, lens: &[usize]) -> Vec<Vec<Vec<f32>>> {
    (0..world)
        .map(|_| {
            lens.iter().map(|&n| (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()).collect()
        })
        .collect()
}

/// Runs a weighted all-reduce of `inputs[r]` with `weights[r]` on every rank; returns each
/// rank's buffers afterwards.
fn weighted_all_reduce(
    inputs: &[Vec<Vec<f32>>],
    weights: &[f32],
) -> Vec<flodl_nccl::Result<Vec<Vec<f32>>>> {
    on_ranks(inputs.len(), |mut comm| {
        let mut bufs = inputs[comm.rank()].clone();
        let mut views: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        comm.all_reduce_weighted_f32(&mut views, weights[comm.rank()])?;
        Ok(bufs)
    })
    .into_iter()
    .map(|r| r.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    .collect()
}

#[test]
fn weighted_all_reduce_matches_an_f64_reference() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x5eed_0001);
    for world in 1..=8 {
        for _trial in 0..4 {
            let nbufs = rng.random_range(1..=4);
            let lens: Vec<usize> = (0..nbufs)
                .map(|_| match rng.random_range(0..4) {
                    0 => rng.random_range(0..20),
                    1 => rng.random_range(0..5000),
                    _ => rng.random_range(20_000..70_000),
                })
                .collect();
            let inputs = random_inputs(&mut rng, world, &lens);
            let weights: Vec<f32> = (0..world).map(|_| rng.random_range(-1.0f32..2.0)).collect();
            let outputs = weighted_all_reduce(&inputs, &weights);
            let outputs: Vec<Vec<Vec<f32>>> = outputs.into_iter().collect::<Result<_, _>>()?;
            for (b, &len) in lens.iter().enumerate() {
                for i in 0..len {
                    let exact: f64 = (0..world)
                        .map(|r| f64::from(weights[r]) * f64::from(inputs[r][b][i]))
                        .sum();
                    let magnitude: f64 = (0..world)
                        .map(|r| (f64::from(weights[r]) * f64::from(inputs[r][b][i])).abs())
                        .sum();
                    let bound = 2.0 * world as f64 * f64::from(f32::EPSILON) * magnitude + 1e-30;
                    let got = f64::from(outputs[0][b][i]);
                    assert!(
                        (got - exact).abs() <= bound,
                        "world {world} buffer {b} element {i}: got {got}, expected {exact}"
                    );
                }
            }
            for (rank, out) in outputs.iter().enumerate() {
                assert!(
                    bitwise_equal(out, &outputs[0]),
                    "world {world}: rank {rank} differs from rank 0"
                );
            }
        }
    }
    Ok(())
}

fn bitwise_equal(a: &[Vec<f32>], b: &[Vec<f32>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
        })
}

#[test]
fn results_are_bitwise_the_rank_ordered_f32_sum_on_every_rank_and_run() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x5eed_0002);
    for world in [2, 3, 5, 8] {
        let lens = [rng.random_range(1..40_000), rng.random_range(1..3000)];
        let inputs = random_inputs(&mut rng, world, &lens);
        let weights: Vec<f32> = (0..world).map(|_| rng.random_range(0.0f32..1.0)).collect();
        let expected: Vec<Vec<f32>> = (0..lens.len())
            .map(|b| {
                (0..lens[b])
                    .map(|i| {
                        let mut acc = weights[0] * inputs[0][b][i];
                        for r in 1..world {
                            acc += weights[r] * inputs[r][b][i];
                        }
                        acc
                    })
                    .collect()
            })
            .collect();
        for run in 0..3 {
            for (rank, out) in weighted_all_reduce(&inputs, &weights).into_iter().enumerate() {
                assert!(
                    bitwise_equal(&out?, &expected),
                    "world {world} run {run} rank {rank}: not the rank-ordered sum"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn sum_and_broadcast_match_the_reference() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x5eed_0003);
    for world in 1..=6 {
        let lens = [rng.random_range(0..30_000), rng.random_range(0..100)];
        let inputs = random_inputs(&mut rng, world, &lens);
        let root = rng.random_range(0..world);
        let results = on_ranks(world, |mut comm| {
            let mut summed = inputs[comm.rank()].clone();
            let mut views: Vec<&mut [f32]> = summed.iter_mut().map(|b| b.as_mut_slice()).collect();
            comm.all_reduce_sum_f32(&mut views)?;
            let mut copied = inputs[comm.rank()].clone();
            let mut views: Vec<&mut [f32]> = copied.iter_mut().map(|b| b.as_mut_slice()).collect();
            comm.broadcast_f32(&mut views, root)?;
            comm.barrier()?;
            Ok::<_, Error>((summed, copied))
        });
        for result in results {
            let (summed, copied) = result.map_err(|_| "rank panicked")??;
            assert!(bitwise_equal(&copied, &inputs[root]), "broadcast from {root}");
            for (b, &len) in lens.iter().enumerate() {
                for i in 0..len {
                    let exact: f64 = (0..world).map(|r| f64::from(inputs[r][b][i])).sum();
                    let bound = 2.0 * world as f64 * f64::from(f32::EPSILON) * world as f64;
                    assert!((f64::from(summed[b][i]) - exact).abs() <= bound);
                }
            }
        }
    }
    Ok(())
}

#[test]
fn mismatched_buffers_fail_on_every_rank_and_leave_the_group_usable() -> TestResult {
    let results = on_ranks(3, |mut comm| {
        let len = if comm.rank() == 1 { 7 } else { 8 };
        let mut buf = vec![1.0f32; len];
        let first = comm.all_reduce_sum_f32(&mut [&mut buf]);
        let mut buf = vec![comm.rank() as f32; 5];
        let second = comm.all_reduce_sum_f32(&mut [&mut buf]).map(|()| buf);
        let third = if comm.rank() == 2 { comm.barrier() } else { comm.broadcast_f32(&mut [], 0) };
        (first, second, third)
    });
    for result in results {
        let (first, second, third) = result.map_err(|_| "rank panicked")?;
        assert!(
            matches!(first, Err(Error::Mismatch { what: "buffer length", rank: 1, .. })),
            "{first:?}"
        );
        assert_eq!(second?, vec![3.0f32; 5]);
        assert!(matches!(third, Err(Error::Mismatch { what: "operation", .. })), "{third:?}");
    }
    Ok(())
}

/// Blocks until `n` ranks of `comm`'s group wait in an operation (polling, not sleeping).
fn wait_for_waiters(comm: &HostComm, n: usize) {
    while comm.waiting_ranks().len() < n {
        thread::yield_now();
    }
}

#[test]
fn abort_wakes_every_waiting_rank() -> TestResult {
    let world = 4;
    let mut comms = HostComm::group(world);
    let mut first = comms.remove(0);
    let handle = first.abort_handle();
    let (aborted_at, wakes) = thread::scope(|s| {
        let waiters: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                s.spawn(move || {
                    let mut buf = vec![1.0f32; 1000];
                    let result = comm.all_reduce_sum_f32(&mut [&mut buf]);
                    (result, Instant::now())
                })
            })
            .collect();
        wait_for_waiters(&first, world - 1);
        let aborted_at = Instant::now();
        handle.abort();
        handle.abort();
        let wakes: Vec<_> = waiters.into_iter().map(|w| w.join()).collect();
        (aborted_at, wakes)
    });
    let mut slowest = Duration::ZERO;
    for wake in wakes {
        let (result, at) = wake.map_err(|_| "rank panicked")?;
        assert!(matches!(result, Err(Error::Aborted)), "{result:?}");
        slowest = slowest.max(at.saturating_duration_since(aborted_at));
    }
    println!("abort wake-up latency (slowest of {} ranks): {slowest:?}", world - 1);
    assert!(slowest < Duration::from_secs(2), "wake-up took {slowest:?}");
    assert!(handle.is_aborted());
    assert!(matches!(first.barrier(), Err(Error::Aborted)));
    Ok(())
}

#[test]
fn a_dropped_or_panicking_rank_is_reported_as_lost() -> TestResult {
    for panics in [false, true] {
        let world = 3;
        let results = on_ranks(world, |mut comm| {
            if comm.rank() == 1 {
                wait_for_waiters(&comm, world - 1);
                if panics {
                    // Unwinds (running the communicator's Drop) without printing a panic message.
                    std::panic::resume_unwind(Box::new("rank 1 fails"));
                }
                drop(comm);
                return Ok(());
            }
            let mut buf = vec![1.0f32; 10];
            comm.all_reduce_sum_f32(&mut [&mut buf])
        });
        for (rank, result) in results.into_iter().enumerate() {
            match (rank, result) {
                (1, outcome) => assert_eq!(outcome.is_err(), panics),
                (_, Ok(outcome)) => {
                    assert!(matches!(outcome, Err(Error::PeerLost { rank: 1 })), "{outcome:?}")
                }
                (_, Err(_)) => return Err("survivor panicked".into()),
            }
        }
    }
    Ok(())
}

#[test]
fn a_rank_that_never_arrives_times_out_and_aborts_the_group() -> TestResult {
    let world = 3;
    let mut comms = HostComm::group(world);
    let mut late = comms.pop().ok_or("empty group")?;
    let results: Vec<_> = thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                s.spawn(move || {
                    comm.set_timeout(Duration::from_millis(100));
                    let mut buf = vec![1.0f32; 10];
                    comm.all_reduce_sum_f32(&mut [&mut buf])
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut timed_out = 0;
    for result in results {
        match result.map_err(|_| "rank panicked")? {
            Err(Error::TimedOut { op: "all_reduce", after }) => {
                assert!(after >= Duration::from_millis(100));
                timed_out += 1;
            }
            Err(Error::Aborted) => {}
            other => return Err(format!("expected a timeout, got {other:?}").into()),
        }
    }
    assert!(timed_out >= 1);
    assert!(matches!(late.barrier(), Err(Error::Aborted)));
    Ok(())
}

#[test]
fn survivors_shrink_into_a_working_group() -> TestResult {
    let world = 4;
    let leaver = 2;
    let survivors = [0usize, 1, 3];
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x5eed_0004);
    let inputs = random_inputs(&mut rng, survivors.len(), &[3001]);
    let weights: Vec<f32> = (0..survivors.len()).map(|_| rng.random_range(0.0f32..1.0)).collect();
    let results = on_ranks(world, |mut comm| {
        if comm.rank() == leaver {
            wait_for_waiters(&comm, world - 1);
            return Ok(None);
        }
        let mut buf = vec![0.0f32; 8];
        let lost = comm.all_reduce_sum_f32(&mut [&mut buf]);
        assert!(matches!(lost, Err(Error::PeerLost { rank: 2 })), "{lost:?}");
        assert_eq!(comm.live_ranks(), survivors);
        let missing_self = comm.shrink(&[leaver]);
        assert!(matches!(missing_self, Err(Error::InvalidArgument(_))));
        let mut small = comm.shrink(&survivors)?;
        assert!(matches!(comm.shrink(&survivors), Err(Error::InvalidArgument(_))));
        assert_eq!(small.world_size(), survivors.len());
        assert_eq!(survivors[small.rank()], comm.rank());
        let mut bufs = inputs[small.rank()].clone();
        let mut views: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        small.all_reduce_weighted_f32(&mut views, weights[small.rank()])?;
        Ok::<_, Error>(Some(bufs))
    });
    for result in results {
        let Some(out) = result.map_err(|_| "rank panicked")?? else { continue };
        for i in 0..3001 {
            let exact: f64 = (0..survivors.len())
                .map(|r| f64::from(weights[r]) * f64::from(inputs[r][0][i]))
                .sum();
            assert!((f64::from(out[0][i]) - exact).abs() <= 1e-5, "element {i}");
        }
    }
    Ok(())
}

#[test]
fn thousands_of_mixed_operations_with_random_delays_never_hang() -> TestResult {
    let world = 4;
    let rounds = 4000;
    let results = on_ranks(world, |mut comm| {
        // The schedule (operation, length, root) is shared; the delays differ per rank.
        let mut schedule = Xoshiro256PlusPlus::seed_from_u64(0x5eed_1000);
        let mut delays = Xoshiro256PlusPlus::seed_from_u64(0x5eed_2000 + comm.rank() as u64);
        for round in 0..rounds {
            let kind = schedule.random_range(0..10);
            // Mostly small; now and then several chunks, so ranks take over each other's work.
            let len = if schedule.random_range(0..40) == 0 {
                schedule.random_range(100_000..300_000)
            } else {
                schedule.random_range(0..97)
            };
            let root = schedule.random_range(0..world);
            for _ in 0..delays.random_range(0..2000) {
                std::hint::spin_loop();
            }
            if delays.random_range(0..50) == 0 {
                thread::yield_now();
            }
            let value = |rank: usize, i: usize| ((rank * 1000 + i) % 4096) as f32;
            let mut buf: Vec<f32> = (0..len).map(|i| value(comm.rank(), i)).collect();
            let expected = |i: usize| match kind {
                0 => value(root, i),
                _ => (0..world).fold(0.0f32, |acc, r| acc + 0.5 * value(r, i)),
            };
            match kind {
                0 => comm.broadcast_f32(&mut [&mut buf], root)?,
                1 => {
                    comm.barrier()?;
                    continue;
                }
                _ => comm.all_reduce_weighted_f32(&mut [&mut buf], 0.5)?,
            }
            if let Some(i) = (0..len).find(|&i| buf[i].to_bits() != expected(i).to_bits()) {
                return Err(Error::InvalidArgument(format!(
                    "round {round} (kind {kind}) element {i}: {} instead of {}",
                    buf[i],
                    expected(i)
                )));
            }
        }
        Ok(())
    });
    for result in results {
        result.map_err(|_| "rank panicked")??;
    }
    Ok(())
}

//! Outer optimizers, EASGD and work weighting against closed forms on small tensors (CPU, and
//! CUDA when present).

use flodl_ddp::LogicError;
use flodl_ddp::control::outer::{OuterKind, OuterOptimizer, check_easgd_alpha, easgd_blend};
use flodl_ddp::control::weighting::{average_weights, weighted_average, work_masses};
use flodl_tensor::{Device, Stream, Tensor, gpu_skip_reason, skip_or_fail};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn tensors(values: &[Vec<f32>], s: &Stream) -> Result<Vec<Tensor>, Box<dyn std::error::Error>> {
    Ok(values.iter().map(|v| Tensor::from_slice(v, &[v.len()], s)).collect::<Result<_, _>>()?)
}

fn host(ts: &[Tensor], s: &Stream) -> Result<Vec<Vec<f32>>, Box<dyn std::error::Error>> {
    Ok(ts.iter().map(|t| t.to_vec::<f32>(s)).collect::<Result<_, _>>()?)
}

fn close(got: &[Vec<f32>], want: &[Vec<f64>], tol: f64) {
    for (g, w) in got.iter().zip(want) {
        for (a, b) in g.iter().zip(w) {
            assert!((f64::from(*a) - b).abs() <= tol * b.abs().max(1.0), "{a} vs {b}");
        }
    }
}

/// The f64 reference of an outer optimizer over a sequence of consensus rounds.
fn reference(kind: OuterKind, rounds: &[Vec<Vec<f64>>]) -> Vec<Vec<Vec<f64>>> {
    let mut prev = rounds[0].clone();
    let mut v: Vec<Vec<f64>> = prev.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut out = vec![prev.clone()];
    for c in &rounds[1..] {
        let new: Vec<Vec<f64>> = match kind {
            OuterKind::Average => c.clone(),
            OuterKind::SlowMomentum { lr, momentum } | OuterKind::Nesterov { lr, momentum } => {
                let (lr, mu) = (f64::from(lr), f64::from(momentum));
                let nesterov = matches!(kind, OuterKind::Nesterov { .. });
                (0..c.len())
                    .map(|i| {
                        (0..c[i].len())
                            .map(|j| {
                                let g = prev[i][j] - c[i][j];
                                v[i][j] = mu * v[i][j] + g;
                                let step = if nesterov { mu * v[i][j] + g } else { v[i][j] };
                                prev[i][j] - lr * step
                            })
                            .collect()
                    })
                    .collect()
            }
        };
        prev = new.clone();
        out.push(new);
    }
    out
}

fn outer_matches_reference(s: &Stream) -> TestResult {
    // Hand-computed scalars: consensus 1, 0.5, 0.25.
    let hand = [
        (OuterKind::SlowMomentum { lr: 1.0, momentum: 0.9 }, [1.0, 0.5, -0.2]),
        (OuterKind::Nesterov { lr: 0.7, momentum: 0.9 }, [1.0, 0.335, -0.06155]),
        (OuterKind::Average, [1.0, 0.5, 0.25]),
    ];
    for (kind, want) in hand {
        let mut opt = OuterOptimizer::new(kind)?;
        for (c, w) in [1.0f32, 0.5, 0.25].into_iter().zip(want) {
            let mut consensus = tensors(&[vec![c]], s)?;
            opt.step(&mut consensus, s)?;
            let got = f64::from(consensus[0].to_vec::<f32>(s)?[0]);
            assert!((got - w).abs() < 1e-6, "{kind:?}: {got} vs {w}");
        }
    }
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(17);
    for kind in [OuterKind::Average, OuterKind::slow_momentum(), OuterKind::nesterov()] {
        let shapes = [3usize, 7, 1];
        let rounds: Vec<Vec<Vec<f64>>> = (0..6)
            .map(|_| {
                shapes
                    .iter()
                    .map(|&n| (0..n).map(|_| f64::from(rng.random_range(-1.0f32..1.0))).collect())
                    .collect()
            })
            .collect();
        let want = reference(kind, &rounds);
        let mut opt = OuterOptimizer::new(kind)?;
        for (round, w) in rounds.iter().zip(&want) {
            let f32s: Vec<Vec<f32>> =
                round.iter().map(|t| t.iter().map(|&x| x as f32).collect()).collect();
            let mut consensus = tensors(&f32s, s)?;
            opt.step(&mut consensus, s)?;
            close(&host(&consensus, s)?, w, 1e-5);
        }
        assert_eq!(opt.resets_inner_state(), matches!(kind, OuterKind::Nesterov { .. }));
        assert_eq!(opt.velocity().is_some(), kind != OuterKind::Average);
        let mut wrong = tensors(&[vec![0.0; 3]], s)?;
        if kind != OuterKind::Average {
            assert!(opt.step(&mut wrong, s).is_err(), "a changed parameter list is an error");
        }
    }
    Ok(())
}

fn easgd_matches_closed_form(s: &Stream) -> TestResult {
    for (alpha, want) in [(0.5f32, [2.0, 4.0]), (1.0, [3.0, 6.0]), (0.25, [1.5, 3.0])] {
        let mut local = tensors(&[vec![1.0, 2.0]], s)?;
        let avg = tensors(&[vec![3.0, 6.0]], s)?;
        easgd_blend(&mut local, &avg, check_easgd_alpha(alpha)?, s)?;
        close(&host(&local, s)?, &[want.to_vec()], 1e-7);
    }
    let mut local = tensors(&[vec![1.0], vec![2.0]], s)?;
    let avg = tensors(&[vec![1.0]], s)?;
    assert!(easgd_blend(&mut local, &avg, 0.5, s).is_err());
    Ok(())
}

fn weighted_average_matches_reference(s: &Stream) -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
    for _ in 0..20 {
        let world = rng.random_range(1..6usize);
        let steps: Vec<u64> = (0..world).map(|_| rng.random_range(0..5u64)).collect();
        let gamma = rng.random_range(0.0..2.0);
        let values: Vec<Vec<Vec<f32>>> = (0..world)
            .map(|_| {
                vec![(0..4).map(|_| rng.random_range(-2.0f32..2.0)).collect(), vec![rng.random()]]
            })
            .collect();
        let Some(w) = average_weights(&steps, gamma)? else {
            assert!(steps.iter().all(|&n| n == 0));
            continue;
        };
        let mut replicas: Vec<Vec<Tensor>> =
            values.iter().map(|v| tensors(v, s)).collect::<Result<_, _>>()?;
        // A rank that did not step takes no part, even with poisoned values.
        for (r, &n) in steps.iter().enumerate() {
            if n == 0 {
                replicas[r] = tensors(&[vec![f32::NAN; 4], vec![f32::NAN]], s)?;
            }
        }
        let refs: Vec<&[Tensor]> = replicas.iter().map(Vec::as_slice).collect();
        let mut out = tensors(&[vec![0.0; 4], vec![0.0]], s)?;
        weighted_average(&refs, &w.params, &mut out, s)?;
        let mass: Vec<f64> =
            steps.iter().map(|&n| if n == 0 { 0.0 } else { (n as f64).powf(gamma) }).collect();
        let total: f64 = mass.iter().sum();
        let want: Vec<Vec<f64>> = (0..2)
            .map(|i| {
                (0..values[0][i].len())
                    .map(|j| {
                        (0..world)
                            .filter(|&r| steps[r] > 0)
                            .map(|r| mass[r] / total * f64::from(values[r][i][j]))
                            .sum()
                    })
                    .collect()
            })
            .collect();
        close(&host(&out, s)?, &want, 1e-5);
    }
    Ok(())
}

#[test]
fn cpu_outer_optimizers() -> TestResult {
    outer_matches_reference(&Stream::cpu_with_threads(1))
}

#[test]
fn cpu_easgd() -> TestResult {
    easgd_matches_closed_form(&Stream::cpu_with_threads(1))
}

#[test]
fn cpu_weighted_average() -> TestResult {
    weighted_average_matches_reference(&Stream::cpu_with_threads(1))
}

#[test]
fn cuda_outer_easgd_and_average() -> TestResult {
    if let Some(reason) = gpu_skip_reason() {
        skip_or_fail(&reason);
        return Ok(());
    }
    let s = Stream::new(Device::Cuda(0))?;
    outer_matches_reference(&s)?;
    easgd_matches_closed_form(&s)?;
    weighted_average_matches_reference(&s)
}

#[test]
fn weights_by_hand() -> TestResult {
    type Case = ([u64; 3], f64, [f32; 3], [f32; 3]);
    let cases: [Case; 3] = [
        ([4, 0, 1], 1.0, [0.8, 0.0, 0.2], [0.5, 0.0, 0.5]),
        ([4, 0, 1], 0.5, [2.0 / 3.0, 0.0, 1.0 / 3.0], [0.5, 0.0, 0.5]),
        ([4, 0, 1], 0.0, [0.5, 0.0, 0.5], [0.5, 0.0, 0.5]),
    ];
    for (steps, gamma, params, buffers) in cases {
        let w = average_weights(&steps, gamma)?.ok_or("no weights")?;
        for (a, b) in w.params.iter().zip(params) {
            assert!((a - b).abs() < 1e-7, "{steps:?} gamma {gamma}: {:?}", w.params);
        }
        assert_eq!(w.buffers, buffers);
        assert_eq!(w.movers().collect::<Vec<_>>(), vec![0, 2]);
    }
    assert_eq!(average_weights(&[0, 0], 1.0)?, None);
    assert_eq!(work_masses(&[9, 0], 0.5)?, vec![3.0, 0.0]);
    assert!(matches!(work_masses(&[1], -1.0), Err(LogicError::InvalidValue { .. })));
    assert!(matches!(
        OuterOptimizer::new(OuterKind::Nesterov { lr: 0.7, momentum: 1.0 }),
        Err(LogicError::InvalidValue { .. })
    ));
    assert!(matches!(check_easgd_alpha(0.0), Err(LogicError::InvalidValue { .. })));
    Ok(())
}

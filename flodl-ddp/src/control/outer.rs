//! Outer optimizers applied to the consensus between the reduce and the broadcast, and EASGD.
//!
//! With `prev` the global parameters after the previous round and `consensus` this round's
//! average, the outer gradient is `g = prev − consensus` (0 on the first round):
//! * [`OuterKind::Average`]: `new = consensus`.
//! * [`OuterKind::SlowMomentum`] (SlowMo): `v ← μv + g`, `new = prev − lr·v`.
//! * [`OuterKind::Nesterov`] (DiLoCo): `v ← μv + g`, `new = prev − lr·(μv + g)`; each rank must
//!   reset its inner optimizer state every round (`OuterOptimizer::resets_inner_state`).
//!
//! The step is deterministic, so on the collective backend every rank runs it on its own copy
//! and all stay in lock-step with no extra collective; on the host backend the coordinator runs
//! it once. Only parameters go through it (buffers pass through), and a round where no rank
//! stepped must not call it. Everything runs through `flodl_tensor::ops`, so on CPU or CUDA.

use flodl_tensor::{DType, Error as TensorError, Result as TensorResult, Stream, Tensor, ops};

use crate::control::logic_error::{LogicError, LogicResult};

/// Default SlowMo outer learning rate.
pub(crate) const SLOW_MOMENTUM_LR: f32 = 1.0;
/// Default DiLoCo outer learning rate.
pub(crate) const NESTEROV_LR: f32 = 0.7;
/// Default outer momentum.
pub(crate) const OUTER_MOMENTUM: f32 = 0.9;

/// Which outer optimizer runs on the consensus.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OuterKind {
    /// The consensus as is.
    Average,
    /// Slow momentum (SlowMo): `v ← μv + g`, `new = prev − lr·v`.
    SlowMomentum {
        /// Outer learning rate (about 1).
        lr: f32,
        /// Momentum μ in [0, 1).
        momentum: f32,
    },
    /// Nesterov momentum (DiLoCo): `v ← μv + g`, `new = prev − lr·(μv + g)`.
    Nesterov {
        /// Outer learning rate (about 0.7).
        lr: f32,
        /// Momentum μ in [0, 1).
        momentum: f32,
    },
}

impl OuterKind {
    /// SlowMo with the usual defaults (lr 1, μ 0.9).
    pub fn slow_momentum() -> OuterKind {
        OuterKind::SlowMomentum { lr: SLOW_MOMENTUM_LR, momentum: OUTER_MOMENTUM }
    }

    /// DiLoCo with the usual defaults (lr 0.7, μ 0.9).
    pub fn nesterov() -> OuterKind {
        OuterKind::Nesterov { lr: NESTEROV_LR, momentum: OUTER_MOMENTUM }
    }
}

/// Where an outer optimizer stands.
#[derive(Debug)]
enum OuterState {
    /// No round yet: the first consensus is taken as is.
    Fresh,
    /// After at least one round: the previous global parameters and the velocity.
    Running { prev: Vec<Tensor>, velocity: Vec<Tensor> },
}

/// An outer optimizer with its state (see the module documentation).
#[derive(Debug)]
pub(crate) struct OuterOptimizer {
    kind: OuterKind,
    state: OuterState,
}

impl OuterOptimizer {
    /// An outer optimizer of the given kind with no history.
    ///
    /// # Errors
    /// [`LogicError::InvalidValue`] for a non-finite or non-positive learning rate, or a
    /// momentum outside [0, 1).
    pub(crate) fn new(kind: OuterKind) -> LogicResult<OuterOptimizer> {
        if let OuterKind::SlowMomentum { lr, momentum } | OuterKind::Nesterov { lr, momentum } =
            kind
        {
            if !(lr.is_finite() && lr > 0.0) {
                return Err(LogicError::InvalidValue { what: "outer lr", value: f64::from(lr) });
            }
            if !(0.0..1.0).contains(&momentum) {
                return Err(LogicError::InvalidValue {
                    what: "outer momentum",
                    value: f64::from(momentum),
                });
            }
        }
        Ok(OuterOptimizer { kind, state: OuterState::Fresh })
    }

    /// The kind.
    pub(crate) fn kind(&self) -> OuterKind {
        self.kind
    }

    /// True when every rank must reset its inner optimizer state after each round (DiLoCo).
    pub(crate) fn resets_inner_state(&self) -> bool {
        matches!(self.kind, OuterKind::Nesterov { .. })
    }

    /// The outer velocity (for a checkpoint), once a round has run under a momentum kind.
    pub(crate) fn velocity(&self) -> Option<&[Tensor]> {
        match &self.state {
            OuterState::Running { velocity, .. } => Some(velocity),
            OuterState::Fresh => None,
        }
    }

    /// The global parameters of the last round (for a checkpoint), once a round has run.
    pub(crate) fn previous(&self) -> Option<&[Tensor]> {
        match &self.state {
            OuterState::Running { prev, .. } => Some(prev),
            OuterState::Fresh => None,
        }
    }

    /// Restores a checkpointed state: the last round's global parameters and the velocity.
    ///
    /// # Errors
    /// [`TensorError::LengthMismatch`] when the two lists differ in length.
    pub(crate) fn restore(&mut self, prev: Vec<Tensor>, velocity: Vec<Tensor>) -> TensorResult<()> {
        if prev.len() != velocity.len() {
            return Err(TensorError::LengthMismatch {
                op: "outer restore",
                expected: prev.len(),
                got: velocity.len(),
            });
        }
        self.state = OuterState::Running { prev, velocity };
        Ok(())
    }

    /// Replaces `consensus` (this round's average, in place) with the new global parameters.
    ///
    /// # Errors
    /// [`TensorError::LengthMismatch`] when the parameter list changed length since the last
    /// round; the kernels' shape, dtype and device errors.
    pub(crate) fn step(&mut self, consensus: &mut [Tensor], stream: &Stream) -> TensorResult<()> {
        let (lr, momentum, nesterov) = match self.kind {
            OuterKind::Average => return Ok(()),
            OuterKind::SlowMomentum { lr, momentum } => (lr, momentum, false),
            OuterKind::Nesterov { lr, momentum } => (lr, momentum, true),
        };
        let OuterState::Running { prev, velocity } = &mut self.state else {
            // First round: g = 0, so v = 0 and the consensus stands.
            let mut prev = Vec::with_capacity(consensus.len());
            let mut velocity = Vec::with_capacity(consensus.len());
            for c in consensus.iter() {
                prev.push(c.try_clone(stream)?);
                velocity.push(Tensor::zeros(c.shape(), DType::F32, stream)?);
            }
            self.state = OuterState::Running { prev, velocity };
            return Ok(());
        };
        if prev.len() != consensus.len() {
            return Err(TensorError::LengthMismatch {
                op: "outer step",
                expected: prev.len(),
                got: consensus.len(),
            });
        }
        for ((c, p), v) in consensus.iter_mut().zip(prev.iter_mut()).zip(velocity.iter_mut()) {
            // v ← μv + (prev − consensus)
            ops::scale(v, momentum, stream)?;
            ops::axpy(1.0, p, v, stream)?;
            ops::axpy(-1.0, c, v, stream)?;
            if nesterov {
                // prev − lr·(μv + prev − c) = (1 − lr)·prev + lr·c − lr·μ·v
                ops::lerp(c, p, 1.0 - lr, stream)?;
                ops::axpy(-lr * momentum, v, c, stream)?;
            } else {
                // prev − lr·v
                c.copy_from(p, stream)?;
                ops::axpy(-lr, v, c, stream)?;
            }
            p.copy_from(c, stream)?;
        }
        Ok(())
    }
}

/// Checks an EASGD blend factor: finite, in (0, 1].
///
/// # Errors
/// [`LogicError::InvalidValue`] otherwise.
pub(crate) fn check_easgd_alpha(alpha: f32) -> LogicResult<f32> {
    if alpha.is_finite() && alpha > 0.0 && alpha <= 1.0 {
        Ok(alpha)
    } else {
        Err(LogicError::InvalidValue { what: "EASGD alpha", value: f64::from(alpha) })
    }
}

/// EASGD blend on a rank: `local ← (1 − α)·local + α·average`, tensor by tensor (α = 1 is a
/// plain overwrite). Buffers are not blended: overwrite them.
///
/// # Errors
/// [`TensorError::LengthMismatch`] when the lists differ in length; the kernels' errors.
pub(crate) fn easgd_blend(
    local: &mut [Tensor],
    average: &[Tensor],
    alpha: f32,
    stream: &Stream,
) -> TensorResult<()> {
    if local.len() != average.len() {
        return Err(TensorError::LengthMismatch {
            op: "easgd_blend",
            expected: local.len(),
            got: average.len(),
        });
    }
    for (l, a) in local.iter_mut().zip(average) {
        if alpha == 1.0 {
            // Exactly the average (a lerp would round `l + (a − l)`).
            l.copy_from(a, stream)?;
        } else {
            ops::lerp(l, a, alpha, stream)?;
        }
    }
    Ok(())
}

/// The overlapped merge on a rank (`--overlap`): the consensus `consensus` of a round arrives
/// after the rank trained on from the parameters `sent` it snapshotted to `now`, and
/// `now ← now + μ·(consensus − sent)`, value by value. The rank keeps every step it trained
/// since its snapshot (those count in the next round's average) and moves by μ of the way its
/// own snapshot was from the consensus: μ = 1 is the delayed update (the consensus shifted by
/// the rank's progress since), μ < 1 keeps `1 − μ` of that distance (Streaming DiLoCo's mixing
/// factor, as a fraction of the consensus's correction). The lengths are the caller's to
/// match: the shortest of the three bounds the result.
pub(crate) fn overlap_merge(now: &[f32], consensus: &[f32], sent: &[f32], mix: f32) -> Vec<f32> {
    now.iter().zip(consensus).zip(sent).map(|((x, c), s)| x + mix * (c - s)).collect()
}

#[cfg(test)]
mod tests {
    //! Outer optimizers, EASGD and work weighting against closed forms on small tensors (CPU, and
    //! CUDA when present).

    use crate::LogicError;
    use crate::control::outer::{
        OuterKind, OuterOptimizer, check_easgd_alpha, easgd_blend, overlap_merge,
    };
    use crate::control::weighting::{average_weights, work_masses};
    use flodl_tensor::{Device, Stream, Tensor, gpu_skip_reason, skip_or_fail};
    use flodl_tensor::{Error as TensorError, Result as TensorResult, ops};
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// Writes into each `out[i]` the weighted sum over ranks of `replicas[r][i]`, skipping ranks of
    /// weight 0 (they take no part, whatever their values).
    ///
    /// # Errors
    /// [`TensorError::LengthMismatch`] when the weights do not match the ranks or a rank's tensor
    /// list does not match `out`; the kernels' shape, dtype and device errors.
    fn weighted_average(
        replicas: &[&[Tensor]],
        weights: &[f32],
        out: &mut [Tensor],
        stream: &Stream,
    ) -> TensorResult<()> {
        const OP: &str = "weighted_average";
        if weights.len() != replicas.len() {
            return Err(TensorError::LengthMismatch {
                op: OP,
                expected: replicas.len(),
                got: weights.len(),
            });
        }
        if let Some(bad) = replicas.iter().find(|r| r.len() != out.len()) {
            return Err(TensorError::LengthMismatch {
                op: OP,
                expected: out.len(),
                got: bad.len(),
            });
        }
        let movers: Vec<usize> = (0..replicas.len()).filter(|&r| weights[r] != 0.0).collect();
        let w: Vec<f32> = movers.iter().map(|&r| weights[r]).collect();
        for (i, o) in out.iter_mut().enumerate() {
            let inputs: Vec<&Tensor> = movers.iter().map(|&r| &replicas[r][i]).collect();
            ops::weighted_sum(&inputs, &w, o, stream)?;
        }
        Ok(())
    }

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
                        .map(|&n| {
                            (0..n).map(|_| f64::from(rng.random_range(-1.0f32..1.0))).collect()
                        })
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
                    vec![
                        (0..4).map(|_| rng.random_range(-2.0f32..2.0)).collect(),
                        vec![rng.random()],
                    ]
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

    /// The overlapped merge against an f64 reference on random states, mixing factors and
    /// worlds: each value is `now + μ·(consensus − sent)` within a few f32 roundings of its
    /// terms; and where the consensus is the work-weighted average of the snapshots, the
    /// weighted average of the merged states is that of the states now, for every μ (the merge
    /// moves no rank's weight, it only contracts the spread of the snapshots by μ).
    #[test]
    fn overlap_merge_matches_an_f64_reference() -> TestResult {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(27);
        for case in 0..200 {
            let ranks = rng.random_range(1..5usize);
            let n = rng.random_range(1..300usize);
            let mix = if case % 4 == 0 { 1.0 } else { rng.random_range(0.05f32..1.0) };
            let mut state = |scale: f32| -> Vec<f32> {
                (0..n).map(|_| rng.random_range(-scale..scale)).collect()
            };
            let sent: Vec<Vec<f32>> = (0..ranks).map(|_| state(2.0)).collect();
            let drift: Vec<Vec<f32>> = (0..ranks).map(|_| state(0.1)).collect();
            let steps: Vec<u64> = (0..ranks).map(|r| 1 + r as u64 * 3).collect();
            let w = work_masses(&steps, 1.0)?;
            let total: f64 = w.iter().sum();
            let w: Vec<f64> = w.iter().map(|m| m / total).collect();
            let consensus: Vec<f32> = (0..n)
                .map(|i| (0..ranks).map(|r| w[r] * f64::from(sent[r][i])).sum::<f64>() as f32)
                .collect();
            let mut merged_mean = vec![0f64; n];
            let mut now_mean = vec![0f64; n];
            for r in 0..ranks {
                let now: Vec<f32> = sent[r].iter().zip(&drift[r]).map(|(s, d)| s + d).collect();
                let merged = overlap_merge(&now, &consensus, &sent[r], mix);
                assert_eq!(merged.len(), n);
                for i in 0..n {
                    let (x, c, s) =
                        (f64::from(now[i]), f64::from(consensus[i]), f64::from(sent[r][i]));
                    let reference = x + f64::from(mix) * (c - s);
                    let bound = 4.0 * f64::from(f32::EPSILON) * (x.abs() + c.abs() + s.abs());
                    let err = (f64::from(merged[i]) - reference).abs();
                    assert!(err <= bound, "case {case} rank {r} [{i}]: {err} > {bound}");
                    merged_mean[i] += w[r] * f64::from(merged[i]);
                    now_mean[i] += w[r] * x;
                }
            }
            for i in 0..n {
                let err = (merged_mean[i] - now_mean[i]).abs();
                assert!(err <= 1e-5, "case {case} [{i}]: the weighted average moved by {err}");
            }
        }
        Ok(())
    }
}

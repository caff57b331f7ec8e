//! Averaging refinements on CPU ranks: work weighting γ, the divergence guard, outer
//! optimizers, EASGD and gradient clipping, wired through the runtime.

use crate::common::{TestResult, train_subset};

use std::sync::Arc;
use std::time::Duration;

use flodl_data::Dataset;
use flodl_ddp::control::guard::{GrowthGuard, Guard, ReduceReport, TrendGuard};
use flodl_ddp::control::outer::OuterKind;
use flodl_ddp::control::weighting::average_weights;
use flodl_ddp::{
    Backend, Batch, Capability, Devices, ElCheKnobs, Error, FailureKind, Mlp, MlpConfig, Optimizer,
    Policy, ReduceEvent, Replica, ReplicaContext, Result, Trainer, TrainerOption, Verdict,
};
use flodl_tensor::{DType, Tensor};

fn trainer(ranks: usize, policy: Policy, backend: Backend, data: Arc<dyn Dataset>) -> Trainer {
    Trainer::new(Mlp::factory(MlpConfig::new(&[784, 64, 10], Optimizer::sgd(0.9))))
        .dataset(data)
        .batch_size(32)
        .epochs(2)
        .devices(Devices::Cpu(ranks))
        .policy(policy)
        .backend(backend)
        .learning_rate(0.05)
        .stall_timeout(Duration::from_secs(60))
}

const BACKENDS: [Backend; 2] = [Backend::Collective, Backend::Host];

/// A replica whose single parameter counts its optimizer steps (`p += 1` per step), so the
/// consensus after a run is a closed form of the step counts each reduce saw.
struct Counter {
    p: Vec<Tensor>,
}

impl Counter {
    fn factory(ctx: &ReplicaContext) -> Result<Counter> {
        let p = vec![Tensor::zeros(&[1], DType::F32, &ctx.stream)?];
        Ok(Counter { p })
    }
}

impl Replica for Counter {
    fn train_step(&mut self, _batch: &Batch) -> Result<f32> {
        Ok(1.0)
    }
    fn step(&mut self, _lr: f32) -> Result<()> {
        for x in self.p[0].as_mut_slice::<f32>()? {
            *x += 1.0;
        }
        Ok(())
    }
    fn parameters(&self) -> &[Tensor] {
        &self.p
    }
    fn parameters_mut(&mut self) -> &mut [Tensor] {
        &mut self.p
    }
}

/// Runs `trainer` to the end and returns its final state and every reduce event.
fn run_with_events(
    trainer: Trainer,
) -> std::result::Result<(flodl_ddp::TrainedState, Vec<ReduceEvent>), Box<dyn std::error::Error>> {
    let mut h = trainer.run()?;
    // Blocks until every epoch is reported; the run's events are then all queued.
    while h.next_metrics(Duration::from_secs(60)).is_some() {}
    let events = h.poll_reduce_events();
    let state = h.join()?;
    Ok((state, events))
}

/// On both backends, with unequal step counts (a 3× skewed rank under `Cadence`), the
/// consensus is weighted by `steps^γ`: a step-counting parameter ends at
/// `Σ_reduces Σ_r w_r(γ)·n_r`, with the weights in closed form from each reduce's counts.
#[test]
fn work_weighting_follows_gamma_on_both_backends() -> TestResult {
    let data = train_subset(2048);
    for backend in BACKENDS {
        for gamma in [0.0, 0.5, 1.0, 2.0] {
            let t = Trainer::new(Counter::factory)
                .dataset(data.clone())
                .batch_size(16)
                .epochs(2)
                .devices(Devices::Cpu(2))
                .policy(Policy::Cadence)
                .backend(backend)
                .gamma(gamma)
                .slowdown(vec![1.0, 3.0])
                .elche(ElCheKnobs { anchor: 4, speed_hint: Some((1, 3.0)), ..Default::default() })
                .stall_timeout(Duration::from_secs(60));
            let (state, events) = run_with_events(t)?;
            assert_eq!(events.len() as u64, state.reduces, "{backend:?} γ {gamma}");
            let mut want = 0.0f64;
            let mut unequal = false;
            for e in &events {
                let steps: Vec<u64> = e.steps.iter().map(|&s| s as u64).collect();
                unequal |= steps[0] != steps[1];
                let w = average_weights(&steps, gamma)?.ok_or("a reduce with no step")?;
                want += w
                    .params
                    .iter()
                    .zip(&steps)
                    .map(|(&w, &n)| f64::from(w) * n as f64)
                    .sum::<f64>();
            }
            assert!(unequal, "{backend:?} γ {gamma}: the skew gave equal counts {events:?}");
            let got = f64::from(state.params[0].data[0]);
            assert!(
                (got - want).abs() <= 1e-4 * want.max(1.0),
                "{backend:?} γ {gamma}: consensus {got} vs closed form {want}"
            );
        }
    }
    Ok(())
}

/// γ = 0 and γ = 1 both train an MLP to finite parameters on both backends, and the weighting
/// changes the result.
#[test]
fn gamma_zero_and_one_train_to_different_finite_models() -> TestResult {
    let data = train_subset(3072);
    for backend in BACKENDS {
        let mut finals = Vec::new();
        for gamma in [0.0, 1.0] {
            let state = trainer(2, Policy::Cadence, backend, data.clone())
                .gamma(gamma)
                .slowdown(vec![1.0, 3.0])
                .elche(ElCheKnobs { speed_hint: Some((1, 3.0)), ..Default::default() })
                .run()?
                .join()?;
            let last = state.epochs.last().ok_or("no epoch")?;
            assert!(last.avg_loss < 0.8, "{backend:?} γ {gamma}: loss {}", last.avg_loss);
            let flat: Vec<f32> = state.params.iter().flat_map(|t| t.data.iter().copied()).collect();
            assert!(flat.iter().all(|x| x.is_finite()), "{backend:?} γ {gamma}");
            finals.push(flat);
        }
        assert_ne!(finals[0], finals[1], "{backend:?}: γ made no difference");
    }
    Ok(())
}

/// A negative or non-finite γ is a configuration error.
#[test]
fn bad_gamma_is_rejected() -> TestResult {
    for gamma in [-1.0, f64::NAN, f64::INFINITY] {
        let r = trainer(2, Policy::Cadence, Backend::Host, train_subset(256)).gamma(gamma).run();
        assert!(matches!(r, Err(Error::Invalid(_))), "γ {gamma}");
    }
    Ok(())
}

/// The guard sees each reduce's divergence `max_r ‖W_pre − W_post‖ / ‖W_post‖` on both
/// backends: with a step-counting parameter it is `max_r |P + n_r − P'| / |P'|` in closed form
/// (`P`, `P'` the consensus before and after), one reading per reduce, and the verdicts are
/// those of a fresh guard replaying the readings.
#[test]
fn guard_reads_the_divergence_of_every_reduce() -> TestResult {
    let data = train_subset(2048);
    for backend in BACKENDS {
        let guard = Guard::Both(TrendGuard::new(0.0), GrowthGuard::new());
        let t = Trainer::new(Counter::factory)
            .dataset(data.clone())
            .batch_size(16)
            .epochs(2)
            .devices(Devices::Cpu(2))
            .policy(Policy::Cadence)
            .backend(backend)
            .guard(guard.clone())
            .slowdown(vec![1.0, 3.0])
            .elche(ElCheKnobs { anchor: 4, speed_hint: Some((1, 3.0)), ..Default::default() })
            .stall_timeout(Duration::from_secs(60));
        let mut h = t.run()?;
        while h.next_metrics(Duration::from_secs(60)).is_some() {}
        let events = h.poll_reduce_events();
        let guards = h.poll_guard_events();
        let state = h.join()?;
        assert_eq!(guards.len() as u64, state.reduces, "{backend:?}: one reading per reduce");
        let mut replay = guard;
        let mut p = 0.0f64;
        for (e, g) in events.iter().zip(&guards) {
            assert_eq!(e.round, g.round, "{backend:?}");
            let steps: Vec<u64> = e.steps.iter().map(|&s| s as u64).collect();
            let w = average_weights(&steps, 1.0)?.ok_or("a reduce with no step")?;
            let next = p + w
                .params
                .iter()
                .zip(&steps)
                .map(|(&w, &n)| f64::from(w) * n as f64)
                .sum::<f64>();
            let want = steps
                .iter()
                .filter(|&&n| n > 0)
                .map(|&n| (p + n as f64 - next).abs() / next.abs())
                .fold(0.0, f64::max);
            assert!(
                (g.divergence - want).abs() <= 1e-4 * want.max(1e-3),
                "{backend:?} round {}: divergence {} vs {want}",
                g.round,
                g.divergence
            );
            assert_eq!(g.k_max, steps.iter().copied().max().unwrap_or(0), "{backend:?}");
            let verdict = replay.report(&ReduceReport { divergence: g.divergence, k_max: g.k_max });
            assert_eq!(g.verdict, verdict, "{backend:?} round {}", g.round);
            p = next;
        }
    }
    Ok(())
}

/// With the default guard an MLP run on every non-`Sync` mode records a finite divergence per
/// reduce and finishes; under `Sync` or with the guard off nothing is measured.
#[test]
fn default_guard_records_divergences_and_finishes() -> TestResult {
    let data = train_subset(3072);
    for backend in BACKENDS {
        for policy in [Policy::Cadence, Policy::Async, Policy::Sync] {
            for off in [false, true] {
                let mut t = trainer(2, policy, backend, data.clone()).slowdown(vec![1.0, 2.0]);
                if off {
                    t = t.guard(Guard::Off);
                }
                let mut h = t.run()?;
                while h.next_metrics(Duration::from_secs(60)).is_some() {}
                let guards = h.poll_guard_events();
                let state = h.join()?;
                let what = format!("{policy:?} {backend:?} off {off}");
                let last = state.epochs.last().ok_or("no epoch")?;
                assert!(last.avg_loss < 0.6, "{what}: loss {}", last.avg_loss);
                if off || policy == Policy::Sync {
                    assert!(guards.is_empty(), "{what}: {guards:?}");
                } else {
                    assert_eq!(guards.len() as u64, state.reduces, "{what}");
                    assert!(
                        guards.iter().all(|g| g.divergence.is_finite() && g.divergence >= 0.0),
                        "{what}: {guards:?}"
                    );
                    assert!(guards.iter().any(|g| g.divergence > 0.0), "{what}: {guards:?}");
                }
            }
        }
    }
    Ok(())
}

/// SlowMo and DiLoCo (Nesterov) outer optimizers train below a loss threshold on 2 ranks, on
/// both backends.
#[test]
fn outer_optimizers_train_on_both_backends() -> TestResult {
    let data = train_subset(3072);
    for backend in BACKENDS {
        for outer in [OuterKind::slow_momentum(), OuterKind::nesterov()] {
            let state = trainer(2, Policy::Cadence, backend, data.clone())
                .outer(outer)
                .epochs(3)
                .run()?
                .join()?;
            let last = state.epochs.last().ok_or("no epoch")?;
            let what = format!("{backend:?} {outer:?}");
            assert!(last.avg_loss < 0.8, "{what}: loss {}", last.avg_loss);
            assert!(state.params.iter().all(|t| t.data.iter().all(|x| x.is_finite())), "{what}");
        }
    }
    Ok(())
}

/// Under `Sync` on 2 ranks the collective (every rank steps its own outer optimizer) and the
/// host backend (the coordinator steps it once) run the same math: the final parameters agree
/// within 1e-5 relative, for every outer optimizer; and the outer optimizer changes the result.
#[test]
fn outer_optimizer_is_the_same_math_on_both_backends() -> TestResult {
    let data = train_subset(1024);
    let kinds = [
        OuterKind::Average,
        OuterKind::SlowMomentum { lr: 1.0, momentum: 0.5 },
        OuterKind::Nesterov { lr: 0.7, momentum: 0.5 },
    ];
    let mut by_kind = Vec::new();
    for outer in kinds {
        let mut finals = Vec::new();
        for backend in BACKENDS {
            let state = trainer(2, Policy::Sync, backend, data.clone())
                .learning_rate(0.01)
                .epochs(1)
                .outer(outer)
                .run()?
                .join()?;
            let flat: Vec<f64> =
                state.params.iter().flat_map(|t| t.data.iter().map(|&x| f64::from(x))).collect();
            assert!(flat.iter().all(|x| x.is_finite()), "{outer:?} {backend:?}");
            finals.push(flat);
        }
        let diff: f64 = finals[0].iter().zip(&finals[1]).map(|(a, b)| (a - b).powi(2)).sum();
        let norm: f64 = finals[1].iter().map(|b| b * b).sum();
        let rel = (diff / norm).sqrt();
        assert!(rel <= 1e-5, "{outer:?}: collective vs host differ by {rel} relative");
        by_kind.push(finals.swap_remove(0));
    }
    assert_ne!(by_kind[0], by_kind[1], "SlowMo made no difference");
    assert_ne!(by_kind[0], by_kind[2], "Nesterov made no difference");
    Ok(())
}

/// A bad outer learning rate or momentum is a configuration error.
#[test]
fn bad_outer_optimizer_is_rejected() -> TestResult {
    for outer in [
        OuterKind::SlowMomentum { lr: 0.0, momentum: 0.9 },
        OuterKind::Nesterov { lr: 0.7, momentum: 1.0 },
        OuterKind::Nesterov { lr: f32::NAN, momentum: 0.5 },
    ] {
        let r = trainer(2, Policy::Cadence, Backend::Host, train_subset(256)).outer(outer).run();
        assert!(matches!(r, Err(Error::Invalid(_))), "{outer:?}");
    }
    Ok(())
}

/// EASGD blending on `Async` + host trains an MLP below a loss threshold for α = 0.5 and 0.25.
#[test]
fn easgd_trains_on_async_host() -> TestResult {
    let data = train_subset(3072);
    for alpha in [0.5, 0.25] {
        let state = trainer(2, Policy::Async, Backend::Host, data.clone())
            .easgd(alpha)
            .slowdown(vec![1.0, 2.0])
            .epochs(3)
            .run()?
            .join()?;
        let last = state.epochs.last().ok_or("no epoch")?;
        assert!(last.avg_loss < 0.8, "α {alpha}: loss {}", last.avg_loss);
        assert!(state.params.iter().all(|t| t.data.iter().all(|x| x.is_finite())), "α {alpha}");
    }
    Ok(())
}

/// α = 1 is the plain averaging update, bitwise (a deterministic `Sync` run on the host
/// backend), while α < 1 changes the result.
#[test]
fn easgd_alpha_one_is_the_plain_average_bitwise() -> TestResult {
    let data = train_subset(1024);
    let run = |alpha: Option<f32>| -> std::result::Result<Vec<u32>, Box<dyn std::error::Error>> {
        let mut t = trainer(2, Policy::Sync, Backend::Host, data.clone()).epochs(1);
        if let Some(a) = alpha {
            t = t.easgd(a);
        }
        let state = t.run()?.join()?;
        Ok(state.params.iter().flat_map(|t| t.data.iter().map(|x| x.to_bits())).collect())
    };
    let plain = run(None)?;
    assert_eq!(run(Some(1.0))?, plain, "α = 1 differs from the plain update");
    assert_ne!(run(Some(0.5))?, plain, "α = 0.5 made no difference");
    Ok(())
}

/// An EASGD α outside (0, 1], or EASGD on the collective backend, is a configuration error.
#[test]
fn bad_easgd_is_rejected() -> TestResult {
    let data = train_subset(256);
    for (alpha, backend) in [
        (0.0, Backend::Host),
        (1.5, Backend::Host),
        (f32::NAN, Backend::Host),
        (0.5, Backend::Collective),
    ] {
        let r = trainer(2, Policy::Async, backend, data.clone()).easgd(alpha).run();
        assert!(matches!(r, Err(Error::Invalid(_))), "α {alpha} {backend:?}");
    }
    Ok(())
}

/// Gradient clipping by global norm per rank (deterministic `Sync` runs on both backends): a
/// huge maximum norm leaves the run bitwise unchanged, a tiny one changes the trajectory.
#[test]
fn gradient_clipping_by_global_norm() -> TestResult {
    let data = train_subset(1024);
    for backend in BACKENDS {
        let run = |max: Option<f32>| -> std::result::Result<Vec<u32>, Box<dyn std::error::Error>> {
            let mut t = trainer(2, Policy::Sync, backend, data.clone()).epochs(1);
            if let Some(m) = max {
                t = t.max_grad_norm(m);
            }
            let state = t.run()?.join()?;
            Ok(state.params.iter().flat_map(|t| t.data.iter().map(|x| x.to_bits())).collect())
        };
        let plain = run(None)?;
        assert_eq!(run(Some(1e30))?, plain, "{backend:?}: a huge max norm changed the run");
        let clipped = run(Some(1e-3))?;
        assert_ne!(clipped, plain, "{backend:?}: a tiny max norm changed nothing");
        assert!(clipped.iter().all(|&b| f32::from_bits(b).is_finite()), "{backend:?}");
    }
    Ok(())
}

/// A [`Counter`] that exposes gradients of the given shape.
struct Exposing {
    inner: Counter,
    g: Vec<Tensor>,
}

impl Exposing {
    fn factory(shape: &'static [usize]) -> impl Fn(&ReplicaContext) -> Result<Exposing> {
        move |ctx| {
            let g = vec![Tensor::zeros(shape, DType::F32, &ctx.stream)?];
            Ok(Exposing { inner: Counter::factory(ctx)?, g })
        }
    }
}

impl Replica for Exposing {
    fn train_step(&mut self, batch: &Batch) -> Result<f32> {
        self.inner.train_step(batch)
    }
    fn step(&mut self, lr: f32) -> Result<()> {
        self.inner.step(lr)
    }
    fn parameters(&self) -> &[Tensor] {
        self.inner.parameters()
    }
    fn parameters_mut(&mut self) -> &mut [Tensor] {
        self.inner.parameters_mut()
    }
    fn gradients_mut(&mut self) -> Option<&mut [Tensor]> {
        Some(&mut self.g)
    }
}

/// What `run()` answers for clipping with a replica of each kind.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// The run starts and ends well.
    Runs,
    /// `Error::MissingCapability` naming the option and the capability, from `run()`.
    Missing,
    /// A replica mismatch, from `run()` (a rank's failure in a world of several).
    Mismatch,
}

/// Gradient clipping needs mutable gradients, one per parameter of its shape: what the option
/// needs is checked when the replicas are built, so `run()` itself refuses a replica that does
/// not offer them (a typed error naming the option and the capability) instead of the run
/// failing at its first step; in a world of one (no coordinator) and of two alike. A
/// non-positive maximum norm is a configuration error.
#[test]
fn clipping_needs_mutable_gradients_checked_at_run_and_a_positive_norm() -> TestResult {
    let data = train_subset(512);
    type Factory = Box<dyn Fn(&ReplicaContext) -> Result<Box<dyn Replica>> + Send + Sync>;
    let none: fn() -> Factory = || Box::new(|ctx| Ok(Box::new(Counter::factory(ctx)?)));
    let shaped = |shape: &'static [usize]| -> Factory {
        let f = Exposing::factory(shape);
        Box::new(move |ctx| Ok(Box::new(f(ctx)?)))
    };
    let cases: [(&str, Factory, Answer); 3] = [
        ("no gradients", none(), Answer::Missing),
        ("gradients of another shape", shaped(&[2]), Answer::Mismatch),
        ("gradients", shaped(&[1]), Answer::Runs),
    ];
    for (what, factory, answer) in cases {
        let factory = Arc::new(factory);
        for ranks in [1, 2] {
            let f = factory.clone();
            let r = Trainer::new(move |ctx: &ReplicaContext| f(ctx))
                .dataset(data.clone())
                .batch_size(16)
                .epochs(1)
                .devices(Devices::Cpu(ranks))
                .max_grad_norm(1.0)
                .stall_timeout(Duration::from_secs(60))
                .max_failures(0)
                .run();
            let ok = match (answer, &r) {
                (Answer::Runs, Ok(_)) => true,
                (
                    Answer::Missing,
                    Err(Error::MissingCapability {
                        option: TrainerOption::MaxGradNorm,
                        capability: Capability::MutableGradients,
                    }),
                ) => true,
                (Answer::Mismatch, Err(Error::ReplicaMismatch { .. })) => true,
                (Answer::Mismatch, Err(Error::Rank { failure, .. })) => {
                    failure.kind == FailureKind::ReplicaMismatch
                }
                _ => false,
            };
            assert!(ok, "{what}, {ranks} ranks: expected {answer:?}, got {:?}", r.as_ref().err());
            if let Ok(handle) = r {
                handle.join()?;
            }
        }
    }
    let missing = Error::MissingCapability {
        option: TrainerOption::MaxGradNorm,
        capability: Capability::MutableGradients,
    };
    let text = missing.to_string();
    assert!(text.contains("max_grad_norm") && text.contains("gradients_mut"), "{text}");
    for bad in [0.0, -1.0, f32::NAN] {
        let r = trainer(2, Policy::Sync, Backend::Host, data.clone()).max_grad_norm(bad).run();
        assert!(matches!(r, Err(Error::Invalid(_))), "max norm {bad}");
    }
    Ok(())
}

/// A replica whose ranks drift apart ever faster: the second parameter moves by a step size
/// that grows `DRIFT_GROWTH`-fold at every reduce the rank sees (+ on rank 0, − on the
/// others), the first stays 1, so the replicas' divergence grows geometrically per reduce.
///
/// The growth is per reduce, not per step: with a growth per step, a window shorter than the
/// previous one (a loaded machine splits the steps differently) shrank the divergence, the
/// guard's streak broke, and the run sometimes saw no nudge at all.
struct Drifter {
    p: Vec<Tensor>,
    sign: f32,
    /// Reduces this rank has seen (its parameter changed under it since its last step).
    reduces: i32,
    /// The drift coordinate as this rank last wrote it.
    last: f32,
}

/// Drift per step before the first reduce: a window's divergence starts above the guard's
/// floor (`MIN_DIVERGENCE`, 1e-8), and `DRIFT_GROWTH^MAX_GROWTHS` times it stays far below the
/// other coordinate (1), so the averaged parameters' norm stays about 1.
const DRIFT_SEED: f32 = 1e-8;
/// Growth of the drift per step from one reduce to the next.
const DRIFT_GROWTH: f32 = 10.0;
/// Reduces after which the drift stops growing.
const MAX_GROWTHS: i32 = 5;

impl Drifter {
    fn factory(ctx: &ReplicaContext) -> Result<Drifter> {
        let p = vec![Tensor::from_slice(&[1.0f32, 0.0], &[2], &ctx.stream)?];
        let sign = if ctx.rank == 0 { 1.0 } else { -1.0 };
        Ok(Drifter { p, sign, reduces: 0, last: 0.0 })
    }
}

impl Replica for Drifter {
    fn train_step(&mut self, _batch: &Batch) -> Result<f32> {
        // Steps of about the same length on both ranks, so neither window is many times the
        // other's.
        std::thread::sleep(Duration::from_millis(1));
        Ok(1.0)
    }
    /// The two ranks drift apart by `DRIFT_SEED × DRIFT_GROWTH^n` per step, `n` the reduces
    /// seen: each reduce's divergence is at least `DRIFT_GROWTH / (2 × steps ratio)` times the
    /// previous one's, so the guard's growth rate stays far above its nudge threshold however
    /// the ranks' steps fall into windows (the guard's input does not depend on timing).
    fn step(&mut self, _lr: f32) -> Result<()> {
        let s = self.p[0].as_mut_slice::<f32>()?;
        if s[1] != self.last && self.reduces < MAX_GROWTHS {
            self.reduces += 1;
        }
        s[1] += self.sign * DRIFT_SEED * DRIFT_GROWTH.powi(self.reduces);
        self.last = s[1];
        Ok(())
    }
    fn parameters(&self) -> &[Tensor] {
        &self.p
    }
    fn parameters_mut(&mut self) -> &mut [Tensor] {
        &mut self.p
    }
}

/// Growing divergence makes the growth-rate guard answer `NudgeDown`, and ElChe obeys it at
/// the next reduce: that reduce's anchor is `ceil(anchor / 2)`, on both backends.
#[test]
fn elche_obeys_the_guards_nudge() -> TestResult {
    let data = train_subset(4096);
    for backend in BACKENDS {
        let t = Trainer::new(Drifter::factory)
            .dataset(data.clone())
            .batch_size(16)
            .epochs(1)
            .devices(Devices::Cpu(2))
            .policy(Policy::Cadence)
            .backend(backend)
            .guard(Guard::Growth(GrowthGuard::new()))
            // A pinned anchor keeps the windows short, so the run has many reduces.
            .elche(ElCheKnobs { anchor: 8, max_anchor: 8, ..Default::default() })
            .stall_timeout(Duration::from_secs(60));
        let mut h = t.run()?;
        while h.next_metrics(Duration::from_secs(60)).is_some() {}
        let events = h.poll_reduce_events();
        let guards = h.poll_guard_events();
        h.join()?;
        let mut nudges = 0;
        for (i, g) in guards.iter().enumerate() {
            if !matches!(g.verdict, Verdict::NudgeDown { .. }) {
                continue;
            }
            let (Some(now), Some(next)) = (events.get(i), events.get(i + 1)) else { continue };
            assert_eq!(now.round, g.round, "{backend:?}");
            assert_eq!(
                next.anchor,
                now.anchor.div_ceil(2).max(1),
                "{backend:?}: after a nudge at round {} {events:?}",
                g.round
            );
            nudges += 1;
        }
        assert!(nudges > 0, "{backend:?}: no nudge was obeyed: {guards:?}");
    }
    Ok(())
}

//! LR schedules, cohort steps and the linear scaling rule against hand-computed values.

use flodl_ddp::LogicError;
use flodl_ddp::control::schedule::{Schedule, advance_global_step, cohort_step, lr_scale};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn check(schedule: &Schedule, cases: &[(u64, f64)]) {
    for &(step, want) in cases {
        let got = schedule.lr(step);
        assert!(
            (got - want).abs() <= 1e-12 * want.abs().max(1.0),
            "{schedule:?} step {step}: {got} vs {want}"
        );
    }
}

#[test]
fn schedules_by_hand() -> TestResult {
    check(&Schedule::Constant { lr: 0.1 }, &[(0, 0.1), (1_000_000, 0.1)]);
    check(
        &Schedule::Step { lr: 0.1, every: 10, gamma: 0.5 },
        &[(0, 0.1), (9, 0.1), (10, 0.05), (25, 0.025)],
    );
    check(
        &Schedule::MultiStep { lr: 1.0, milestones: vec![30, 10], gamma: 0.1 },
        &[(9, 1.0), (10, 0.1), (29, 0.1), (30, 0.01)],
    );
    check(&Schedule::Exponential { lr: 2.0, gamma: 0.5 }, &[(0, 2.0), (3, 0.25)]);
    check(
        &Schedule::Cosine { lr: 1.0, min_lr: 0.0, total: 100 },
        &[(0, 1.0), (50, 0.5), (100, 0.0), (200, 0.0)],
    );
    check(&Schedule::Cosine { lr: 1.0, min_lr: 0.1, total: 100 }, &[(50, 0.55)]);
    check(
        &Schedule::Constant { lr: 0.8 }.with_warmup(4),
        &[(0, 0.2), (1, 0.4), (3, 0.8), (4, 0.8), (40, 0.8)],
    );
    check(
        &Schedule::Step { lr: 1.0, every: 2, gamma: 0.5 }.with_warmup(5),
        &[(0, 0.2), (4, 1.0), (5, 1.0), (7, 0.5)],
    );
    // Peak 1, start 0.04, end 4e-6; rise over 30 steps, cosine over 70.
    check(
        &Schedule::one_cycle(1.0, 100),
        &[(0, 0.04), (15, 0.52), (30, 1.0), (65, 0.500002), (100, 4e-6), (1000, 4e-6)],
    );
    Ok(())
}

#[test]
fn step_schedules_match_repeated_multiplication() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(9);
    for _ in 0..500 {
        let lr = rng.random_range(1e-4..1.0);
        let gamma = rng.random_range(0.1..1.0);
        let every = rng.random_range(1..50u64);
        let step = rng.random_range(0..2000u64);
        let mut reference = lr;
        for s in 1..=step {
            if s % every == 0 {
                reference *= gamma;
            }
        }
        let got = Schedule::Step { lr, every, gamma }.lr(step);
        assert!((got - reference).abs() <= 1e-9 * reference.max(1e-300), "{got} vs {reference}");
        let mut exp = lr;
        for _ in 0..step.min(200) {
            exp *= gamma;
        }
        let e = Schedule::Exponential { lr, gamma }.lr(step.min(200));
        assert!((e - exp).abs() <= 1e-9 * exp.max(1e-300));
        // Cosine stays within [min, lr] and never rises.
        let total = rng.random_range(1..500u64);
        let cos = Schedule::Cosine { lr, min_lr: lr / 10.0, total };
        let (a, b) = (cos.lr(step), cos.lr(step + 1));
        assert!(b <= a + 1e-15 && a <= lr + 1e-15 && a >= lr / 10.0 - 1e-15);
    }
    Ok(())
}

#[test]
fn validation_and_serde() -> TestResult {
    let bad = [
        Schedule::Constant { lr: -1.0 },
        Schedule::Step { lr: 0.1, every: 0, gamma: 0.5 },
        Schedule::Exponential { lr: 0.1, gamma: f64::NAN },
        Schedule::Cosine { lr: 0.1, min_lr: 0.0, total: 0 },
        Schedule::OneCycle { max_lr: 0.1, total: 10, warmup: 1.0, div: 25.0, final_div: 1e4 },
        Schedule::Constant { lr: f64::INFINITY }.with_warmup(3),
    ];
    for s in bad {
        assert!(matches!(s.validate(), Err(LogicError::InvalidValue { .. })), "{s:?}");
    }
    let good = Schedule::one_cycle(0.05, 1000).with_warmup(10);
    good.validate()?;
    let json = serde_json::to_string(&good)?;
    assert_eq!(serde_json::from_str::<Schedule>(&json)?, good);
    Ok(())
}

#[test]
fn cohort_steps_and_scaling() {
    assert_eq!(cohort_step(100, 7), 107);
    assert_eq!(advance_global_step(100, &[25, 10, 0]), 135);
    let cases = [(4, 1.0, 4.0), (4, 0.5, 2.5), (1, 1.0, 1.0), (4, 0.0, 1.0), (3, -1.0, 1.0)];
    for (w, ratio, want) in cases {
        assert_eq!(lr_scale(w, ratio), want, "world {w} ratio {ratio}");
    }
}

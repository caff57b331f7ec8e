//! Policies, backends, the reduce trigger and the throttle rule against hand-computed cases.

use flodl_ddp::LogicError;
use flodl_ddp::control::elche::Membership;
use flodl_ddp::control::policy::{Backend, Policy};
use flodl_ddp::control::policy::{
    Cohort, Trigger, Window, should_reduce, throttle, throttle_all_on_request,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const A: Membership = Membership::Alive;
const R: Membership = Membership::Retired;

#[test]
fn names_round_trip() -> TestResult {
    for p in Policy::ALL {
        assert_eq!(p.to_string().parse::<Policy>()?, p);
    }
    for b in Backend::ALL {
        assert_eq!(b.to_string().parse::<Backend>()?, b);
    }
    assert_eq!(" Cadence ".parse::<Policy>()?, Policy::Cadence);
    assert_eq!("HOST".parse::<Backend>()?, Backend::Host);
    assert!(matches!("nccl".parse::<Backend>(), Err(LogicError::Parse { .. })));
    assert!(matches!("often".parse::<Policy>(), Err(LogicError::Parse { .. })));
    assert_eq!((Policy::default(), Backend::default()), (Policy::Cadence, Backend::Collective));
    let json = serde_json::to_string(&(Policy::Async, Backend::Host))?;
    assert_eq!(serde_json::from_str::<(Policy, Backend)>(&json)?, (Policy::Async, Backend::Host));
    Ok(())
}

#[test]
fn windows_and_lookahead() {
    let cases = [
        (Policy::Sync, Window { round: 7, target: 1, limit: 1 }, 0, false),
        (Policy::Cadence, Window { round: 7, target: 25, limit: 25 }, 0, true),
        (Policy::Async, Window { round: 7, target: 25, limit: 28 }, 1, true),
    ];
    for (p, w, look, progressive) in cases {
        assert_eq!(p.window(7, 25, 3), w, "{p}");
        assert_eq!(p.lookahead(), look);
        assert_eq!(p.is_progressive(), progressive);
    }
}

#[test]
fn trigger_cases() -> TestResult {
    // (policy, steps, compute ms, counts, membership, anchor wall ms, in flight, expected)
    type Case = (Policy, [u64; 3], [f64; 3], [usize; 3], [Membership; 3], f64, bool, Trigger);
    let fire = Trigger::Fire;
    let wait = |rank| Trigger::Waiting { rank };
    let cases: [Case; 13] = [
        (Policy::Sync, [1, 1, 1], [1.0; 3], [1; 3], [A; 3], 0.0, false, fire),
        (Policy::Sync, [3, 0, 1], [1.0; 3], [1; 3], [A; 3], 0.0, false, wait(1)),
        (Policy::Sync, [3, 0, 1], [1.0; 3], [1; 3], [A, R, A], 0.0, false, fire),
        (Policy::Sync, [3, 3, 1], [1.0; 3], [1; 3], [A; 3], 0.0, true, Trigger::RoundInFlight),
        (Policy::Sync, [3, 3, 1], [1.0; 3], [1; 3], [R; 3], 0.0, false, Trigger::NoLiveRank),
        (Policy::Async, [25, 10, 9], [0.0; 3], [25, 10, 10], [A; 3], 0.0, false, wait(2)),
        (Policy::Async, [27, 10, 10], [0.0; 3], [25, 10, 10], [A; 3], 0.0, false, fire),
        // Cadence, uncalibrated: counts only.
        (Policy::Cadence, [25, 9, 10], [99.0; 3], [25, 10, 10], [A; 3], 0.0, false, wait(1)),
        (Policy::Cadence, [25, 10, 10], [0.0; 3], [25, 10, 10], [A; 3], 0.0, false, fire),
        // Calibrated: rank 1 is slower than estimated but has spent the window's 100 ms.
        (
            Policy::Cadence,
            [25, 8, 10],
            [100.0, 100.0, 90.0],
            [25, 10, 10],
            [A; 3],
            100.0,
            false,
            fire,
        ),
        (
            Policy::Cadence,
            [25, 8, 10],
            [100.0, 99.0, 90.0],
            [25, 10, 10],
            [A; 3],
            100.0,
            false,
            wait(1),
        ),
        // Rank 0 was faster than estimated: done by count though its clock is short.
        (
            Policy::Cadence,
            [25, 10, 10],
            [60.0, 100.0, 100.0],
            [25, 10, 10],
            [A; 3],
            100.0,
            false,
            fire,
        ),
        // A rank with no step never fires, whatever its clock.
        (
            Policy::Cadence,
            [25, 0, 10],
            [100.0, 500.0, 100.0],
            [25, 10, 10],
            [A; 3],
            100.0,
            false,
            wait(1),
        ),
    ];
    for (i, (policy, steps, ms, counts, membership, anchor_wall_ms, busy, want)) in
        cases.into_iter().enumerate()
    {
        let cohort = Cohort {
            steps: &steps,
            compute_ms: &ms,
            counts: &counts,
            membership: &membership,
            anchor_wall_ms,
        };
        assert_eq!(should_reduce(policy, &cohort, busy)?, want, "case {i}");
    }
    let short = Cohort {
        steps: &[1],
        compute_ms: &[1.0, 1.0],
        counts: &[1, 1],
        membership: &[A, A],
        anchor_wall_ms: 0.0,
    };
    assert!(matches!(
        should_reduce(Policy::Sync, &short, false),
        Err(LogicError::WorldMismatch { .. })
    ));
    Ok(())
}

#[test]
fn throttle_cases() -> TestResult {
    type Case = (Backend, Option<usize>, [u64; 3], [Membership; 3], [bool; 3], Vec<usize>);
    let cases: [Case; 6] = [
        (Backend::Host, Some(2), [5, 3, 6], [A; 3], [false; 3], vec![2]),
        (Backend::Host, Some(2), [5, 3, 6], [A; 3], [false, false, true], vec![]),
        (Backend::Host, Some(0), [5, 3, 6], [A; 3], [false; 3], vec![0, 2]),
        (Backend::Host, Some(0), [5, 3, 6], [A, R, A], [false; 3], vec![2]),
        (Backend::Host, None, [50, 3, 6], [A; 3], [false; 3], vec![]),
        (Backend::Collective, Some(0), [50, 3, 6], [A; 3], [false; 3], vec![]),
    ];
    for (i, (backend, diff, steps, membership, already, want)) in cases.into_iter().enumerate() {
        assert_eq!(throttle(backend, diff, &steps, &membership, &already)?, want, "case {i}");
    }
    let all: Vec<(Policy, Backend, bool)> = Policy::ALL
        .into_iter()
        .flat_map(|p| Backend::ALL.into_iter().map(move |b| (p, b, throttle_all_on_request(p, b))))
        .collect();
    assert_eq!(all.iter().filter(|(_, _, t)| *t).count(), 1);
    assert!(throttle_all_on_request(Policy::Sync, Backend::Host));
    Ok(())
}

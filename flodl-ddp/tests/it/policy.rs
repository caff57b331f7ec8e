//! Policies, backends, windows and the reduce trigger against hand-computed cases.

use std::time::Duration;

use flodl_ddp::LogicError;
use flodl_ddp::control::policy::{Backend, Policy, Trigger, Window, should_reduce};

type TestResult = Result<(), Box<dyn std::error::Error>>;

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
fn windows_by_policy() {
    let ms = |ms: u64| Some(Duration::from_millis(ms));
    let w = |target, limit, wall| Window { round: 7, target, limit, wall };
    // (policy, count, overshoot, anchor wall ms, window, progressive)
    let cases = [
        (Policy::Sync, 25, 3, 100.0, w(1, 1, None), false),
        (Policy::Cadence, 25, 3, 0.0, w(25, 25, None), true),
        (Policy::Cadence, 25, 3, 100.0, w(25, 25, ms(100)), true),
        (Policy::Cadence, 0, 3, f64::NAN, w(1, 1, None), true),
        (Policy::Async, 25, 3, 100.0, w(25, 28, None), true),
    ];
    for (p, count, overshoot, wall, want, progressive) in cases {
        assert_eq!(p.window(7, count, overshoot, wall), want, "{p} {count} {wall}");
        assert_eq!(p.is_progressive(), progressive);
    }
}

/// A follower's window stretches the count and the wall time by a quarter (at least one batch)
/// and keeps its overshoot; one ended early is reached where the rank stands, overshoot kept.
#[test]
fn following_and_cut_short_windows() {
    let ms = |ms: u64| Some(Duration::from_millis(ms));
    let w = |target, limit, wall| Window { round: 3, target, limit, wall };
    // (window, following)
    let cases = [
        (w(40, 40, ms(200)), w(50, 50, ms(250))),
        (w(41, 41, None), w(52, 52, None)),
        (w(1, 1, ms(8)), w(2, 2, ms(10))),
        (w(3, 3, None), w(4, 4, None)),
        // `Async`: the overshoot is kept past the stretched count, and past where it ends.
        (w(8, 20, None), w(10, 22, None)),
        (w(25, 28, None), w(32, 35, None)),
    ];
    for (window, want) in cases {
        assert_eq!(window.following(), want, "{window:?}");
        let over = window.limit - window.target;
        let cut = want.ended_at(7);
        assert_eq!((cut.target, cut.limit, cut.wall, cut.round), (7, 7 + over, want.wall, 3));
        assert!(cut.is_reached(7, 0.0) && !cut.is_reached(6, 0.0));
    }
}

#[test]
fn a_window_is_reached_by_count_or_by_wall_time() {
    let count = Window { round: 1, target: 10, limit: 10, wall: None };
    let timed = Window { wall: Some(Duration::from_millis(100)), ..count };
    // (window, steps, ms since the window opened, reached)
    let cases = [
        (count, 9, 1e9, false),
        (count, 10, 0.0, true),
        (timed, 9, 99.9, false),
        (timed, 3, 100.0, true),
        // Faster than estimated: done by count though its clock is short.
        (timed, 10, 60.0, true),
        // No step: never ready, whatever its clock.
        (timed, 0, 500.0, false),
    ];
    for (i, (w, steps, ms, want)) in cases.into_iter().enumerate() {
        assert_eq!(w.is_reached(steps, ms), want, "case {i}");
    }
}

#[test]
fn trigger_cases() -> TestResult {
    let fire = Trigger::Fire;
    let wait = |rank| Trigger::Waiting { rank };
    // (steps at readiness, live, round in flight, expected)
    type Case = ([Option<usize>; 3], [bool; 3], bool, Trigger);
    let cases: [Case; 8] = [
        ([Some(1), Some(1), Some(1)], [true; 3], false, fire),
        ([Some(3), None, Some(1)], [true; 3], false, wait(1)),
        ([None, Some(2), None], [true; 3], false, wait(0)),
        // A retired rank is not waited for.
        ([Some(3), None, Some(1)], [true, false, true], false, fire),
        // An idle rank with no step joins; nobody stepped: nothing to average.
        ([Some(0), Some(4), Some(0)], [true; 3], false, fire),
        ([Some(0), Some(0), Some(0)], [true; 3], false, Trigger::Idle),
        ([Some(3), Some(3), Some(1)], [true; 3], true, Trigger::RoundInFlight),
        ([Some(3), Some(3), Some(1)], [false; 3], false, Trigger::NoLiveRank),
    ];
    for (i, (ready, live, busy, want)) in cases.into_iter().enumerate() {
        assert_eq!(should_reduce(&ready, &live, busy)?, want, "case {i}");
    }
    assert!(matches!(
        should_reduce(&[Some(1)], &[true, true], false),
        Err(LogicError::WorldMismatch { .. })
    ));
    Ok(())
}

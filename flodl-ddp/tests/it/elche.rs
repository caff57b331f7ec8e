//! ElChe against hand-computed values and a simulated skewed cohort.

use flodl_ddp::control::elche::{ElChe, Growth, Membership, Phase, clamp_total};
use flodl_ddp::control::exposure::Exposure;
use flodl_ddp::{LogicError, Verdict};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Reports one window where every rank trained `steps` batches at the given ms/batch.
fn report(el: &mut ElChe, ms: &[f64], steps: u64, sync_ms: f64) -> TestResult {
    let wall: Vec<f64> = ms.iter().map(|m| m * steps as f64).collect();
    el.report_timing(&wall, &vec![steps; ms.len()], sync_ms)?;
    Ok(())
}

#[test]
fn first_calibration_sets_counts_from_speed() -> TestResult {
    let mut el = ElChe::new(2, 10)?;
    assert_eq!(el.phase(), Phase::Probe);
    assert_eq!(el.anchor_wall_ms(), 0.0);
    // ms = [40/10, 100/10] = [4, 10]; rank 1 is the anchor; rank 0 gets round(10*10/4) = 25.
    el.report_timing(&[40.0, 100.0], &[10, 10], 0.0)?;
    assert_eq!(el.phase(), Phase::Warmup);
    assert_eq!(el.anchor_rank(), Some(1));
    assert_eq!(el.counts(), &[25, 10]);
    assert_eq!(el.ms_per_batch(), vec![4.0, 10.0]);
    assert_eq!(el.anchor_wall_ms(), 100.0);
    Ok(())
}

#[test]
fn dead_zone_and_step_limit() -> TestResult {
    // Rank 0 readings 4, 4.3, 5 (rank 1 stays at 10):
    // mean 4.15 -> target round(100/4.15) = 24, |24-25| = 1 <= 5% of 25: kept at 25.
    // mean 4.4333 -> target 23, diff 2 > 1.25: applied (or 24 with max_batch_diff 1).
    let cases: [(Option<usize>, [usize; 3]); 3] =
        [(None, [25, 25, 23]), (Some(1), [25, 25, 24]), (Some(0), [25, 25, 25])];
    for (diff, expected) in cases {
        let mut el = ElChe::new(2, 10)?;
        if let Some(d) = diff {
            el = el.with_max_batch_diff(d);
        }
        for (reading, want) in [4.0, 4.3, 5.0].into_iter().zip(expected) {
            report(&mut el, &[reading, 10.0], 10, 0.0)?;
            assert_eq!(el.counts()[0], want, "diff {diff:?} reading {reading}");
            assert_eq!(el.counts()[1], 10);
        }
    }
    Ok(())
}

#[test]
fn clamp_total_cases() -> TestResult {
    let cases: [(&[usize], usize, &[usize]); 5] = [
        // 25*20/35 = 14.28 -> 14, 10*20/35 = 5.71 -> 5, remainder 1 to the largest.
        (&[25, 10], 20, &[15, 5]),
        (&[25, 10], 35, &[25, 10]),
        (&[1, 1, 1], 2, &[1, 1, 1]),
        (&[0, 30, 10], 8, &[0, 6, 2]),
        // 3*10/33 = 0.9 -> 1, 30*10/33 = 9.09 -> 9: sum 10.
        (&[3, 30], 10, &[1, 9]),
    ];
    for (counts, max, want) in cases {
        assert_eq!(clamp_total(counts, max), want, "{counts:?} max {max}");
    }
    let mut el = ElChe::new(2, 10)?.with_max_total(20);
    report(&mut el, &[4.0, 10.0], 10, 0.0)?;
    assert_eq!(el.counts(), &[15, 5]);
    assert!(el.window_cap_binding());
    Ok(())
}

#[test]
fn speed_hint_pins_anchor_rank() -> TestResult {
    let el = ElChe::new(3, 10)?.with_speed_ratio(1, 2.5)?;
    assert_eq!(el.counts(), &[25, 10, 25]);
    assert!(el.has_speed_hint());
    assert_eq!(el.anchor_rank(), Some(1));
    assert!(!ElChe::new(3, 10)?.has_speed_hint());
    assert!(matches!(
        ElChe::new(3, 10)?.with_speed_ratio(3, 2.0),
        Err(LogicError::RankOutOfRange { rank: 3, world: 3 })
    ));
    Ok(())
}

#[test]
fn growth_is_proposed_then_committed_by_stable() -> TestResult {
    let mut el = ElChe::new(2, 10)?;
    // First calibration never proposes.
    report(&mut el, &[4.0, 10.0], 10, 20.0)?;
    assert_eq!(el.proposed_anchor(), None);
    // Warmup threshold 2*0.05: overhead 20/(10*10+20) = 0.1667 > 0.1; ratio 3.33 capped at 2.
    report(&mut el, &[4.0, 10.0], 10, 20.0)?;
    assert_eq!(el.proposed_anchor(), Some(20));
    assert_eq!(el.anchor(), 10);
    el.apply_verdict(Verdict::Stable);
    assert_eq!(el.anchor(), 20);
    assert_eq!(el.counts(), &[50, 20]);
    // Overhead 10/(200+10) = 0.0476 is below the Warmup threshold: no proposal.
    report(&mut el, &[4.0, 10.0], 20, 10.0)?;
    assert_eq!(el.proposed_anchor(), None);
    Ok(())
}

/// Growth weighs the exposed exchange averaged over a cycle of fragments (hand-computed, in the
/// Stable phase: threshold 0.05). Windows of 10 batches at 10 ms (the anchor's): 100 ms. A
/// cycle that cost [130, 12, 8, 10] ms: mean 40 ms, overhead 40/140 = 0.286, ratio 5.7 capped
/// at 2: anchor 20. [30, 0, 0, 0]: 7.5 ms, overhead 7.5/107.5 = 0.0698: ceil(10 × 1.395) = 14
/// (the heavy fragment alone, 30/130 = 0.23, would double the anchor). [20, 0, 0, 0]: 5 ms,
/// 5/105 = 0.0476: none.
#[test]
fn growth_weighs_the_exposed_exchange() -> TestResult {
    let cases: [(&[f64], Option<usize>); 3] = [
        (&[130.0, 12.0, 8.0, 10.0], Some(20)),
        (&[30.0, 0.0, 0.0, 0.0], Some(14)),
        (&[20.0, 0.0, 0.0, 0.0], None),
    ];
    for (exposed, want) in cases {
        let mut el = ElChe::new(2, 10)?;
        let exposure = Exposure::new(exposed.to_vec());
        for _ in 0..5 {
            el.report_exchange(&[40.0, 100.0], &[10, 10], &exposure)?;
        }
        assert_eq!(el.phase(), Phase::Stable);
        assert_eq!(el.proposed_anchor(), want, "exposed {exposed:?}");
    }
    Ok(())
}

#[test]
fn stable_phase_uses_plain_target() -> TestResult {
    let mut el = ElChe::new(2, 10)?;
    for _ in 0..4 {
        report(&mut el, &[4.0, 10.0], 10, 0.0)?;
    }
    // Fifth calibration: Stable. overhead 6/106 = 0.0566 > 0.05 -> ceil(10*1.132) = 12.
    report(&mut el, &[4.0, 10.0], 10, 6.0)?;
    assert_eq!(el.phase(), Phase::Stable);
    assert_eq!(el.proposed_anchor(), Some(12));
    Ok(())
}

#[test]
fn suppress_latches_growth_until_five_stables() -> TestResult {
    let mut el = ElChe::new(2, 10)?;
    report(&mut el, &[4.0, 10.0], 10, 20.0)?;
    report(&mut el, &[4.0, 10.0], 10, 20.0)?;
    assert_eq!(el.proposed_anchor(), Some(20));
    el.apply_verdict(Verdict::SuppressGrowth);
    assert_eq!(el.proposed_anchor(), None);
    assert_eq!(el.anchor(), 10);
    for stables in 0..5 {
        assert_eq!(el.growth(), Growth::Latched { stables });
        report(&mut el, &[4.0, 10.0], 10, 20.0)?;
        assert_eq!(el.proposed_anchor(), None, "latched growth proposes nothing");
        el.apply_verdict(Verdict::Stable);
        assert_eq!(el.anchor(), 10);
    }
    assert_eq!(el.growth(), Growth::Armed);
    report(&mut el, &[4.0, 10.0], 10, 20.0)?;
    assert_eq!(el.proposed_anchor(), Some(20));
    Ok(())
}

#[test]
fn nudge_down_drops_proposal_and_bypasses_min_anchor() -> TestResult {
    let mut el = ElChe::new(2, 20)?;
    report(&mut el, &[4.0, 10.0], 20, 0.0)?;
    report(&mut el, &[4.0, 10.0], 20, 100.0)?;
    assert!(el.proposed_anchor().is_some());
    el.apply_verdict(Verdict::NudgeDown { factor: 0.5 });
    assert_eq!(el.proposed_anchor(), None);
    assert_eq!(el.anchor(), 10);
    assert_eq!(el.counts(), &[25, 10]);
    assert_eq!(el.growth(), Growth::Latched { stables: 0 });
    // factor 0.01 clamps to 0.1: ceil(10*0.1) = 1, below min_anchor 20.
    el.nudge_anchor_down(0.01);
    assert_eq!(el.anchor(), 1);
    assert_eq!(el.counts(), &[3, 1]);
    // A factor above 1 never grows the anchor.
    el.nudge_anchor_down(3.0);
    assert_eq!(el.anchor(), 1);
    Ok(())
}

#[test]
fn election_has_hysteresis() -> TestResult {
    let mut el = ElChe::new(3, 10)?;
    // Cohort >= 0.85*10.5 = 8.925: ranks 0 and 1; no anchor yet: lowest index.
    for _ in 0..5 {
        report(&mut el, &[10.0, 10.5, 4.0], 10, 0.0)?;
        assert_eq!(el.anchor_rank(), Some(0));
    }
    // Rank 1 slows to 11.5: its mean is 10.7, 10.9, then 11.1 >= 1.1*10 on the third report.
    let expected = [0, 0, 1, 1];
    for want in expected {
        report(&mut el, &[10.0, 11.5, 4.0], 10, 0.0)?;
        assert_eq!(el.anchor_rank(), Some(want));
    }
    Ok(())
}

#[test]
fn misses_clear_the_anchor_and_reelect() -> TestResult {
    let mut el = ElChe::new(3, 10)?;
    report(&mut el, &[4.0, 10.0, 8.0], 10, 0.0)?;
    assert_eq!(el.anchor_rank(), Some(1));
    for _ in 0..5 {
        el.report_timing(&[40.0, 0.0, 80.0], &[10, 0, 10], 0.0)?;
    }
    // Rank 1's window was cleared: rank 2 (8 ms) is the slowest with data.
    assert_eq!(el.anchor_rank(), Some(2));
    assert_eq!(el.counts(), &[20, 10, 10]);
    Ok(())
}

#[test]
fn retire_reelects_and_zeroes_count() -> TestResult {
    let mut el = ElChe::new(3, 10)?;
    report(&mut el, &[4.0, 10.0, 5.0], 10, 0.0)?;
    assert_eq!(el.counts(), &[25, 10, 20]);
    el.retire(1)?;
    assert_eq!(el.anchor_rank(), Some(2));
    assert_eq!(el.membership()[1], Membership::Retired);
    // 10*5/4 = 12.5 rounds to 13 (half away from zero).
    assert_eq!(el.counts(), &[13, 0, 10]);
    report(&mut el, &[4.0, 10.0, 5.0], 10, 0.0)?;
    assert_eq!(el.counts()[1], 0);
    let share = el.recent_batch_share();
    assert!(share[1] > 0.0, "share history still holds the window before retirement");
    Ok(())
}

/// A retired rank admitted again starts from a fresh estimate (the anchor's count), keeps the
/// elected anchor, and is calibrated by its next measured window.
#[test]
fn admit_gives_a_fresh_estimate() -> TestResult {
    let mut el = ElChe::new(3, 10)?;
    report(&mut el, &[4.0, 10.0, 5.0], 10, 0.0)?;
    el.retire(1)?;
    assert_eq!(el.counts(), &[13, 0, 10]);
    el.admit(1)?;
    assert_eq!(el.membership()[1], Membership::Alive);
    assert_eq!(el.anchor_rank(), Some(2));
    // No estimate yet: the anchor's count.
    assert_eq!(el.counts(), &[13, 10, 10]);
    report(&mut el, &[4.0, 2.5, 5.0], 10, 0.0)?;
    // Calibrated on its first window: twice the anchor rank's speed, twice its count.
    assert_eq!(el.counts()[1], 2 * el.counts()[2], "{:?}", el.counts());
    assert!(matches!(el.admit(3), Err(LogicError::RankOutOfRange { rank: 3, world: 3 })));
    Ok(())
}

#[test]
fn recent_share_is_mean_of_counts() -> TestResult {
    let mut el = ElChe::new(2, 10)?;
    assert_eq!(el.recent_batch_share(), vec![0.5, 0.5]);
    report(&mut el, &[4.0, 10.0], 10, 0.0)?; // [25, 10]
    report(&mut el, &[5.0, 10.0], 10, 0.0)?; // mean 4.5 -> 22.2 -> 22: [22, 10]
    let share = el.recent_batch_share();
    let want = [47.0 / 67.0, 20.0 / 67.0];
    for (s, w) in share.iter().zip(want) {
        assert!((s - w).abs() < 1e-12, "{share:?}");
    }
    Ok(())
}

#[test]
fn slack_applies_for_one_window() -> TestResult {
    let mut el = ElChe::new(2, 10)?;
    report(&mut el, &[4.0, 10.0], 10, 0.0)?;
    // 30 ms of slack on rank 0 at 4 ms/batch: ceil(7.5) = 8 batches fewer.
    el.reserve_slack(0, 30.0)?;
    assert_eq!(el.counts(), &[17, 10]);
    report(&mut el, &[4.0, 10.0], 10, 0.0)?;
    assert_eq!(el.counts(), &[25, 10]);
    Ok(())
}

#[test]
fn state_round_trips_through_serde() -> TestResult {
    let mut el = ElChe::new(3, 10)?;
    for ms in [[4.0, 10.0, 6.0], [4.4, 10.2, 6.1], [3.9, 9.8, 6.3]] {
        report(&mut el, &ms, 10, 3.0)?;
    }
    // bincode keeps every f64 bit (serde_json's default float parsing may not).
    let bytes = bincode::serde::encode_to_vec(el.state(), bincode::config::standard())?;
    let (state, _): (flodl_ddp::ElCheState, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard())?;
    let mut back = ElChe::new(3, 10)?;
    back.restore(&state)?;
    assert_eq!(back.state(), el.state());
    assert_eq!(back.counts(), el.counts());
    assert_eq!(back.anchor_wall_ms(), el.anchor_wall_ms());
    let mut wrong = ElChe::new(2, 10)?;
    assert!(matches!(wrong.restore(&state), Err(LogicError::WorldMismatch { .. })));
    Ok(())
}

#[test]
fn bad_inputs_are_typed_errors() -> TestResult {
    assert!(matches!(ElChe::new(0, 10), Err(LogicError::WorldTooSmall { .. })));
    assert!(matches!(ElChe::new(2, 0), Err(LogicError::InvalidValue { .. })));
    let mut el = ElChe::new(2, 10)?;
    assert!(matches!(
        el.report_timing(&[1.0], &[1, 1], 0.0),
        Err(LogicError::WorldMismatch { expected: 2, got: 1, .. })
    ));
    // Non-finite and zero readings are misses, not errors.
    el.report_timing(&[f64::NAN, 0.0], &[10, 10], f64::INFINITY)?;
    assert!(!el.is_calibrated());
    Ok(())
}

/// Simulates a cohort whose ranks have true ms/batch `speeds` with ±15% uniform noise per batch,
/// every rank training its count each window, and the guard always saying `Stable`.
fn simulate(
    speeds: &[f64],
    seed: u64,
    windows: usize,
) -> Result<ElChe, Box<dyn std::error::Error>> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut el = ElChe::new(speeds.len(), 10)?;
    for _ in 0..windows {
        let counts = el.counts().to_vec();
        let wall: Vec<f64> = counts
            .iter()
            .zip(speeds)
            .map(|(&c, &ms)| (0..c).map(|_| ms * (1.0 + rng.random_range(-0.15..0.15))).sum())
            .collect();
        let steps: Vec<u64> = counts.iter().map(|&c| c as u64).collect();
        let sync_ms = rng.random_range(0.5..3.0);
        el.report_timing(&wall, &steps, sync_ms)?;
        el.apply_verdict(Verdict::Stable);
    }
    Ok(el)
}

#[test]
fn counts_converge_to_speed_ratio_under_skew() -> TestResult {
    let cases: [&[f64]; 4] = [&[4.0, 10.0], &[10.0, 4.0], &[4.0, 10.0, 4.0], &[2.0, 5.0, 3.0, 4.0]];
    for (i, speeds) in cases.into_iter().enumerate() {
        for seed in 0..8 {
            let el = simulate(speeds, 1000 * i as u64 + seed, 30)?;
            let slowest = speeds.iter().copied().fold(0.0, f64::max);
            let a = el.anchor_rank().ok_or("no anchor rank")?;
            assert_eq!(speeds[a], slowest, "anchor rank is the slow one");
            let counts = el.counts();
            for (r, &ms) in speeds.iter().enumerate() {
                let want = slowest / ms;
                let got = counts[r] as f64 / counts[a] as f64;
                let err = (got - want).abs() / want;
                assert!(
                    err <= 0.10,
                    "speeds {speeds:?} seed {seed}: rank {r} ratio {got} vs {want}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn anchor_grows_until_overhead_meets_target() -> TestResult {
    // Sync costs ~1.75 ms on average against 10 ms/batch on the slow rank: the window must grow
    // until sync/(anchor*10 + sync) <= 0.05, i.e. anchor >= 3.3 -- already true at 10 -- so the
    // anchor must stay at 10. With a 40 ms sync it must grow to at least 76 (40/(76*10+40) = 0.05).
    let el = simulate(&[4.0, 10.0], 7, 30)?;
    assert_eq!(el.anchor(), 10);
    let mut el = ElChe::new(2, 10)?;
    for _ in 0..30 {
        let c = el.counts().to_vec();
        el.report_timing(
            &[4.0 * c[0] as f64, 10.0 * c[1] as f64],
            &[c[0] as u64, c[1] as u64],
            40.0,
        )?;
        el.apply_verdict(Verdict::Stable);
    }
    let overhead = 40.0 / (el.anchor() as f64 * 10.0 + 40.0);
    assert!(overhead <= 0.05, "anchor {} overhead {overhead}", el.anchor());
    assert!(el.anchor() <= 2 * 76, "growth overshoots at most x2: {}", el.anchor());
    Ok(())
}

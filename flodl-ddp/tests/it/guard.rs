//! The divergence guard against hand-computed sequences, and ElChe obeying it.

use flodl_ddp::control::guard::{
    GrowthGuard, Guard, ReduceReport, TrendGuard, cosine, divergence, more_severe,
};
use flodl_ddp::{ElChe, Verdict};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const STABLE: Verdict = Verdict::Stable;
const SUPPRESS: Verdict = Verdict::SuppressGrowth;
const NUDGE: Verdict = Verdict::NudgeDown { factor: 0.5 };

#[test]
fn divergence_and_cosine_by_hand() {
    assert_eq!(divergence(3.0, 4.0), 0.75);
    assert_eq!(divergence(3.0, 1e-11), 0.0);
    assert_eq!(divergence(f64::NAN, 4.0), 0.0);
    let cases =
        [(1.0, 1.0, 0.0, Some(1.0)), (1.0, 1.0, 2f64.sqrt(), Some(0.0)), (0.0, 1.0, 0.5, None)];
    for (pre, post, d, want) in cases {
        let got = cosine(pre, post, d);
        match (got, want) {
            (Some(g), Some(w)) => assert!((g - w).abs() < 1e-12, "{pre} {post} {d}: {g}"),
            _ => assert_eq!(got, want),
        }
    }
    // pre = 2, post = 1, diff = 1 (D = 1): cos = (4 + 1 - 1) / 4 = 1.
    assert_eq!(cosine(2.0, 1.0, 1.0), Some(1.0));
}

#[test]
fn trend_guard_sequences() {
    let cases: [(&[f64], &[Verdict]); 4] = [
        (&[0.01, 0.02, 0.03, 0.06], &[STABLE, STABLE, STABLE, SUPPRESS]),
        (&[0.06, 0.07, 0.07, 0.08], &[STABLE, STABLE, STABLE, STABLE]),
        (&[0.1, 0.09, 0.08], &[STABLE, STABLE, STABLE]),
        (&[0.04, 0.05, 0.051, 0.052, 0.01], &[STABLE, STABLE, SUPPRESS, SUPPRESS, STABLE]),
    ];
    // Windows of equal length: the divergences compare as they are.
    for (ds, want) in cases {
        for k in [1, 100] {
            let mut g = TrendGuard::new(0.05);
            let got: Vec<Verdict> = ds.iter().map(|&d| g.report(d, k)).collect();
            assert_eq!(got, want, "{ds:?} at k_max {k}");
        }
    }
    let mut g = TrendGuard::new(0.05);
    for d in [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] {
        g.report(d, 4);
    }
    assert_eq!(g.history().collect::<Vec<_>>(), vec![1.0, 1.5, 2.0, 2.5, 3.0]);
}

/// A window's divergence and its longest rank's steps.
type Window = (f64, u64);

/// Growing windows: a divergence that rises by the window's √k (a random walk's spread) is no
/// trend; one that rises faster is, once above the threshold.
#[test]
fn trend_guard_judges_divergence_per_root_step() {
    // (divergence, k_max) per reduce: windows doubling from 16 steps.
    let cases: [(&[Window], &[Verdict]); 4] = [
        // D about ∝ √k: per √step 0.025, 0.0249, 0.025, 0.0248.
        (&[(0.1, 16), (0.141, 32), (0.2, 64), (0.28, 128)], &[STABLE; 4]),
        // D slower than √k (what the slow-link run measured).
        (&[(0.12, 16), (0.13, 32), (0.15, 64), (0.17, 128)], &[STABLE; 4]),
        // D ∝ k: drifting apart faster than a random walk.
        (&[(0.06, 16), (0.12, 32), (0.24, 64), (0.48, 128)], &[STABLE, STABLE, SUPPRESS, SUPPRESS]),
        // D ∝ k but below the threshold: no matter.
        (&[(0.001, 16), (0.002, 32), (0.004, 64)], &[STABLE; 3]),
    ];
    for (reports, want) in cases {
        let mut g = TrendGuard::new(0.05);
        let got: Vec<Verdict> = reports.iter().map(|&(d, k)| g.report(d, k)).collect();
        assert_eq!(got, want, "{reports:?}");
    }
}

/// Divergences growing by `e^(rate·k)` per reduce of `k` steps: λ = rate exactly.
fn growing(rate: f64, k: u64, n: usize) -> Vec<ReduceReport> {
    (0..n)
        .map(|i| ReduceReport { divergence: 0.01 * (rate * k as f64 * i as f64).exp(), k_max: k })
        .collect()
}

#[test]
fn growth_guard_sequences() {
    // λ = 0.02 > 1e-2: nudge on the 3rd rate (4th report); the suppress streak, not reset by the
    // nudge, fires on the next report; then the pattern repeats.
    let mut g = GrowthGuard::new();
    let got: Vec<Verdict> = growing(0.02, 10, 8).iter().map(|r| g.report(r)).collect();
    assert_eq!(got, [STABLE, STABLE, STABLE, NUDGE, SUPPRESS, STABLE, NUDGE, SUPPRESS]);
    let lambda = g.lambda().unwrap_or(0.0);
    assert!((lambda - 0.02).abs() < 1e-12, "bias-corrected EMA of a constant rate: {lambda}");
    // λ = 0.005: suppress every third rate.
    let mut g = GrowthGuard::new();
    let got: Vec<Verdict> = growing(0.005, 10, 7).iter().map(|r| g.report(r)).collect();
    assert_eq!(got, [STABLE, STABLE, STABLE, SUPPRESS, STABLE, STABLE, SUPPRESS]);
    // Shrinking divergence: always stable.
    let mut g = GrowthGuard::new();
    assert!(growing(-0.05, 10, 10).iter().all(|r| g.report(r) == STABLE));
}

#[test]
fn growth_chain_breaks_on_tiny_divergence() {
    let mut g = GrowthGuard::new();
    let mut reports = growing(0.02, 10, 3);
    reports.push(ReduceReport { divergence: 1e-9, k_max: 10 });
    reports.extend(growing(0.02, 10, 3));
    let got: Vec<Verdict> = reports.iter().map(|r| g.report(r)).collect();
    // Two rates, a break (streaks reset), a fresh start without a rate, two rates: never three.
    assert_eq!(got, [STABLE; 7]);
    // The first rate after the break: the EMA keeps its history, only the streaks restarted.
    let lambda = g.lambda().unwrap_or(0.0);
    assert!((lambda - 0.02).abs() < 1e-12);
}

#[test]
fn combined_guard_takes_the_more_severe() {
    assert_eq!(more_severe(STABLE, SUPPRESS), SUPPRESS);
    assert_eq!(more_severe(NUDGE, SUPPRESS), NUDGE);
    assert_eq!(
        more_severe(Verdict::NudgeDown { factor: 0.7 }, Verdict::NudgeDown { factor: 0.3 }),
        Verdict::NudgeDown { factor: 0.3 }
    );
    let mut off = Guard::Off;
    let mut both = Guard::standard(false);
    let got: Vec<Verdict> = growing(0.02, 10, 4).iter().map(|r| both.report(r)).collect();
    // Divergences 0.01, 0.0122, 0.0149, 0.0182 stay below the trend threshold: growth rule only.
    assert_eq!(got, [STABLE, STABLE, STABLE, NUDGE]);
    assert!(growing(0.02, 10, 4).iter().all(|r| off.report(r) == STABLE));
}

#[test]
fn guard_state_round_trips() -> TestResult {
    let mut g = Guard::standard(true);
    for r in growing(0.004, 5, 4) {
        g.report(&r);
    }
    // bincode keeps every f64 bit (serde_json's default float parsing may not).
    let bytes = bincode::serde::encode_to_vec(&g, bincode::config::standard())?;
    let (mut back, _): (Guard, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard())?;
    assert_eq!(back, g);
    let next = ReduceReport { divergence: 1.0, k_max: 5 };
    assert_eq!(back.report(&next), g.report(&next));
    Ok(())
}

#[test]
fn elche_obeys_the_guard() -> TestResult {
    let mut el = ElChe::new(2, 40)?;
    el.report_timing(&[160.0, 400.0], &[40, 40], 0.0)?;
    let mut guard = Guard::Growth(GrowthGuard::new());
    let mut anchors = Vec::new();
    for r in growing(0.02, 40, 4) {
        el.apply_verdict(guard.report(&r));
        anchors.push(el.anchor());
    }
    assert_eq!(anchors, [40, 40, 40, 20]);
    assert_eq!(el.counts(), &[50, 20]);
    Ok(())
}

//! The Async overshoot bound and its auto-sizing.

use flodl_ddp::{Overshoot, OvershootMode, Verdict};

#[test]
fn auto_sizing_from_epoch_batches() {
    // (epoch batches, initial clamp(tb/100,2,5), cap clamp(tb/50,3,10))
    let cases = [(0, 2, 3), (100, 2, 3), (300, 3, 6), (937, 5, 10), (100_000, 5, 10)];
    for (tb, initial, cap) in cases {
        let o = Overshoot::auto(tb);
        assert_eq!(o.mode(), OvershootMode::Auto { initial, cap }, "tb {tb}");
        assert_eq!(o.current(), initial);
    }
}

#[test]
fn verdicts_grow_hold_and_reset() {
    let mut o = Overshoot::auto(300); // 3, cap 6
    let steps = [
        (Verdict::Stable, 4),
        (Verdict::SuppressGrowth, 4),
        (Verdict::Stable, 5),
        (Verdict::Stable, 6),
        (Verdict::Stable, 6),
        (Verdict::NudgeDown { factor: 0.5 }, 3),
    ];
    for (v, want) in steps {
        o.apply_verdict(v);
        assert_eq!(o.current(), want, "after {v:?}");
    }
    let mut fixed = Overshoot::fixed(40);
    assert_eq!(fixed.current(), 15);
    fixed.apply_verdict(Verdict::NudgeDown { factor: 0.5 });
    assert_eq!(fixed.current(), 15);
}

#[test]
fn gate() {
    let o = Overshoot::fixed(3);
    let cases = [(0, 10, true), (12, 10, true), (13, 10, false), (20, 10, false), (2, 0, true)];
    for (steps, count, ok) in cases {
        assert_eq!(o.allows(steps, count), ok, "steps {steps} count {count}");
    }
}

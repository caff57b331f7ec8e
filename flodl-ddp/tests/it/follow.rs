//! `Cadence` followers: the ranks other than the anchor train until the anchor is ready.

use crate::common::{TestResult, train_subset};

use std::sync::Arc;
use std::time::Duration;

use flodl_data::Dataset;
use flodl_ddp::{
    Backend, Devices, ElCheKnobs, Mlp, MlpConfig, Optimizer, Policy, ReduceEvent, Trainer,
};

/// A `Cadence` run of 3 epochs of `data` on 2 CPU ranks, rank 1 slowed 3× (the anchor, as
/// ElChe is told from the start), an MLP of `hidden` units, windows held short so a run has
/// many.
fn trainer(data: &Arc<dyn Dataset>, hidden: usize, backend: Backend) -> Trainer {
    Trainer::new(Mlp::factory(MlpConfig::new(&[784, hidden, 10], Optimizer::sgd(0.9))))
        .dataset(data.clone())
        .batch_size(16)
        .epochs(3)
        .devices(Devices::Cpu(2))
        .policy(Policy::Cadence)
        .backend(backend)
        .learning_rate(0.05)
        .slowdown(vec![1.0, 3.0])
        .elche(ElCheKnobs { max_anchor: 12, speed_hint: Some((1, 3.0)), ..Default::default() })
        .stall_timeout(Duration::from_secs(60))
}

/// Under `Cadence` on both backends, rank 1 slowed 3× (the anchor), windows held short so a run
/// has many: once ElChe is calibrated (the counts differ), the fast rank trains until the anchor
/// is ready — past its planned count in some windows (count and wall time alone never let it),
/// never past the following bound of a quarter more.
#[test]
fn cadence_followers_train_until_the_anchor_is_ready() -> TestResult {
    let data = train_subset(4096);
    for backend in [Backend::Collective, Backend::Host] {
        let t = trainer(&data, 64, backend);
        let mut h = t.run()?;
        while h.next_metrics(Duration::from_secs(60)).is_some() {}
        let events: Vec<ReduceEvent> = h.poll_reduce_events();
        h.join()?;
        let followed: Vec<&ReduceEvent> =
            events.iter().filter(|e| e.counts.len() == 2 && e.counts[0] > e.counts[1]).collect();
        assert!(followed.len() >= 8, "{backend:?}: {} calibrated windows", followed.len());
        for e in &followed {
            let (planned, steps) = (e.counts[0], e.steps[0]);
            let bound = planned + planned.div_ceil(4).max(1);
            assert!(steps <= bound, "{backend:?} round {}: {steps} of {planned}", e.round);
        }
        let past = followed.iter().filter(|e| e.steps[0] > e.counts[0]).count();
        assert!(past > 0, "{backend:?}: rank 0 never trained past its count: {followed:?}");
    }
    Ok(())
}

/// Under `Cadence` on the host backend (whole and in 2 fragments) the anchor's snapshot is
/// ordered as soon as it is ready while the fast rank still trains (in the windows where the
/// fast rank ran to its bound first there is nobody to wait for): reduces name rank 1 (the
/// anchor) as ordered ahead, none names rank 0, and every epoch trains each of its samples
/// once. Under `--overlap` (the rank trains on after its snapshot) and on the collective
/// backend nothing is ordered ahead.
#[test]
fn the_anchors_snapshot_is_ordered_ahead() -> TestResult {
    let data = train_subset(4096);
    let cases = [
        (Backend::Host, 1, false, true),
        (Backend::Host, 2, false, true),
        (Backend::Host, 2, true, false),
        (Backend::Collective, 1, false, false),
    ];
    for (backend, fragments, overlap, ahead) in cases {
        let what = format!("{backend:?}, {fragments} fragments, overlap {overlap}");
        let mut t = trainer(&data, 256, backend).fragments(fragments);
        if overlap {
            t = t.overlap(0.5);
        }
        let mut h = t.run()?;
        while h.next_metrics(Duration::from_secs(60)).is_some() {}
        let events: Vec<ReduceEvent> = h.poll_reduce_events();
        let state = h.join()?;
        for e in &state.epochs {
            assert_eq!(e.samples, 4096, "{what}: epoch {} trained {}", e.epoch, e.samples);
        }
        let calibrated: Vec<&ReduceEvent> =
            events.iter().filter(|e| e.counts.len() == 2 && e.counts[0] > e.counts[1]).collect();
        let named = calibrated.iter().filter(|e| e.ordered_ahead == [1]).count();
        assert!(calibrated.len() >= 8, "{what}: {} calibrated windows", calibrated.len());
        assert!(events.iter().all(|e| e.ordered_ahead.len() <= 1), "{what}: {events:?}");
        match ahead {
            true => assert!(named >= 3, "{what}: {named} of {}: {calibrated:?}", calibrated.len()),
            false => assert_eq!(named, 0, "{what}"),
        }
    }
    Ok(())
}

/// Under `Async` on both backends, once ElChe is calibrated the anchor (rank 1, slowed 3×)
/// trains no batch past its count (`Window::anchored`): the others report when it is ready and
/// the reduce waits for nobody's extra batch; the fast rank still trains past its count in
/// some windows.
#[test]
fn under_async_the_anchor_trains_no_overshoot() -> TestResult {
    let data = train_subset(4096);
    for backend in [Backend::Collective, Backend::Host] {
        let mut h = trainer(&data, 64, backend).policy(Policy::Async).run()?;
        while h.next_metrics(Duration::from_secs(60)).is_some() {}
        let events: Vec<ReduceEvent> = h.poll_reduce_events();
        let state = h.join()?;
        for e in &state.epochs {
            assert_eq!(e.samples, 4096, "{backend:?}: epoch {} trained {}", e.epoch, e.samples);
        }
        // From the second window: the first is planned from the speed hint, before ElChe's
        // first reading calibrates it.
        let calibrated: Vec<&ReduceEvent> = events
            .iter()
            .filter(|e| e.round > 1 && e.counts.len() == 2 && e.counts[0] > e.counts[1])
            .collect();
        assert!(calibrated.len() >= 8, "{backend:?}: {} calibrated windows", calibrated.len());
        let past = |r: usize| calibrated.iter().filter(|e| e.steps[r] > e.counts[r]).count();
        assert_eq!(past(1), 0, "{backend:?}: the anchor trained past its count: {calibrated:?}");
        assert!(past(0) > 0, "{backend:?}: rank 0 never trained past its count");
    }
    Ok(())
}

/// Before ElChe's first reading (no speed hint: the first window is a probe), under `Cadence`
/// and `Async` on both backends, the slow rank (rank 1, slowed 3×) is the last the first reduce
/// waits for, and it trains no batch past its probe count: it is told so once the fast rank is
/// ready (`ToWorker::Last`), where it used to begin one more batch, which the fast rank then
/// waited for in the reduce. The fast rank trains on past its count, as a probe lets it.
#[test]
fn the_last_rank_of_a_probe_trains_no_batch_past_its_count() -> TestResult {
    let data = train_subset(4096);
    for backend in [Backend::Collective, Backend::Host] {
        for policy in [Policy::Cadence, Policy::Async] {
            let what = format!("{backend:?}, {policy:?}");
            let knobs = ElCheKnobs { max_anchor: 12, ..Default::default() };
            let t = trainer(&data, 256, backend).policy(policy).elche(knobs).epochs(1);
            let mut h = t.run()?;
            while h.next_metrics(Duration::from_secs(60)).is_some() {}
            let events: Vec<ReduceEvent> = h.poll_reduce_events();
            let state = h.join()?;
            assert_eq!(state.epochs.first().map(|e| e.samples), Some(4096), "{what}");
            let first =
                events.iter().find(|e| e.round == 1).ok_or(format!("{what}: no round 1"))?;
            assert_eq!(first.counts.first(), first.counts.get(1), "{what}: not a probe: {first:?}");
            assert_eq!(first.steps[1], first.counts[1], "{what}: the slow rank: {first:?}");
            assert!(first.steps[0] > first.counts[0], "{what}: the fast rank: {first:?}");
        }
    }
    Ok(())
}

//! `Cadence` followers: the ranks other than the anchor train until the anchor is ready.

use crate::common::{TestResult, train_subset};

use std::time::Duration;

use flodl_ddp::{
    Backend, Devices, ElCheKnobs, Mlp, MlpConfig, Optimizer, Policy, ReduceEvent, Trainer,
};

/// Under `Cadence` on both backends, rank 1 slowed 3× (the anchor), windows held short so a run
/// has many: once ElChe is calibrated (the counts differ), the fast rank trains until the anchor
/// is ready — past its planned count in some windows (count and wall time alone never let it),
/// never past the following bound of a quarter more.
#[test]
fn cadence_followers_train_until_the_anchor_is_ready() -> TestResult {
    let data = train_subset(4096);
    for backend in [Backend::Collective, Backend::Host] {
        let t = Trainer::new(Mlp::factory(MlpConfig::new(&[784, 64, 10], Optimizer::sgd(0.9))))
            .dataset(data.clone())
            .batch_size(16)
            .epochs(3)
            .devices(Devices::Cpu(2))
            .policy(Policy::Cadence)
            .backend(backend)
            .learning_rate(0.05)
            .slowdown(vec![1.0, 3.0])
            .elche(ElCheKnobs { max_anchor: 12, speed_hint: Some((1, 3.0)), ..Default::default() })
            .stall_timeout(Duration::from_secs(60));
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

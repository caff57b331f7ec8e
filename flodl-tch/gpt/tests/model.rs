//! The transformer's shape: its parameter count per size, and causality.

use flodl_tch::{Vars, seeded};
use flodl_tch_gpt::config::{GptConfig, Size};
use flodl_tch_gpt::model::Gpt;
use tch::nn::VarStore;
use tch::{Kind, Tensor};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn every_size_holds_the_parameters_its_config_counts() -> TestResult {
    for size in [Size::Tiny, Size::Default, Size::Large] {
        let cfg = GptConfig::of(size);
        let vs = VarStore::new(tch::Device::Cpu);
        let _model = seeded(1, || Gpt::new(&vs.root(), cfg));
        let vars = Vars::new(&vs)?;
        assert_eq!(vars.numel(), cfg.parameters(), "{size:?}");
        assert_eq!(vars.buffer_count(), 0, "{size:?}");
    }
    Ok(())
}

/// Changing token `k` of a sequence changes no logit before position `k` (causal attention),
/// and does change the logits from `k` on.
#[test]
fn no_position_sees_a_later_token() -> TestResult {
    let cfg = GptConfig { context: 16, width: 32, layers: 2, heads: 4, vocab: 256 };
    let vs = VarStore::new(tch::Device::Cpu);
    let model = seeded(2, || Gpt::new(&vs.root(), cfg));
    let _guard = tch::no_grad_guard();
    let base: Vec<i64> = (0..16).map(|i| (i * 37 + 11) % 256).collect();
    let logits = model.forward(&Tensor::from_slice(&base).view([1, 16]));
    for k in [0usize, 5, 15] {
        let mut changed = base.clone();
        changed[k] = (changed[k] + 101) % 256;
        let other = model.forward(&Tensor::from_slice(&changed).view([1, 16]));
        let diff = (&logits - &other).abs().amax(vec![0i64, 2], false).to_kind(Kind::Double);
        let diff = Vec::<f64>::try_from(diff)?;
        for (pos, d) in diff.iter().enumerate() {
            if pos < k {
                assert!(*d < 1e-5, "token {k} reached position {pos}: {d}");
            } else if pos == k {
                assert!(*d > 1e-4, "token {k} did not reach its own position: {d}");
            }
        }
    }
    Ok(())
}

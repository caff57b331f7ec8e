//! The candle transformer's optimizer state in checkpoints: a `Sync` run resumed from a mid-run
//! bundle (AdamW's moments and step count restored from it) trains the same loss trajectory
//! and ends with the same weights as the run that was never interrupted, bit for bit.

use std::sync::Arc;
use std::time::Duration;

use flodl_candle::CandleReplica;
use flodl_candle::gpt::{Gpt, GptConfig, gpt_optim, gpt_schedule};
use flodl_data::{Dataset, Shakespeare, Subset, TextSplit};
use flodl_ddp::checkpoint::{Checkpoint, SaveInterval, step_bundles};
use flodl_ddp::{Devices, Policy, ReplicaContext, ResumeFrom, TrainedState, Trainer};

/// A transformer small enough for a few seconds' run: 2 layers, width 32, 16 bytes of context.
const CONFIG: GptConfig = GptConfig { context: 16, width: 32, layers: 2, heads: 2 };
const BATCH: usize = 8;
/// Training windows: 16 reduces an epoch on two ranks.
const WINDOWS: usize = 256;
const EPOCHS: usize = 3;

fn trainer() -> anyhow::Result<Trainer> {
    let text =
        |split| -> anyhow::Result<_> { Ok(Shakespeare::vendored(split)?.windows(CONFIG.context)?) };
    let train: Arc<dyn Dataset> = Arc::new(Subset::first(text(TextSplit::Train)?, WINDOWS));
    let valid: Arc<dyn Dataset> = Arc::new(Subset::first(text(TextSplit::Valid)?, 64));
    let factory =
        |ctx: &ReplicaContext| CandleReplica::new(Gpt::new(CONFIG, ctx.seed)?, gpt_optim(), ctx);
    let total = (EPOCHS * WINDOWS / BATCH / 2) as u64;
    Ok(Trainer::new(factory)
        .dataset(train)
        .test_dataset(valid, 1)
        .devices(Devices::Cpu(2))
        .policy(Policy::Sync)
        .batch_size(BATCH)
        .epochs(EPOCHS)
        .seed(11)
        .schedule(gpt_schedule(3e-3, total, 4))
        .stall_timeout(Duration::from_secs(60)))
}

fn bits(state: &TrainedState) -> Vec<u32> {
    state.params.iter().flat_map(|t| t.data.iter().map(|x| x.to_bits())).collect()
}

/// The loss of every epoch and its evaluation, as bits.
fn trajectory(state: &TrainedState) -> Vec<(usize, u64, Option<u64>)> {
    state
        .epochs
        .iter()
        .map(|e| (e.epoch, e.avg_loss.to_bits(), e.eval.as_ref().map(|v| v.loss.to_bits())))
        .collect()
}

#[test]
fn a_resumed_run_follows_the_uninterrupted_trajectory() -> anyhow::Result<()> {
    let reference = trainer()?.run()?.join()?;
    let dir = tempfile::tempdir()?;
    // 7 is prime to the 16 reduces of an epoch: the bundles fall mid-epoch.
    let saving = trainer()?
        .checkpoint_dir(dir.path())
        .checkpoint_every(SaveInterval::every_reduces(7))
        .keep_checkpoints(100)
        .run()?
        .join()?;
    anyhow::ensure!(bits(&saving) == bits(&reference), "saving checkpoints changed the run");
    // A bundle of the second epoch, mid-epoch: the first epoch behind it, the rest ahead.
    let mut second = None;
    for (step, path) in step_bundles(dir.path())? {
        let ckpt = Checkpoint::read(&path)?;
        if ckpt.epoch == 1 && ckpt.coverage.iter().any(|c| !c.is_complete()) {
            second = Some((step, path, ckpt));
            break;
        }
    }
    let (step, path, ckpt) =
        second.ok_or_else(|| anyhow::anyhow!("no bundle in the middle of the second epoch"))?;
    // AdamW's moments (two per parameter, not all zero) and step count, from each rank.
    anyhow::ensure!(ckpt.optimizer.len() == 2, "{} optimizer sets", ckpt.optimizer.len());
    for set in &ckpt.optimizer {
        anyhow::ensure!(set.len() == 2 * reference.params.len(), "{} moments saved", set.len());
        let nonzero = set
            .records()
            .iter()
            .filter_map(|r| r.to_f32_vec())
            .any(|v| v.iter().any(|x| *x != 0.0));
        anyhow::ensure!(nonzero, "the saved moments are all zero");
    }
    let steps: Vec<u64> = ckpt
        .extras
        .get("optimizer_steps")
        .ok_or_else(|| anyhow::anyhow!("no optimizer steps saved"))?
        .decode()?;
    anyhow::ensure!(steps.iter().all(|&s| s > 0), "step counts {steps:?} at step {step}");
    let resumed = trainer()?.resume(ResumeFrom::File(path)).run()?.join()?;
    let (want, got) = (trajectory(&reference), trajectory(&resumed));
    let shown = |t: &[(usize, u64, Option<u64>)]| -> Vec<String> {
        t.iter()
            .map(|(e, l, v)| {
                let v = v.map_or(f64::NAN, f64::from_bits);
                format!("epoch {e}: train {:.6} eval {v:.6}", f64::from_bits(*l))
            })
            .collect()
    };
    println!("resumed at step {step}: reference {:?}, resumed {:?}", shown(&want), shown(&got));
    // The epoch the bundle was saved in ends with the same evaluation (its mean training loss
    // covers only the part trained after the resume), and every later epoch has the same
    // training loss and evaluation, bit for bit.
    anyhow::ensure!(got.len() == EPOCHS, "{} epochs", got.len());
    anyhow::ensure!(got[1].2 == want[1].2, "the evaluation after the resumed epoch differs");
    anyhow::ensure!(got[2..] == want[2..], "the trajectory differs after the resume");
    anyhow::ensure!(bits(&resumed) == bits(&reference), "the weights differ after the resume");
    Ok(())
}

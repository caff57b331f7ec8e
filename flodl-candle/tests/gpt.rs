//! The tiny transformer on the Shakespeare corpus, through both tiers on two CPU ranks (rank 1
//! slowed): it learns context (its validation loss falls below the unigram entropy of the bytes
//! it predicts, computed from the data), every sample is trained once per epoch, and a rank's
//! death is survived. CI: 195 s for the file on two cores shared with other builds (823 s at
//! load 14, with seven other helpers building and testing).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flodl_candle::gpt::{Gpt, GptConfig, GptSize, gpt_optim, gpt_schedule};
use flodl_candle::{CandleModel, CandleReplica, host_tensors, train_loop};
use flodl_data::{ByteWindows, Dataset, Shakespeare, Subset, TextSplit, unigram_entropy};
use flodl_ddp::{
    Devices, EvalMetrics, FailingReplica, Failure, Policy, ReplicaContext, TrainedState, Trainer,
    evaluate,
};

const BATCH: usize = 8;
/// Training windows: 64 batches an epoch across the two ranks.
const WINDOWS: usize = 64 * BATCH;
/// Validation windows evaluated (the first ones of the held-out plays): 16,384 bytes.
const EVAL_WINDOWS: usize = 256;
const LR: f64 = 3e-3;

struct Corpus {
    train: Arc<dyn Dataset>,
    valid: Arc<dyn Dataset>,
    /// Entropy (nats) of the byte frequencies of the validation bytes the model predicts.
    bound: f64,
}

fn corpus(config: GptConfig) -> anyhow::Result<Corpus> {
    let train = Shakespeare::vendored(TextSplit::Train)?.windows(config.context)?;
    let valid = Shakespeare::vendored(TextSplit::Valid)?.windows(config.context)?;
    let eval = Subset::first(valid, EVAL_WINDOWS);
    let targets: Vec<u8> = (0..eval.len())
        .filter_map(|i| eval.inner().window(i))
        .flat_map(|w| &w[1..])
        .copied()
        .collect();
    let bound = unigram_entropy(&targets).nats;
    Ok(Corpus { train: Arc::new(Subset::first(train, WINDOWS)), valid: Arc::new(eval), bound })
}

/// Samples trained, per rank and epoch: `seen[epoch][rank][sample]`.
type Seen = Arc<Mutex<Vec<Vec<Vec<u32>>>>>;

fn configure(trainer: Trainer, c: &Corpus, epochs: usize, seen: &Seen) -> Trainer {
    let audit = seen.clone();
    let total = (epochs * WINDOWS / BATCH) as u64;
    trainer
        .dataset(c.train.clone())
        .test_dataset(c.valid.clone(), epochs)
        .devices(Devices::Cpu(2))
        .slowdown(vec![1.0, 2.0])
        .policy(Policy::Cadence)
        .batch_size(BATCH)
        .epochs(epochs)
        .seed(5)
        .schedule(gpt_schedule(LR, total, total / 10))
        .watchdog(Duration::from_secs(120))
        .sample_audit(Arc::new(move |rank, epoch, picks| {
            let mut seen = audit.lock().unwrap_or_else(|e| e.into_inner());
            while seen.len() <= epoch {
                seen.push(vec![vec![0; WINDOWS]; 2]);
            }
            for &p in picks {
                seen[epoch][rank][p] += 1;
            }
        }))
}

/// Every sample of every epoch trained; once, except (in the epoch of a death) those the dead
/// rank trained before it died, which the survivor may train again.
fn check_coverage(seen: &Seen, epochs: usize, dead: Option<usize>) -> anyhow::Result<()> {
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    anyhow::ensure!(seen.len() == epochs, "{} epochs audited, {epochs} run", seen.len());
    for (epoch, ranks) in seen.iter().enumerate() {
        for p in 0..WINDOWS {
            let times: u32 = ranks.iter().map(|r| r[p]).sum();
            let retrained = dead.is_some_and(|d| ranks[d][p] == 1 && times == 2);
            anyhow::ensure!(times == 1 || retrained, "epoch {epoch}: sample {p} trained {times}×");
        }
    }
    Ok(())
}

fn final_eval(state: &TrainedState) -> anyhow::Result<EvalMetrics> {
    state.final_eval().ok_or_else(|| anyhow::anyhow!("the run did not evaluate"))
}

/// The `Replica` tier: rank 1 (at half speed) dies at its 12th step; rank 0 trains on and the
/// model still goes below the unigram bound, with every sample trained.
#[test]
fn replica_tier_learns_context_and_survives_a_death() -> anyhow::Result<()> {
    let config = GptSize::Tiny.config();
    let c = corpus(config)?;
    let seen: Seen = Arc::default();
    let factory = move |ctx: &ReplicaContext| {
        let replica = CandleReplica::new(Gpt::new(config, ctx.seed)?, gpt_optim(), ctx)?;
        let at = (ctx.rank == 1).then_some(12);
        Ok(FailingReplica::new(replica, at, Failure::Error))
    };
    let epochs = 2;
    let mut handle = configure(Trainer::new(factory), &c, epochs, &seen).max_failures(1).run()?;
    let mut faults = Vec::new();
    while !handle.is_finished() {
        faults.extend(handle.poll_fault_events());
        std::thread::sleep(Duration::from_millis(50));
    }
    faults.extend(handle.poll_fault_events());
    let state = handle.join()?;
    let eval = final_eval(&state)?;
    println!(
        "replica tier: {:.4} nats/byte ({:.4} bits/byte) on {} validation bytes, unigram bound \
         {:.4}; {} reduces, {} fault(s)",
        eval.loss,
        eval.loss / std::f64::consts::LN_2,
        eval.samples,
        c.bound,
        state.reduces,
        faults.len()
    );
    anyhow::ensure!(faults.iter().map(|f| f.rank).eq([1]), "faults {faults:?}");
    anyhow::ensure!(eval.samples == EVAL_WINDOWS * config.context, "{eval:?}");
    anyhow::ensure!(eval.loss < c.bound, "loss {} not below the bound {}", eval.loss, c.bound);
    anyhow::ensure!(state.reduces > 0, "no reduce");
    check_coverage(&seen, epochs, Some(1))
}

/// The cooperative tier: each rank runs its own candle loop; the averaged model goes below the
/// unigram bound, every sample trained once per epoch.
#[test]
fn cooperative_tier_learns_context() -> anyhow::Result<()> {
    let config = GptSize::Tiny.config();
    let c = corpus(config)?;
    let seen: Seen = Arc::default();
    let initial = host_tensors(Gpt::new(config, 5)?.vars())?;
    let epochs = 2;
    let mut run = configure(Trainer::cooperative(), &c, epochs, &seen).run_cooperative(initial)?;
    let loops: Vec<_> = run
        .workers
        .drain(..)
        .map(|w| {
            std::thread::spawn(move || -> flodl_ddp::Result<usize> {
                // Overwritten with the run's initial state before the first step.
                let model = Gpt::new(config, 0)?;
                Ok(train_loop(w, &model, gpt_optim())?.steps)
            })
        })
        .collect();
    let state = run.handle.join()?;
    let mut steps = 0;
    for h in loops {
        steps += h.join().map_err(|_| anyhow::anyhow!("a rank loop panicked"))??;
    }
    anyhow::ensure!(steps == epochs * WINDOWS / BATCH, "{steps} steps");
    // The runtime does not evaluate a cooperative run: the averaged state is evaluated here.
    let eval = evaluate_state(config, &state, c.valid.as_ref())?;
    println!(
        "cooperative tier: {:.4} nats/byte on {} validation bytes, unigram bound {:.4}",
        eval.loss, eval.samples, c.bound
    );
    anyhow::ensure!(eval.loss < c.bound, "loss {} not below the bound {}", eval.loss, c.bound);
    check_coverage(&seen, epochs, None)
}

/// The run's final parameters, loaded into a replica and evaluated on `data`.
fn evaluate_state(
    config: GptConfig,
    state: &TrainedState,
    data: &dyn Dataset,
) -> anyhow::Result<EvalMetrics> {
    let stream = flodl_tensor::Stream::cpu_with_threads(1);
    let ctx = ReplicaContext::alone(stream.clone(), BATCH, 0);
    let mut replica = CandleReplica::new(Gpt::new(config, 0)?, gpt_optim(), &ctx)?;
    state.load_into(&mut replica, &stream)?;
    evaluate(&mut replica, data, 64, &stream)?.ok_or_else(|| anyhow::anyhow!("no evaluation"))
}

/// The named sizes hold the parameters their documentation states, and a model's variables
/// add up to its configuration's count.
#[test]
fn sizes_hold_their_parameters() -> anyhow::Result<()> {
    let expected = [
        (GptSize::Tiny, 0.7e6, 1.0e6),
        (GptSize::Default, 5e6, 10e6),
        (GptSize::Large, 25e6, 30e6),
    ];
    for (size, lo, hi) in expected {
        let config = size.config();
        let n = config.parameter_count();
        assert!((lo..hi).contains(&(n as f64)), "{size:?}: {n}");
        assert_eq!(GptSize::parse(size.name()), Some(size));
    }
    let config = GptSize::Tiny.config();
    let model = Gpt::new(config, 1)?;
    let held: usize = model.vars().iter().map(|v| v.elem_count()).sum();
    assert_eq!(held, config.parameter_count());
    assert!(Gpt::new(GptConfig { heads: 3, ..config }, 1).is_err());
    let _ = ByteWindows::VOCAB;
    Ok(())
}

/// `TrainedState::load_into` puts a state into a candle replica's model, not only into the
/// flodl tensors beside it: a replica built from one seed, loaded with the variables of a
/// model built from another, evaluates as a replica of that other model does.
#[test]
fn a_loaded_state_is_what_a_candle_replica_computes_with() -> anyhow::Result<()> {
    let config = GptSize::Tiny.config();
    let data = Subset::first(Shakespeare::vendored(TextSplit::Valid)?.windows(config.context)?, 32);
    let stream = flodl_tensor::Stream::cpu_with_threads(1);
    let ctx = |seed| ReplicaContext::alone(stream.clone(), BATCH, seed);
    let source = Gpt::new(config, 7)?;
    let state = TrainedState {
        params: host_tensors(source.vars())?,
        buffers: Vec::new(),
        epochs: Vec::new(),
        reduces: 0,
        wall_ms: 0.0,
        train_ms: 0.0,
        samples: 0,
        faults: Vec::new(),
        rejoins: Vec::new(),
    };
    let mut want = CandleReplica::new(source, gpt_optim(), &ctx(7))?;
    let mut loaded = CandleReplica::new(Gpt::new(config, 8)?, gpt_optim(), &ctx(8))?;
    let before = evaluate(&mut loaded, &data, 16, &stream)?;
    state.load_into(&mut loaded, &stream)?;
    let (want, got) = (
        evaluate(&mut want, &data, 16, &stream)?.ok_or_else(|| anyhow::anyhow!("no evaluation"))?,
        evaluate(&mut loaded, &data, 16, &stream)?
            .ok_or_else(|| anyhow::anyhow!("no evaluation"))?,
    );
    anyhow::ensure!(
        before.is_some_and(|b| b.loss != want.loss),
        "the two seeds' models evaluate alike, so the test shows nothing"
    );
    anyhow::ensure!(got == want, "loaded: {got:?}, the source model: {want:?}");
    Ok(())
}

//! `fdl train --model`: which model a run trains, the data it reads and the replica factory.
//!
//! The reference MLP on MNIST (flodl-ddp's own replica), or the candle transformer on the
//! vendored Shakespeare plays (flodl-candle's `Replica` adapter). Everything else about the run
//! (flags, run directory, report, dashboard, checkpoints, resume, `fdl launch`) is the same.

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::ValueEnum;
use flodl_candle::CandleReplica;
use flodl_candle::gpt::{Gpt, GptSize, gpt_elche, gpt_optim};
use flodl_data::{Dataset, Shakespeare, Subset, TextSplit, Verify};
use flodl_ddp::{Mlp, MlpConfig, ModelSize, Optimizer, Replica, ReplicaContext};

use crate::config::TrainConfig;
use crate::train::Data;

/// Validation windows a transformer run evaluates when `--test-subset` does not say: the first
/// ones of the held-out plays (a fixed slice, so runs compare).
const GPT_EVAL_WINDOWS: usize = 512;

/// The model a run trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, ValueEnum)]
pub(crate) enum Model {
    /// The reference MLP on MNIST (`--hidden` sets its widths).
    #[default]
    Mlp,
    /// The candle GPT on Shakespeare, 0.83M parameters (64 bytes of context).
    GptTiny,
    /// The candle GPT on Shakespeare, 6.4M parameters (128 bytes of context).
    Gpt,
    /// The candle GPT on Shakespeare, 25.3M parameters (128 bytes of context).
    GptLarge,
}

/// A transformer run's training windows and validation slice.
pub(crate) type TextSets = (Arc<dyn Dataset>, Arc<dyn Dataset>);

/// A replica factory, as `Trainer::new` takes it.
pub(crate) type Factory =
    Box<dyn Fn(&ReplicaContext) -> flodl_ddp::Result<Box<dyn Replica>> + Send + Sync>;

impl Model {
    /// The transformer's size, for a GPT.
    pub(crate) fn gpt(self) -> Option<GptSize> {
        match self {
            Model::Mlp => None,
            Model::GptTiny => Some(GptSize::Tiny),
            Model::Gpt => Some(GptSize::Default),
            Model::GptLarge => Some(GptSize::Large),
        }
    }

    /// The model in words, for the run's first line.
    pub(crate) fn describe(self, mlp_widths: &[usize]) -> String {
        match self.gpt() {
            None => {
                let w: Vec<String> = mlp_widths.iter().map(ToString::to_string).collect();
                format!("MLP {}", w.join("-"))
            }
            Some(size) => {
                let c = size.config();
                format!(
                    "candle GPT {} ({:.2}M parameters, {} bytes of context, width {}, {} layers)",
                    size.name(),
                    c.parameter_count() as f64 / 1e6,
                    c.context,
                    c.width,
                    c.layers
                )
            }
        }
    }

    /// The transformer's training windows and its fixed validation slice (`--train-subset` and
    /// `--test-subset` count windows), with their checksums verified; `None` for the MLP.
    ///
    /// # Errors
    /// A missing or corrupt corpus file (named in the message).
    pub(crate) fn text(self, cfg: &TrainConfig) -> Result<Option<TextSets>> {
        let Some(size) = self.gpt() else { return Ok(None) };
        anyhow::ensure!(
            cfg.local.data.is_none() && cfg.local.records.is_none(),
            "--data and --records feed the MLP; --model {} reads the vendored Shakespeare corpus",
            self.to_possible_value().map_or_else(String::new, |v| v.get_name().to_owned())
        );
        let context = size.config().context;
        let dir = Shakespeare::vendored_dir();
        let load = |split| -> Result<_> {
            let text = Shakespeare::load(&dir, split, Verify::Sha256)
                .with_context(|| format!("cannot load the corpus from {}", dir.display()))?;
            Ok(text.windows(context)?)
        };
        let train = load(TextSplit::Train)?;
        let train: Arc<dyn Dataset> = match cfg.local.train_subset {
            Some(n) => Arc::new(Subset::first(train, n)),
            None => Arc::new(train),
        };
        let valid = Subset::first(
            load(TextSplit::Valid)?,
            cfg.local.test_subset.unwrap_or(GPT_EVAL_WINDOWS),
        );
        Ok(Some((train, Arc::new(valid))))
    }

    /// ElChe's knobs when the model needs its own: the transformer averages after every batch
    /// of the slowest rank (flodl-candle's `gpt_elche` says why). `None` keeps the defaults.
    pub(crate) fn elche(self) -> Option<flodl_ddp::ElCheKnobs> {
        self.gpt().map(|_| gpt_elche())
    }

    /// How long a peer may stay silent before it is declared dead, when the model's steps need
    /// longer than the runtime's default (30 s): a rank cannot report during a step, and a step
    /// of the 6.4M transformer takes ~18 s on a loaded CPU core (45 s at a 2.5x slowdown), the
    /// 25.3M one about four times that. `None` keeps the default.
    pub(crate) fn stall_timeout(self) -> Option<std::time::Duration> {
        let secs = match self.gpt()? {
            GptSize::Tiny => 60,
            GptSize::Default => 300,
            GptSize::Large => 1200,
        };
        Some(std::time::Duration::from_secs(secs))
    }

    /// The run's data: MNIST (with `--data`, `--records` and the subsets) for the MLP, the
    /// corpus for a GPT.
    ///
    /// # Errors
    /// A missing or corrupt file (named in the message).
    pub(crate) fn data(self, cfg: &TrainConfig) -> Result<Data> {
        match self.text(cfg)? {
            Some((train, test)) => {
                Ok(Data { train, test, dir: Shakespeare::vendored_dir(), model: self })
            }
            None => Data::load(cfg),
        }
    }

    /// The factory of each rank's replica: the MLP of `mlp_widths` with SGD (`--momentum`), or
    /// the transformer with AdamW, warmup and cosine decay coming from the run's schedule, and
    /// clipping (flodl-candle's `gpt_optim`), its weights drawn from the run's seed.
    /// What one replica of this model holds, for the run's memory check: parameters and
    /// optimizer state per parameter (SGD with momentum 1, AdamW 2).
    pub(crate) fn size(self, cfg: &TrainConfig, mlp_widths: &[usize]) -> ModelSize {
        match self.gpt() {
            None => MlpConfig::new(mlp_widths, Optimizer::sgd(cfg.momentum() as f32)).size(),
            Some(size) => ModelSize {
                parameters: size.config().parameter_count() as u64,
                state_per_parameter: 2,
            },
        }
    }

    pub(crate) fn factory(self, cfg: &TrainConfig, mlp_widths: &[usize]) -> Factory {
        match self.gpt() {
            None => {
                let build =
                    Mlp::factory(MlpConfig::new(mlp_widths, Optimizer::sgd(cfg.momentum() as f32)));
                Box::new(move |ctx| Ok(Box::new(build(ctx)?) as Box<dyn Replica>))
            }
            Some(size) => Box::new(move |ctx| {
                let model = Gpt::new(size.config(), ctx.seed)?;
                Ok(Box::new(CandleReplica::new(model, gpt_optim(), ctx)?) as Box<dyn Replica>)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every model has a distinct name on the command line; the GPTs load the corpus with the
    /// fixed validation slice, the MLP none.
    #[test]
    fn models_name_their_data() -> Result<()> {
        let names: Vec<String> = Model::value_variants()
            .iter()
            .filter_map(|m| m.to_possible_value().map(|v| v.get_name().to_owned()))
            .collect();
        assert_eq!(names, ["mlp", "gpt-tiny", "gpt", "gpt-large"]);
        let mut cfg = crate::config::defaults();
        cfg.local.train_subset = Some(100);
        assert!(Model::Mlp.text(&cfg)?.is_none());
        let (train, valid) = Model::GptTiny.text(&cfg)?.context("no text")?;
        assert_eq!((train.len(), valid.len()), (100, GPT_EVAL_WINDOWS));
        assert!(Model::Gpt.describe(&[]).contains("6.4"));
        Ok(())
    }
}

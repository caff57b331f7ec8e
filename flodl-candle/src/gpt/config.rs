//! `GptConfig`, the shape of the transformer, and its three named sizes.

/// The shape of a [`Gpt`](super::Gpt): a byte-level decoder of `layers` pre-norm blocks of
/// `width` channels and `heads` attention heads, reading `context` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GptConfig {
    /// Bytes the model reads (its learned positions).
    pub context: usize,
    /// Channels of the residual stream (a multiple of `heads`).
    pub width: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads per block.
    pub heads: usize,
}

/// The three sizes of the transformer, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GptSize {
    /// About 0.8M parameters: the tests (64 bytes of context, width 128, 4 layers, 4 heads).
    Tiny,
    /// About 6.4M parameters: the README (128 bytes, width 256, 8 layers, 8 heads).
    Default,
    /// About 25M parameters: the big-state benches (128 bytes, width 512, 8 layers, 8 heads).
    Large,
}

impl GptSize {
    /// Every size, smallest first.
    pub const ALL: [GptSize; 3] = [GptSize::Tiny, GptSize::Default, GptSize::Large];

    /// The size's name on a command line (`tiny`, `default`, `large`).
    pub fn name(self) -> &'static str {
        match self {
            GptSize::Tiny => "tiny",
            GptSize::Default => "default",
            GptSize::Large => "large",
        }
    }

    /// The size named `name`, if any.
    pub fn parse(name: &str) -> Option<GptSize> {
        GptSize::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The size's configuration.
    pub fn config(self) -> GptConfig {
        match self {
            GptSize::Tiny => GptConfig { context: 64, width: 128, layers: 4, heads: 4 },
            GptSize::Default => GptConfig { context: 128, width: 256, layers: 8, heads: 8 },
            GptSize::Large => GptConfig { context: 128, width: 512, layers: 8, heads: 8 },
        }
    }
}

impl GptConfig {
    /// Vocabulary: one token per byte value.
    pub const VOCAB: usize = 256;

    /// Trainable values: the token and position embeddings (the output layer shares the
    /// token embedding), per block two layer norms, the attention's `qkv` and output
    /// projections and the 4× MLP, and the final layer norm.
    pub fn parameter_count(&self) -> usize {
        let d = self.width;
        let block =
            2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
        Self::VOCAB * d + self.context * d + self.layers * block + 2 * d
    }

    /// Channels per head.
    pub fn head_width(&self) -> usize {
        self.width / self.heads.max(1)
    }
}

/// The optimiser of the transformer: AdamW with betas (0.9, 0.95), weight decay 0.1, and the
/// gradients clipped to a global norm of 1.
pub fn gpt_optim() -> crate::Optim {
    let adamw =
        candle_nn::ParamsAdamW { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };
    crate::Optim { adamw, clip: Some(1.0) }
}

/// The learning rate of a run of `total` cohort steps: a linear warmup over `warmup` steps to
/// `lr`, then a cosine decay to `lr / 10` at the end.
pub fn gpt_schedule(lr: f64, total: u64, warmup: u64) -> flodl_ddp::control::schedule::Schedule {
    let rest = total.saturating_sub(warmup).max(1);
    flodl_ddp::control::schedule::Schedule::Cosine { lr, min_lr: lr / 10.0, total: rest }
        .with_warmup(warmup)
}

/// Batches of the slowest rank per averaging window in the transformer's Cadence and Async runs,
/// fixed: [`gpt_elche`]'s anchor.
pub const GPT_ANCHOR: usize = 1;

/// ElChe's knobs for the transformer: a window of [`GPT_ANCHOR`] batch of the slowest rank (the
/// others train theirs in the same wall time: 2-3 batches beside a rank 2.5× slower), never
/// widened.
///
/// Why: ElChe's default starts at 10 batches of the slowest rank (about 35 cohort steps beside a
/// rank 2.5× slower) and lets the window grow, so two AdamW replicas drift that far apart between
/// averages and their average loses part of each one's progress. Against issue 28's 2% bar (2
/// ranks, rank 1 at 2.5×, against one process on the same tokens; BENCHMARKS.md, "The 2% bar with a
/// fixed window") ElChe's window ended 3.8-5.5% above the single process on the tiny model in tch,
/// this one 1.0-3.1% (README model at 96 steps: 10.1% and 6.5%): the best of the windows, outer
/// steps and learning rates tried, though not within 2% in every run. A reduce of these models
/// costs milliseconds against steps of hundreds on one machine; over a slow link, a larger anchor
/// (`Trainer::elche`) trades agreement for fewer reduces.
pub fn gpt_elche() -> flodl_ddp::ElCheKnobs {
    flodl_ddp::ElCheKnobs { anchor: GPT_ANCHOR, max_anchor: GPT_ANCHOR, ..Default::default() }
}

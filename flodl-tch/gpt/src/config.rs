//! `GptConfig`: the transformer's sizes, with the three presets of issue 28.

/// The sizes of a GPT-style byte-level transformer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptConfig {
    /// Tokens (one per byte value: 256).
    pub vocab: usize,
    /// Tokens the model reads at once (learned positions up to it).
    pub context: usize,
    /// Width of the residual stream.
    pub width: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads per block (`width` must be a multiple).
    pub heads: usize,
}

/// Batches of the slowest rank per averaging window in the transformer's Cadence and Async runs,
/// fixed (ElChe's anchor and its ceiling; the others train theirs in the same wall time: 2-3
/// batches beside a rank 2.5× slower).
///
/// Why: ElChe's default starts at 10 batches of the slowest rank (about 35 cohort steps beside a
/// rank 2.5× slower) and lets the window grow, so two AdamW replicas drift that far apart between
/// averages and their average loses part of each one's progress. Against issue 28's 2% bar (2
/// ranks, rank 1 at 2.5×, against one process on the same tokens; BENCHMARKS.md, "The 2% bar with a
/// fixed window") ElChe's window ended 3.8-5.5% above the single process on the tiny model, this
/// one 1.0-3.1% (README model at 96 steps: 10.1% and 6.5%): the best of the windows, outer steps
/// and learning rates tried, though not within 2% in every run. A reduce costs milliseconds against
/// steps of hundreds. The candle transformer's `gpt_elche` uses the same anchor.
pub const GPT_ANCHOR: usize = 1;

/// The three sizes: tests, the README's run, the big-state benches; the same shapes as the
/// candle transformer's (`flodl-candle`'s `GptSize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Size {
    /// ~0.83M parameters: width 128, 4 blocks, 4 heads, context 64.
    Tiny,
    /// ~6.42M parameters: width 256, 8 blocks, 8 heads, context 128.
    Default,
    /// ~25.4M parameters: width 512, 8 blocks, 8 heads, context 128.
    Large,
}

impl GptConfig {
    /// The configuration of `size`, byte-level.
    pub fn of(size: Size) -> GptConfig {
        let (context, width, layers, heads) = match size {
            Size::Tiny => (64, 128, 4, 4),
            Size::Default => (128, 256, 8, 8),
            Size::Large => (128, 512, 8, 8),
        };
        GptConfig { vocab: 256, context, width, layers, heads }
    }

    /// How long a rank may stay silent before it is declared dead: a rank cannot report during
    /// a step, and a step of the 6.4M model takes 15-20 s on a loaded CPU core at a 2.5×
    /// slowdown (one such rank was declared dead at the runtime's default 30 s), the 25.4M one
    /// about four times that. The same bounds as `fdl`'s for the candle transformer.
    pub fn stall_timeout(&self) -> std::time::Duration {
        let secs = match self.parameters() {
            0..2_000_000 => 60,
            2_000_000..10_000_000 => 300,
            _ => 1200,
        };
        std::time::Duration::from_secs(secs)
    }

    /// Trainable values: the token and position embeddings (the token one doubling as the
    /// output layer), per block two layer norms, the attention's input and output projections
    /// and the 4×-wide MLP, and the final layer norm.
    pub fn parameters(&self) -> usize {
        let (v, c, d) = (self.vocab, self.context, self.width);
        let block =
            2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d);
        v * d + c * d + self.layers * block + 2 * d
    }
}

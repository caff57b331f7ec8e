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

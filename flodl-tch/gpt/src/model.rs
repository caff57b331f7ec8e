//! `Gpt`: a decoder-only transformer in tch (pre-norm, causal self-attention, learned
//! positions, output layer tied to the token embedding).

use flodl_ddp::{Batch, BatchEval, Error, Result};
use flodl_tch::{Model, indices};
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use crate::config::GptConfig;

/// Causal multi-head self-attention.
#[derive(Debug)]
struct Attention {
    qkv: nn::Linear,
    out: nn::Linear,
    heads: i64,
}

impl Attention {
    fn new(p: nn::Path<'_>, cfg: &GptConfig, init: nn::Init, out_init: nn::Init) -> Attention {
        let d = cfg.width as i64;
        let lin =
            |ws_init| nn::LinearConfig { ws_init, bs_init: Some(nn::Init::Const(0.0)), bias: true };
        Attention {
            qkv: nn::linear(&p / "qkv", d, 3 * d, lin(init)),
            out: nn::linear(&p / "out", d, d, lin(out_init)),
            heads: cfg.heads as i64,
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let (b, t, d) = x.size3().unwrap_or((0, 0, 0));
        let split = |t_: Tensor| t_.view([b, t, self.heads, d / self.heads]).transpose(1, 2);
        let qkv = self.qkv.forward(x).chunk(3, 2);
        let [q, k, v]: [Tensor; 3] = match qkv.try_into() {
            Ok(parts) => parts,
            Err(_) => unreachable!("chunk(3) of a 3d-wide tensor gives three parts"),
        };
        let y = Tensor::scaled_dot_product_attention::<Tensor>(
            &split(q),
            &split(k),
            &split(v),
            None,
            0.0,
            true,
            None,
            false,
        );
        self.out.forward(&y.transpose(1, 2).contiguous().view([b, t, d]))
    }
}

/// One pre-norm block: `x + attention(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Debug)]
struct Block {
    norm1: nn::LayerNorm,
    attention: Attention,
    norm2: nn::LayerNorm,
    up: nn::Linear,
    down: nn::Linear,
}

impl Block {
    fn new(p: nn::Path<'_>, cfg: &GptConfig) -> Block {
        let d = cfg.width as i64;
        // GPT-2's initialisation: N(0, 0.02), the residual projections scaled by 1/sqrt(2L),
        // biases 0 (as the candle transformer).
        let init = nn::Init::Randn { mean: 0.0, stdev: 0.02 };
        let out_init =
            nn::Init::Randn { mean: 0.0, stdev: 0.02 / (2.0 * cfg.layers as f64).sqrt() };
        let lin =
            |ws_init| nn::LinearConfig { ws_init, bs_init: Some(nn::Init::Const(0.0)), bias: true };
        Block {
            norm1: nn::layer_norm(&p / "norm1", vec![d], Default::default()),
            attention: Attention::new(&p / "attention", cfg, init, out_init),
            norm2: nn::layer_norm(&p / "norm2", vec![d], Default::default()),
            up: nn::linear(&p / "up", d, 4 * d, lin(init)),
            down: nn::linear(&p / "down", 4 * d, d, lin(out_init)),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let x = x + self.attention.forward(&self.norm1.forward(x));
        let h = self.up.forward(&self.norm2.forward(&x)).gelu("tanh");
        &x + self.down.forward(&h)
    }
}

/// The transformer, its variables in the `VarStore` it was built on.
#[derive(Debug)]
pub struct Gpt {
    cfg: GptConfig,
    tokens: nn::Embedding,
    positions: nn::Embedding,
    blocks: Vec<Block>,
    norm: nn::LayerNorm,
}

impl Gpt {
    /// The model of `cfg` with its variables under `p` (weights drawn from libtorch's generator:
    /// build it inside [`flodl_tch::seeded`] for the same weights on every rank).
    pub fn new(p: &nn::Path<'_>, cfg: GptConfig) -> Gpt {
        let (v, c, d) = (cfg.vocab as i64, cfg.context as i64, cfg.width as i64);
        let emb = nn::EmbeddingConfig {
            ws_init: nn::Init::Randn { mean: 0.0, stdev: 0.02 },
            ..Default::default()
        };
        Gpt {
            cfg,
            tokens: nn::embedding(p / "tokens", v, d, emb),
            positions: nn::embedding(p / "positions", c, d, emb),
            blocks: (0..cfg.layers).map(|i| Block::new(p / "blocks" / i, &cfg)).collect(),
            norm: nn::layer_norm(p / "norm", vec![d], Default::default()),
        }
    }

    /// The sizes.
    pub fn config(&self) -> &GptConfig {
        &self.cfg
    }

    /// Logits `[n, t, vocab]` of the next token after each of `tokens` (`[n, t]`, `Int64`,
    /// `t <= context`).
    pub fn forward(&self, tokens: &Tensor) -> Tensor {
        let t = tokens.size().get(1).copied().unwrap_or(0);
        let positions = Tensor::arange(t, (Kind::Int64, tokens.device()));
        let mut x = self.tokens.forward(tokens) + self.positions.forward(&positions);
        for block in &self.blocks {
            x = block.forward(&x);
        }
        self.norm.forward(&x).matmul(&self.tokens.ws.tr())
    }

    /// Inputs `[n, context]` and targets `[n, context]` of a batch of token windows
    /// (`[n, context + 1]`, field 0).
    fn split(&self, batch: &Batch) -> Result<(Tensor, Tensor)> {
        let windows = indices(batch, 0)?;
        let c = self.cfg.context as i64;
        match windows.size().as_slice() {
            [_, w] if *w == c + 1 => {}
            other => {
                return Err(Error::mismatch(
                    "a batch's token windows",
                    format!("[n, {}]", c + 1),
                    format!("{other:?}"),
                ));
            }
        }
        Ok((windows.narrow(1, 0, c), windows.narrow(1, 1, c)))
    }

    /// Per-token cross-entropy `[n, context]` of a batch, in nats, and the logits.
    fn token_losses(&self, batch: &Batch) -> Result<(Tensor, Tensor, Tensor)> {
        let (x, y) = self.split(batch)?;
        let logits = self.forward(&x);
        let v = self.cfg.vocab as i64;
        let losses = logits
            .view([-1, v])
            .cross_entropy_loss::<Tensor>(&y.reshape([-1]), None, tch::Reduction::None, -100, 0.0)
            .view_as(&y);
        Ok((losses, logits, y))
    }
}

impl Model for Gpt {
    /// The mean next-byte cross-entropy over the batch's windows, in nats per byte.
    fn loss(&self, batch: &Batch) -> Result<Tensor> {
        Ok(self.token_losses(batch)?.0.mean(Kind::Float))
    }

    /// Per window: its mean next-byte cross-entropy (summed over the windows: the run's
    /// evaluation loss is nats per byte), and as "correct" the windows whose last byte the
    /// model predicts first (next-byte accuracy after a full context).
    fn evaluate(&self, batch: &Batch) -> Result<Option<BatchEval>> {
        let (losses, logits, y) = self.token_losses(batch)?;
        let loss_sum = losses.mean_dim(1, false, Kind::Double).sum(Kind::Double).double_value(&[]);
        let last = logits.select(1, -1).argmax(-1, false);
        let correct = last.eq_tensor(&y.select(1, -1)).sum(Kind::Int64).int64_value(&[]);
        Ok(Some(BatchEval { loss_sum, correct: correct as usize, samples: batch.len() }))
    }
}

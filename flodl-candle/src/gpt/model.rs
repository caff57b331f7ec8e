//! `Gpt`, the transformer: its variables, forward pass, training loss and evaluation.

use candle_core::{D, DType, Device, Tensor, Var};
use flodl_ddp::{Batch, BatchEval, ConfigError, Error, Field, Result};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use super::config::GptConfig;
use crate::model::CandleModel;
use crate::vars::candle_error;

/// Standard deviation of the initial weights (GPT-2's).
const INIT_STD: f64 = 0.02;

/// Epsilon of the layer norms.
const NORM_EPS: f32 = 1e-5;

/// One pre-norm block's variables.
#[derive(Debug)]
struct Block {
    ln1: (Var, Var),
    qkv: (Var, Var),
    proj: (Var, Var),
    ln2: (Var, Var),
    fc: (Var, Var),
    out: (Var, Var),
}

/// A byte-level GPT: token and learned position embeddings, `layers` pre-norm blocks
/// (`x + attn(ln(x))`, `x + mlp(ln(x))`, causal multi-head attention, a 4× GELU MLP), a final
/// layer norm, and logits through the transposed token embedding (tied weights).
///
/// The weights are drawn from the seed: every rank that builds the model with the same seed
/// holds the same initial state.
#[derive(Debug)]
pub struct Gpt {
    config: GptConfig,
    wte: Var,
    wpe: Var,
    blocks: Vec<Block>,
    ln_f: (Var, Var),
    /// Every variable, in a fixed order (embeddings, blocks in order, final norm).
    vars: Vec<Var>,
    /// `[context, context]`: 0 on and below the diagonal, a large negative number above.
    mask: Tensor,
}

/// Builds the model's variables from one seeded generator, in a fixed order.
struct Init {
    rng: rand_xoshiro::Xoshiro256PlusPlus,
    device: Device,
    vars: Vec<Var>,
}

impl Init {
    fn var(&mut self, shape: &[usize], values: Vec<f32>) -> candle_core::Result<Var> {
        let v = Var::from_tensor(&Tensor::from_vec(values, shape, &self.device)?)?;
        self.vars.push(v.clone());
        Ok(v)
    }

    fn normal(&mut self, shape: &[usize], std: f64) -> candle_core::Result<Var> {
        let n: usize = shape.iter().product();
        let dist = Normal::new(0.0f64, std).map_err(candle_core::Error::wrap)?;
        let values = (0..n).map(|_| dist.sample(&mut self.rng) as f32).collect();
        self.var(shape, values)
    }

    fn constant(&mut self, shape: &[usize], c: f32) -> candle_core::Result<Var> {
        self.var(shape, vec![c; shape.iter().product()])
    }

    /// A linear layer `[fan_in, fan_out]` and its bias.
    fn linear(
        &mut self,
        fan_in: usize,
        fan_out: usize,
        std: f64,
    ) -> candle_core::Result<(Var, Var)> {
        Ok((self.normal(&[fan_in, fan_out], std)?, self.constant(&[fan_out], 0.0)?))
    }

    fn norm(&mut self, d: usize) -> candle_core::Result<(Var, Var)> {
        Ok((self.constant(&[d], 1.0)?, self.constant(&[d], 0.0)?))
    }
}

impl Gpt {
    /// A model of `config`, its weights drawn from `seed` (normal, std 0.02; the projections
    /// into the residual stream scaled by `1/sqrt(2·layers)`; biases 0, norm gains 1).
    ///
    /// # Errors
    /// [`Error::Invalid`] when `heads` does not divide `width` or a dimension is 0; candle's.
    pub fn new(config: GptConfig, seed: u64) -> Result<Gpt> {
        let GptConfig { context, width: d, layers, heads } = config;
        if context == 0 || d == 0 || layers == 0 || heads == 0 || d % heads != 0 {
            return Err(ConfigError::out_of_range(
                Field::Model,
                format!("{config:?}"),
                "a transformer of positive sizes, its heads dividing its width",
            )
            .into());
        }
        let build = || -> candle_core::Result<Gpt> {
            let device = Device::Cpu;
            let mut init = Init {
                rng: rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed),
                device: device.clone(),
                vars: Vec::new(),
            };
            let residual_std = INIT_STD / ((2 * layers) as f64).sqrt();
            let wte = init.normal(&[GptConfig::VOCAB, d], INIT_STD)?;
            let wpe = init.normal(&[context, d], INIT_STD)?;
            let mut blocks = Vec::with_capacity(layers);
            for _ in 0..layers {
                blocks.push(Block {
                    ln1: init.norm(d)?,
                    qkv: init.linear(d, 3 * d, INIT_STD)?,
                    proj: init.linear(d, d, residual_std)?,
                    ln2: init.norm(d)?,
                    fc: init.linear(d, 4 * d, INIT_STD)?,
                    out: init.linear(4 * d, d, residual_std)?,
                });
            }
            let ln_f = init.norm(d)?;
            let mask: Vec<f32> = (0..context * context)
                .map(|i| if i % context > i / context { -1e9 } else { 0.0 })
                .collect();
            let mask = Tensor::from_vec(mask, (context, context), &device)?;
            Ok(Gpt { config, wte, wpe, blocks, ln_f, vars: init.vars, mask })
        };
        build().map_err(candle_error)
    }

    /// The model's shape.
    pub fn config(&self) -> GptConfig {
        self.config
    }

    /// Logits `[n·t, 256]` of tokens `[n, t]` (u32, `t <= context`), row `i·t + j` predicting
    /// the byte after token `j` of sequence `i`.
    ///
    /// # Errors
    /// candle's (a sequence longer than the context among them).
    pub fn forward(&self, tokens: &Tensor) -> candle_core::Result<Tensor> {
        let (n, t) = tokens.dims2()?;
        let d = self.config.width;
        let (h, hd) = (self.config.heads, self.config.head_width());
        let tok = self.wte.as_tensor().index_select(&tokens.flatten_all()?, 0)?;
        let pos = self.wpe.as_tensor().narrow(0, 0, t)?;
        let mut x = tok.reshape((n, t, d))?.broadcast_add(&pos)?.reshape((n * t, d))?;
        let mask = self.mask.narrow(0, 0, t)?.narrow(1, 0, t)?;
        let scale = 1.0 / (hd as f64).sqrt();
        for b in &self.blocks {
            let a = layer_norm(&x, &b.ln1)?;
            let qkv = linear(&a, &b.qkv)?.reshape((n, t, 3, h, hd))?;
            let head = |k: usize| -> candle_core::Result<Tensor> {
                qkv.narrow(2, k, 1)?.squeeze(2)?.transpose(1, 2)?.contiguous()
            };
            let (q, k, v) = (head(0)?, head(1)?, head(2)?);
            let att = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&mask)?;
            let att = candle_nn::ops::softmax(&att, D::Minus1)?;
            let y = att.matmul(&v)?.transpose(1, 2)?.reshape((n * t, d))?;
            x = (x + linear(&y, &b.proj)?)?;
            let m = layer_norm(&x, &b.ln2)?;
            let m = linear(&linear(&m, &b.fc)?.gelu()?, &b.out)?;
            x = (x + m)?;
        }
        let x = layer_norm(&x, &self.ln_f)?;
        x.matmul(&self.wte.as_tensor().t()?)
    }
}

fn linear(x: &Tensor, (w, b): &(Var, Var)) -> candle_core::Result<Tensor> {
    x.matmul(w.as_tensor())?.broadcast_add(b.as_tensor())
}

fn layer_norm(x: &Tensor, (g, b): &(Var, Var)) -> candle_core::Result<Tensor> {
    // The fused `candle_nn::ops::layer_norm` has no backward pass; this one does.
    candle_nn::ops::layer_norm_slow(x, g.as_tensor(), b.as_tensor(), NORM_EPS)
}

/// Inputs `[n, t]` and targets `[n·t]` (u32) from a batch of token windows (`[n, t + 1]` i32,
/// [`flodl_data::ByteWindows`]' layout).
///
/// # Errors
/// A batch of another layout, or tokens outside `0..256`.
fn inputs_and_targets(batch: &Batch, device: &Device) -> Result<(Tensor, Tensor)> {
    let field = batch.field(flodl_data::ByteWindows::TOKENS)?;
    let (n, w) = match field.shape() {
        [n, w] if *w >= 2 => (*n, *w),
        shape => {
            return Err(Error::mismatch(
                "a batch's token windows",
                "[n, t+1] with t >= 1",
                format!("{shape:?}"),
            ));
        }
    };
    let tokens = field.as_slice::<i32>()?;
    let byte = |t: i32| {
        u32::try_from(t)
            .ok()
            .filter(|&b| (b as usize) < GptConfig::VOCAB)
            .ok_or_else(|| Error::mismatch("a token", "a byte (0..256)", t))
    };
    let (mut x, mut y) = (Vec::with_capacity(n * (w - 1)), Vec::with_capacity(n * (w - 1)));
    for row in tokens.chunks_exact(w) {
        for &t in &row[..w - 1] {
            x.push(byte(t)?);
        }
        for &t in &row[1..] {
            y.push(byte(t)?);
        }
    }
    let x = Tensor::from_vec(x, (n, w - 1), device).map_err(candle_error)?;
    let y = Tensor::from_vec(y, n * (w - 1), device).map_err(candle_error)?;
    Ok((x, y))
}

impl CandleModel for Gpt {
    fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// The mean cross-entropy, in nats per predicted byte.
    fn loss(&self, batch: &Batch, device: &Device) -> Result<Tensor> {
        let (x, y) = inputs_and_targets(batch, device)?;
        let logits = self.forward(&x).map_err(candle_error)?;
        candle_nn::loss::cross_entropy(&logits, &y).map_err(candle_error)
    }

    /// Every predicted byte is a sample: `loss_sum` sums nats over the bytes (so the mean is
    /// nats per byte), `correct` counts the bytes whose most likely prediction was right.
    fn evaluate(&self, batch: &Batch, device: &Device) -> Result<BatchEval> {
        let (x, y) = inputs_and_targets(batch, device)?;
        let eval = || -> candle_core::Result<BatchEval> {
            let logits = self.forward(&x)?.detach();
            let picked = candle_nn::ops::log_softmax(&logits, 1)?
                .gather(&y.unsqueeze(1)?, 1)?
                .to_dtype(DType::F64)?
                .sum_all()?
                .to_scalar::<f64>()?;
            let correct =
                logits.argmax(1)?.eq(&y)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
            Ok(BatchEval { loss_sum: -picked, correct: correct as usize, samples: y.dims1()? })
        };
        eval().map_err(candle_error)
    }
}

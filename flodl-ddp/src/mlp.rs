//! The reference replica: a ReLU multilayer perceptron with softmax cross-entropy, SGD or Adam.

use flodl_data::Dataset;
use flodl_tensor::ops::Transpose::{No, Yes};
use flodl_tensor::{DType, Stream, Tensor, ops};
use serde::{Deserialize, Serialize};

use crate::config_error::{ConfigError, Field};
use crate::contract::replica::{Batch, BatchEval, Replica, ReplicaContext};
use crate::{Error, Result};

/// The optimizer of the reference replica (the learning rate comes from the runtime each step).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Optimizer {
    /// SGD with momentum and L2 weight decay added to the gradient (PyTorch semantics).
    Sgd {
        /// Momentum factor (0 disables momentum).
        momentum: f32,
        /// L2 weight decay added to the gradient.
        weight_decay: f32,
    },
    /// Adam with bias correction and L2 weight decay added to the gradient.
    Adam {
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Denominator epsilon.
        eps: f32,
        /// L2 weight decay added to the gradient.
        weight_decay: f32,
    },
}

impl Optimizer {
    /// SGD with `momentum` and no weight decay.
    pub fn sgd(momentum: f32) -> Self {
        Optimizer::Sgd { momentum, weight_decay: 0.0 }
    }

    /// Adam with the usual defaults (0.9, 0.999, 1e-8) and no weight decay.
    pub fn adam() -> Self {
        Optimizer::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 }
    }

    fn state_per_param(&self) -> usize {
        match self {
            Optimizer::Sgd { .. } => 1,
            Optimizer::Adam { .. } => 2,
        }
    }
}

/// The shape of the reference MLP: layer widths from input to classes, and its optimizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlpConfig {
    /// Widths from the input features to the number of classes, e.g. `[784, 256, 128, 10]`.
    pub widths: Vec<usize>,
    /// The optimizer.
    pub optimizer: Optimizer,
}

impl MlpConfig {
    /// An MLP of `widths` trained with `optimizer`.
    pub fn new(widths: &[usize], optimizer: Optimizer) -> Self {
        Self { widths: widths.to_vec(), optimizer }
    }

    /// The model's size for [`Trainer::model_size`](crate::Trainer::model_size): its weights
    /// and biases, and the optimizer's state per parameter.
    pub fn size(&self) -> crate::contract::model_size::ModelSize {
        let parameters = self
            .widths
            .windows(2)
            .map(|w| (w[0] as u64).saturating_mul(w[1] as u64).saturating_add(w[1] as u64))
            .fold(0u64, u64::saturating_add);
        crate::contract::model_size::ModelSize {
            parameters,
            state_per_parameter: self.optimizer.state_per_param() as u32,
        }
    }

    fn check(&self) -> Result<()> {
        if self.widths.len() < 2 || self.widths.contains(&0) {
            return Err(ConfigError::out_of_range(
                Field::Model,
                format!("MLP widths {:?}", self.widths),
                "at least two non-zero widths",
            )
            .into());
        }
        Ok(())
    }
}

/// Forward and backward buffers for one batch size.
#[derive(Debug)]
struct Activations {
    n: usize,
    /// Pre-activation output of every layer (the last one is the logits).
    z: Vec<Tensor>,
    /// ReLU output of every hidden layer.
    h: Vec<Tensor>,
    /// Gradient of the mean loss with respect to `z`.
    dz: Vec<Tensor>,
    /// Gradient of the mean loss with respect to `h`.
    dh: Vec<Tensor>,
}

impl Activations {
    fn new(widths: &[usize], n: usize, stream: &Stream) -> Result<Self> {
        let layers = widths.len() - 1;
        let mut z = Vec::with_capacity(layers);
        let mut dz = Vec::with_capacity(layers);
        let mut h = Vec::with_capacity(layers - 1);
        let mut dh = Vec::with_capacity(layers - 1);
        for (l, &out) in widths[1..].iter().enumerate() {
            z.push(Tensor::zeros(&[n, out], DType::F32, stream)?);
            dz.push(Tensor::zeros(&[n, out], DType::F32, stream)?);
            if l + 1 < layers {
                h.push(Tensor::zeros(&[n, out], DType::F32, stream)?);
                dh.push(Tensor::zeros(&[n, out], DType::F32, stream)?);
            }
        }
        Ok(Self { n, z, h, dz, dh })
    }
}

/// A ReLU MLP with softmax cross-entropy and a fused SGD or Adam optimizer, built from
/// flodl-tensor kernels on any device.
///
/// Parameters are ordered `[W0, b0, W1, b1, …]`, `W_l` of shape `[in, out]`. Weights start
/// Kaiming-uniform (bound `sqrt(6 / fan_in)`, `sqrt(3 / fan_in)` for the output layer) from the
/// seed, biases at zero, so every rank given the same seed starts identical. Every buffer a
/// training step touches is allocated up front for the training batch size.
///
/// A training batch has two fields: inputs `[n, widths[0]]` (f32) and class labels `[n]` (i32).
#[derive(Debug)]
pub struct Mlp {
    config: MlpConfig,
    stream: Stream,
    params: Vec<Tensor>,
    grads: Vec<Tensor>,
    /// SGD: one momentum buffer per parameter; Adam: first moments then second moments.
    state: Vec<Tensor>,
    adam_steps: u64,
    train: Activations,
    eval: Option<Activations>,
}

impl Mlp {
    /// Builds the MLP on `stream`'s device for training batches of `batch_size` samples.
    ///
    /// # Errors
    /// [`Error::Invalid`] for fewer than two widths, a zero width or a zero batch size; a tensor
    /// error from allocation.
    pub fn new(config: &MlpConfig, batch_size: usize, seed: u64, stream: &Stream) -> Result<Mlp> {
        config.check()?;
        if batch_size == 0 {
            return Err(ConfigError::out_of_range(Field::BatchSize, 0, "at least 1").into());
        }
        let w = &config.widths;
        let layers = w.len() - 1;
        let mut params = Vec::with_capacity(2 * layers);
        let mut grads = Vec::with_capacity(2 * layers);
        for l in 0..layers {
            let (fan_in, out) = (w[l], w[l + 1]);
            let gain = if l + 1 == layers { 3.0 } else { 6.0 };
            let bound = (gain / fan_in as f32).sqrt();
            let layer_seed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(l as u64 + 1);
            params.push(Tensor::rand_uniform(&[fan_in, out], -bound, bound, layer_seed, stream)?);
            params.push(Tensor::zeros(&[out], DType::F32, stream)?);
            grads.push(Tensor::zeros(&[fan_in, out], DType::F32, stream)?);
            grads.push(Tensor::zeros(&[out], DType::F32, stream)?);
        }
        let mut state = Vec::with_capacity(params.len() * config.optimizer.state_per_param());
        for _ in 0..config.optimizer.state_per_param() {
            for p in &params {
                state.push(Tensor::zeros(p.shape(), DType::F32, stream)?);
            }
        }
        let train = Activations::new(w, batch_size, stream)?;
        Ok(Mlp {
            config: config.clone(),
            stream: stream.clone(),
            params,
            grads,
            state,
            adam_steps: 0,
            train,
            eval: None,
        })
    }

    /// A replica factory for the trainer: builds this MLP from each rank's context.
    pub fn factory(config: MlpConfig) -> impl Fn(&ReplicaContext) -> Result<Mlp> + Send + Sync {
        move |ctx| Mlp::new(&config, ctx.batch_size, ctx.seed, &ctx.stream)
    }

    /// The configuration it was built from.
    pub fn config(&self) -> &MlpConfig {
        &self.config
    }

    /// Evaluates the model on every sample of `dataset` in batches of `batch_size`: the mean
    /// loss and the accuracy ([`crate::evaluate`] on the MLP's stream).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a zero batch size; [`Error::ReplicaMismatch`] for a dataset whose
    /// layout does not fit the MLP; data and tensor errors.
    pub fn evaluate(
        &mut self,
        dataset: &dyn Dataset,
        batch_size: usize,
    ) -> Result<crate::EvalMetrics> {
        let stream = self.stream.clone();
        crate::contract::evaluation::evaluate(self, dataset, batch_size, &stream)?
            .ok_or_else(|| Error::mismatch("an MLP evaluation", "a result", "none"))
    }

    fn inputs<'b>(&self, batch: &'b Batch) -> Result<(&'b Tensor, &'b Tensor)> {
        let x = batch.field(0)?;
        let y = batch.field(1)?;
        let features = self.config.widths[0];
        if x.shape() != [batch.len(), features] || x.dtype() != DType::F32 {
            return Err(Error::mismatch(
                "MLP inputs",
                format!("f32 [{}, {features}]", batch.len()),
                format!("{:?} {:?}", x.dtype(), x.shape()),
            ));
        }
        if y.shape() != [batch.len()] || y.dtype() != DType::I32 {
            return Err(Error::mismatch(
                "MLP labels",
                format!("i32 [{}]", batch.len()),
                format!("{:?} {:?}", y.dtype(), y.shape()),
            ));
        }
        Ok((x, y))
    }

    /// Forward pass into `acts`; leaves the logits in the last `z`.
    fn forward(params: &[Tensor], acts: &mut Activations, x: &Tensor, s: &Stream) -> Result<()> {
        let layers = acts.z.len();
        for l in 0..layers {
            let input = if l == 0 { x } else { &acts.h[l - 1] };
            let z = &mut acts.z[l];
            ops::gemm(1.0, input, No, &params[2 * l], No, 0.0, z, s)?;
            ops::bias_add(z, &params[2 * l + 1], s)?;
            if l + 1 < layers {
                ops::relu(&acts.z[l], &mut acts.h[l], s)?;
            }
        }
        Ok(())
    }
}

impl Replica for Mlp {
    fn train_step(&mut self, batch: &Batch) -> Result<f32> {
        if batch.len() != self.train.n {
            return Err(Error::mismatch("an MLP batch's size", self.train.n, batch.len()));
        }
        let (x, y) = self.inputs(batch)?;
        let s = &self.stream;
        let acts = &mut self.train;
        Mlp::forward(&self.params, acts, x, s)?;
        let layers = acts.z.len();
        let loss = ops::log_softmax_nll(&acts.z[layers - 1], y, &mut acts.dz[layers - 1], s)?;
        for l in (0..layers).rev() {
            let input = if l == 0 { x } else { &acts.h[l - 1] };
            ops::gemm(1.0, input, Yes, &acts.dz[l], No, 0.0, &mut self.grads[2 * l], s)?;
            ops::sum_rows(&acts.dz[l], &mut self.grads[2 * l + 1], s)?;
            if l > 0 {
                ops::gemm(
                    1.0,
                    &acts.dz[l],
                    No,
                    &self.params[2 * l],
                    Yes,
                    0.0,
                    &mut acts.dh[l - 1],
                    s,
                )?;
                let (lower, _) = acts.dz.split_at_mut(l);
                ops::relu_backward(&acts.dh[l - 1], &acts.h[l - 1], &mut lower[l - 1], s)?;
            }
        }
        Ok(loss)
    }

    fn step(&mut self, lr: f32) -> Result<()> {
        let s = &self.stream;
        let n = self.params.len();
        match self.config.optimizer {
            Optimizer::Sgd { momentum, weight_decay } => {
                for ((p, g), m) in self.params.iter_mut().zip(&self.grads).zip(&mut self.state) {
                    ops::sgd_step(p, g, m, lr, momentum, weight_decay, s)?;
                }
            }
            Optimizer::Adam { beta1, beta2, eps, weight_decay } => {
                self.adam_steps += 1;
                let (m, v) = self.state.split_at_mut(n);
                for (((p, g), m), v) in self.params.iter_mut().zip(&self.grads).zip(m).zip(v) {
                    ops::adam_step(
                        p,
                        g,
                        m,
                        v,
                        lr,
                        beta1,
                        beta2,
                        eps,
                        weight_decay,
                        self.adam_steps,
                        s,
                    )?;
                }
            }
        }
        Ok(())
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    fn parameters_mut(&mut self) -> &mut [Tensor] {
        &mut self.params
    }

    fn gradients_mut(&mut self) -> Option<&mut [Tensor]> {
        Some(&mut self.grads)
    }

    fn optimizer_state(&self) -> &[Tensor] {
        &self.state
    }

    fn optimizer_state_mut(&mut self) -> &mut [Tensor] {
        &mut self.state
    }

    fn optimizer_steps(&self) -> u64 {
        self.adam_steps
    }

    fn set_optimizer_steps(&mut self, steps: u64) {
        self.adam_steps = steps;
    }

    fn reset_optimizer(&mut self, stream: &Stream) -> Result<()> {
        self.adam_steps = 0;
        for t in &mut self.state {
            ops::fill(t, 0.0, stream)?;
        }
        Ok(())
    }

    fn evaluate_batch(&mut self, batch: &Batch) -> Result<Option<BatchEval>> {
        let (x, y) = self.inputs(batch)?;
        let n = batch.len();
        let s = &self.stream;
        let acts = if self.train.n == n {
            &mut self.train
        } else {
            if self.eval.as_ref().map(|a| a.n) != Some(n) {
                self.eval = Some(Activations::new(&self.config.widths, n, s)?);
            }
            match self.eval.as_mut() {
                Some(a) => a,
                None => return Ok(None),
            }
        };
        Mlp::forward(&self.params, acts, x, s)?;
        let last = acts.z.len() - 1;
        let loss = ops::log_softmax_nll(&acts.z[last], y, &mut acts.dz[last], s)?;
        let correct = ops::argmax_correct(&acts.z[last], y, s)?;
        Ok(Some(BatchEval { loss_sum: f64::from(loss) * n as f64, correct, samples: n }))
    }
}

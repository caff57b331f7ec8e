//! The model: a LeNet-5-style CNN in candle.

use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{Conv2d, Conv2dConfig, Linear, VarBuilder, VarMap};
use flodl_candle::{CandleModel, candle_error};
use flodl_ddp::{Batch, BatchEval};

use crate::data::batch_tensors;

/// LeNet-5 for 28 × 28 images: conv 5×5 (6, padded) → ReLU → max-pool 2 → conv 5×5 (16) →
/// ReLU → max-pool 2 → 400 → 120 → 84 → 10.
#[derive(Debug)]
pub struct LeNet {
    conv1: Conv2d,
    conv2: Conv2d,
    fc1: Linear,
    fc2: Linear,
    fc3: Linear,
    /// The trainable variables, in a fixed order (by name).
    vars: Vec<Var>,
}

impl LeNet {
    /// A freshly initialised model (candle's default initialisers).
    ///
    /// # Errors
    /// candle's, when a variable cannot be made.
    pub fn new(device: &Device) -> candle_core::Result<LeNet> {
        let map = VarMap::new();
        let vb = VarBuilder::from_varmap(&map, DType::F32, device);
        let padded = Conv2dConfig { padding: 2, ..Default::default() };
        let conv1 = candle_nn::conv2d(1, 6, 5, padded, vb.pp("conv1"))?;
        let conv2 = candle_nn::conv2d(6, 16, 5, Conv2dConfig::default(), vb.pp("conv2"))?;
        let fc1 = candle_nn::linear(400, 120, vb.pp("fc1"))?;
        let fc2 = candle_nn::linear(120, 84, vb.pp("fc2"))?;
        let fc3 = candle_nn::linear(84, 10, vb.pp("fc3"))?;
        let mut named: Vec<(String, Var)> = match map.data().lock() {
            Ok(vars) => vars.iter().map(|(n, v)| (n.clone(), v.clone())).collect(),
            Err(_) => candle_core::bail!("the variable map is poisoned"),
        };
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let vars = named.into_iter().map(|(_, v)| v).collect();
        Ok(LeNet { conv1, conv2, fc1, fc2, fc3, vars })
    }

    /// Logits `[n, 10]` of images `[n, 1, 28, 28]`.
    ///
    /// # Errors
    /// candle's.
    pub fn forward(&self, images: &Tensor) -> candle_core::Result<Tensor> {
        let x = self.conv1.forward(images)?.relu()?.max_pool2d(2)?;
        let x = self.conv2.forward(&x)?.relu()?.max_pool2d(2)?;
        let x = x.flatten_from(1)?;
        let x = self.fc1.forward(&x)?.relu()?;
        let x = self.fc2.forward(&x)?.relu()?;
        self.fc3.forward(&x)
    }

    /// The mean cross-entropy of `images` against `labels` (`[n]` u32).
    ///
    /// # Errors
    /// candle's.
    pub fn loss(&self, images: &Tensor, labels: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::loss::cross_entropy(&self.forward(images)?, labels)
    }

    /// The trainable variables, in their fixed order.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }
}

impl CandleModel for LeNet {
    fn vars(&self) -> &[Var] {
        &self.vars
    }

    fn loss(&self, batch: &Batch, device: &Device) -> flodl_ddp::Result<Tensor> {
        let (x, y) = batch_tensors(batch, device)?;
        LeNet::loss(self, &x, &y).map_err(candle_error)
    }

    fn evaluate(&self, batch: &Batch, device: &Device) -> flodl_ddp::Result<BatchEval> {
        let (x, y) = batch_tensors(batch, device)?;
        let eval = || -> candle_core::Result<BatchEval> {
            let logits = self.forward(&x)?;
            let losses = candle_nn::ops::log_softmax(&logits, 1)?
                .gather(&y.unsqueeze(1)?, 1)?
                .sum_all()?
                .to_scalar::<f32>()?;
            let correct = logits
                .argmax(1)?
                .eq(&y)?
                .to_dtype(candle_core::DType::F32)?
                .sum_all()?
                .to_scalar::<f32>()?;
            Ok(BatchEval {
                loss_sum: -f64::from(losses),
                correct: correct as usize,
                samples: batch.len(),
            })
        };
        eval().map_err(candle_error)
    }
}

//! `AdamW`, the optimizer of a candle model whose state is flodl tensors: the moments a
//! checkpoint saves and a resume restores.

use candle_core::Var;
use candle_core::backprop::GradStore;
use candle_nn::ParamsAdamW;
use flodl_ddp::Result;
use flodl_tensor::{DType, Stream, Tensor, ops};

use crate::replica::Optim;
use crate::vars::{read_tensor, read_var, write_var};

/// AdamW with decoupled weight decay and global-norm clipping over a candle model's variables,
/// its parameters, gradients and moments held as flodl tensors (candle-nn's `AdamW` keeps its
/// moments to itself, so a checkpoint could not save them).
///
/// A step reads the gradients out of candle's `GradStore` ([`AdamW::take_grads`]), clips
/// them, decays the parameters by `1 − lr·λ` and takes flodl-tensor's bias-corrected Adam step
/// (the rule the MLP uses, with no decay of its own), then writes the parameters back into the
/// variables ([`AdamW::write_vars`]). The result is candle-nn's AdamW step.
#[derive(Debug)]
pub struct AdamW {
    settings: ParamsAdamW,
    clip: Option<f64>,
    /// The variables' values, current after every step.
    params: Vec<Tensor>,
    /// The gradients of the last [`AdamW::take_grads`], one per parameter.
    grads: Vec<Tensor>,
    /// The first moments of every parameter, then the second moments.
    state: Vec<Tensor>,
    /// Steps taken since the moments were last zeroed (the bias correction's `t`).
    steps: u64,
    stream: Stream,
}

impl AdamW {
    /// The optimizer of `vars` (their values read now), with moments of zero, on `stream` (a
    /// CPU stream: candle's variables here live on the CPU).
    ///
    /// # Errors
    /// A tensor's, or reading a variable.
    pub fn new(vars: &[Var], optim: &Optim, stream: &Stream) -> Result<AdamW> {
        let zeros = || -> Result<Vec<Tensor>> {
            Ok(vars
                .iter()
                .map(|v| Tensor::zeros(v.dims(), DType::F32, stream))
                .collect::<flodl_tensor::Result<_>>()?)
        };
        let mut state = zeros()?;
        state.extend(zeros()?);
        let mut adamw = AdamW {
            settings: optim.adamw.clone(),
            clip: optim.clip,
            params: zeros()?,
            grads: zeros()?,
            state,
            steps: 0,
            stream: stream.clone(),
        };
        adamw.read_vars(vars)?;
        Ok(adamw)
    }

    /// Copies the variables' values into the parameters (after someone else wrote them).
    ///
    /// # Errors
    /// As [`read_var`].
    pub fn read_vars(&mut self, vars: &[Var]) -> Result<()> {
        for (v, t) in vars.iter().zip(&mut self.params) {
            read_var(v, t.as_mut_slice::<f32>()?)?;
        }
        Ok(())
    }

    /// Writes the parameters into the variables.
    ///
    /// # Errors
    /// As [`write_var`].
    pub fn write_vars(&self, vars: &[Var]) -> Result<()> {
        for (v, t) in vars.iter().zip(&self.params) {
            write_var(v, t.as_slice::<f32>()?)?;
        }
        Ok(())
    }

    /// Copies the gradients of `vars` out of `grads` (zero for a variable without one).
    ///
    /// # Errors
    /// As [`read_var`].
    pub fn take_grads(&mut self, vars: &[Var], grads: &GradStore) -> Result<()> {
        for (v, g) in vars.iter().zip(&mut self.grads) {
            match grads.get(v.as_tensor()) {
                Some(grad) => read_tensor(grad, g.as_mut_slice::<f32>()?)?,
                None => ops::fill(g, 0.0, &self.stream)?,
            }
        }
        Ok(())
    }

    /// One step at learning rate `lr` with the gradients taken last.
    ///
    /// # Errors
    /// A tensor's.
    pub fn step(&mut self, lr: f32) -> Result<()> {
        let s = &self.stream;
        if let Some(max) = self.clip {
            let mut grads: Vec<&mut Tensor> = self.grads.iter_mut().collect();
            ops::clip_global_norm(&mut grads, max as f32, s)?;
        }
        self.steps += 1;
        let p = &self.settings;
        let decay = (1.0 - f64::from(lr) * p.weight_decay) as f32;
        let (m, v) = self.state.split_at_mut(self.params.len());
        for (((param, g), m), v) in self.params.iter_mut().zip(&self.grads).zip(m).zip(v) {
            if decay != 1.0 {
                ops::scale(param, decay, s)?;
            }
            ops::adam_step(
                param,
                g,
                m,
                v,
                lr,
                p.beta1 as f32,
                p.beta2 as f32,
                p.eps as f32,
                0.0,
                self.steps,
                s,
            )?;
        }
        Ok(())
    }

    /// The parameters, in the variables' order.
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// The parameters, mutable (the runtime writes averages into them).
    pub fn params_mut(&mut self) -> &mut [Tensor] {
        &mut self.params
    }

    /// The gradients of the last [`AdamW::take_grads`], mutable.
    pub fn grads_mut(&mut self) -> &mut [Tensor] {
        &mut self.grads
    }

    /// The moments: every parameter's first moment, then every second moment.
    pub fn state(&self) -> &[Tensor] {
        &self.state
    }

    /// The moments, mutable (a resume writes them).
    pub fn state_mut(&mut self) -> &mut [Tensor] {
        &mut self.state
    }

    /// Steps taken since the moments were zeroed.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Restores the step count (a resume).
    pub fn set_steps(&mut self, steps: u64) {
        self.steps = steps;
    }

    /// Zeroes the moments and the step count.
    ///
    /// # Errors
    /// A tensor's.
    pub fn reset(&mut self) -> Result<()> {
        self.steps = 0;
        for t in &mut self.state {
            ops::fill(t, 0.0, &self.stream)?;
        }
        Ok(())
    }
}

//! `TchReplica`: a tch model and its optimizer as a flodl-ddp `Replica`.

use flodl_ddp::{Batch, BatchEval, Replica, Result};
use flodl_tensor::{DType, Stream, Tensor};
use tch::nn::{Optimizer, OptimizerConfig, VarStore};

use crate::error::Error;
use crate::model::Model;
use crate::vars::Vars;

/// A rank's tch model with its optimizer, as a flodl [`Replica`].
///
/// The model trains in its `VarStore`'s variables. [`parameters`](Replica::parameters) mirrors
/// them as flodl tensors in [`Vars`]' order (by name), refreshed only when the runtime reads
/// them ([`export_parameters`](Replica::export_parameters): at a reduce, a snapshot, a
/// checkpoint, the end) and written back when it has averaged them
/// ([`import_parameters`](Replica::import_parameters)); each crossing is one `memcpy` per
/// variable between the two storages, with no buffer in between. Host (CPU) ranks only for now:
/// a CUDA rank would need the device-to-device copy, which is not built.
///
/// Gradient clipping happens here, on libtorch's gradients, before each optimizer step
/// (`max_grad_norm`), so the replica needs no
/// [`gradients_mut`](Replica::gradients_mut) and the run no
/// [`Trainer::max_grad_norm`](flodl_ddp::Trainer::max_grad_norm). The optimizer's moments stay
/// in libtorch and are not part of flodl's checkpoints.
pub struct TchReplica<M> {
    // Owns the variables the optimizer and `vars` hold handles to.
    _vs: VarStore,
    model: M,
    optimizer: Optimizer,
    trainable: Vec<tch::Tensor>,
    vars: Vars,
    params: Vec<Tensor>,
    buffers: Vec<Tensor>,
    max_grad_norm: Option<f64>,
}

impl<M> std::fmt::Debug for TchReplica<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TchReplica")
            .field("vars", &self.vars)
            .field("max_grad_norm", &self.max_grad_norm)
            .finish_non_exhaustive()
    }
}

impl<M: Model> TchReplica<M> {
    /// The replica of `model`, whose variables are `vs`'s, trained by `optimizer` (its rate is
    /// set from the run's schedule at every step), with gradients clipped to `max_grad_norm`
    /// (global L2 norm) when given. `stream` is the rank's ([`flodl_ddp::ReplicaContext`]).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a variable that is not a contiguous `f32` host tensor;
    /// libtorch's.
    pub fn new(
        vs: VarStore,
        model: M,
        optimizer: impl OptimizerConfig,
        max_grad_norm: Option<f64>,
        stream: &Stream,
    ) -> Result<TchReplica<M>> {
        let vars = Vars::new(&vs)?;
        let optimizer = optimizer.build(&vs, 0.0).map_err(Error::from)?;
        let trainable = vs.trainable_variables();
        let mirror = |shapes: Vec<Vec<usize>>| -> Result<Vec<Tensor>> {
            shapes.iter().map(|s| Ok(Tensor::zeros(s, DType::F32, stream)?)).collect()
        };
        let params = mirror(vars.shapes())?;
        let buffers = mirror(vars.buffer_shapes())?;
        let mut replica = TchReplica {
            _vs: vs,
            model,
            optimizer,
            trainable,
            vars,
            params,
            buffers,
            max_grad_norm,
        };
        replica.export_parameters()?;
        Ok(replica)
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The variables, in the replica's order.
    pub fn vars(&self) -> &Vars {
        &self.vars
    }
}

/// Scales the gradients of `vars` so that their global L2 norm is at most `max`.
fn clip(vars: &[tch::Tensor], max: f64) -> std::result::Result<(), tch::TchError> {
    let _guard = tch::no_grad_guard();
    let mut sum = 0.0;
    let grads: Vec<tch::Tensor> = vars.iter().map(|v| v.grad()).filter(|g| g.defined()).collect();
    for g in &grads {
        sum += g.f_square()?.f_sum(tch::Kind::Double)?.f_double_value(&[])?;
    }
    let norm = sum.sqrt();
    if norm > max {
        let scale = max / (norm + 1e-6);
        for g in &grads {
            let _ = g.shallow_clone().f_mul_scalar_(scale)?;
        }
    }
    Ok(())
}

impl<M: Model> Replica for TchReplica<M> {
    fn train_step(&mut self, batch: &Batch) -> Result<f32> {
        self.optimizer.zero_grad();
        let loss = self.model.loss(batch)?;
        loss.f_backward().map_err(Error::from)?;
        Ok(loss.f_double_value(&[]).map_err(Error::from)? as f32)
    }

    fn step(&mut self, lr: f32) -> Result<()> {
        if let Some(max) = self.max_grad_norm {
            clip(&self.trainable, max).map_err(Error::from)?;
        }
        self.optimizer.set_lr(f64::from(lr));
        self.optimizer.step();
        Ok(())
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    fn parameters_mut(&mut self) -> &mut [Tensor] {
        &mut self.params
    }

    fn buffers(&self) -> &[Tensor] {
        &self.buffers
    }

    fn buffers_mut(&mut self) -> &mut [Tensor] {
        &mut self.buffers
    }

    fn export_parameters(&mut self) -> Result<()> {
        for (i, t) in self.params.iter_mut().enumerate() {
            self.vars.read(i, t.as_mut_slice::<f32>()?)?;
        }
        for (i, t) in self.buffers.iter_mut().enumerate() {
            self.vars.read_buffer(i, t.as_mut_slice::<f32>()?)?;
        }
        Ok(())
    }

    fn import_parameters(&mut self) -> Result<()> {
        for (i, t) in self.params.iter().enumerate() {
            self.vars.write(i, t.as_slice::<f32>()?)?;
        }
        for (i, t) in self.buffers.iter().enumerate() {
            self.vars.write_buffer(i, t.as_slice::<f32>()?)?;
        }
        Ok(())
    }

    fn evaluate_batch(&mut self, batch: &Batch) -> Result<Option<BatchEval>> {
        let _guard = tch::no_grad_guard();
        self.model.evaluate(batch)
    }
}

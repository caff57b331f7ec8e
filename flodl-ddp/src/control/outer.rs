//! Outer optimizers applied to the consensus between the reduce and the broadcast, and EASGD.
//!
//! With `prev` the global parameters after the previous round and `consensus` this round's
//! average, the outer gradient is `g = prev − consensus` (0 on the first round):
//! * [`OuterKind::Average`]: `new = consensus`.
//! * [`OuterKind::SlowMomentum`] (SlowMo): `v ← μv + g`, `new = prev − lr·v`.
//! * [`OuterKind::Nesterov`] (DiLoCo): `v ← μv + g`, `new = prev − lr·(μv + g)`; each rank must
//!   reset its inner optimizer state every round ([`OuterOptimizer::resets_inner_state`]).
//!
//! The step is deterministic, so on the collective backend every rank runs it on its own copy
//! and all stay in lock-step with no extra collective; on the host backend the coordinator runs
//! it once. Only parameters go through it (buffers pass through), and a round where no rank
//! stepped must not call it. Everything runs through `flodl_tensor::ops`, so on CPU or CUDA.

use flodl_tensor::{DType, Error as TensorError, Result as TensorResult, Stream, Tensor, ops};

use crate::control::logic_error::{LogicError, LogicResult};

/// Default SlowMo outer learning rate.
pub(crate) const SLOW_MOMENTUM_LR: f32 = 1.0;
/// Default DiLoCo outer learning rate.
pub(crate) const NESTEROV_LR: f32 = 0.7;
/// Default outer momentum.
pub(crate) const OUTER_MOMENTUM: f32 = 0.9;

/// Which outer optimizer runs on the consensus.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OuterKind {
    /// The consensus as is.
    Average,
    /// Slow momentum (SlowMo): `v ← μv + g`, `new = prev − lr·v`.
    SlowMomentum {
        /// Outer learning rate (about 1).
        lr: f32,
        /// Momentum μ in [0, 1).
        momentum: f32,
    },
    /// Nesterov momentum (DiLoCo): `v ← μv + g`, `new = prev − lr·(μv + g)`.
    Nesterov {
        /// Outer learning rate (about 0.7).
        lr: f32,
        /// Momentum μ in [0, 1).
        momentum: f32,
    },
}

impl OuterKind {
    /// SlowMo with the usual defaults (lr 1, μ 0.9).
    pub fn slow_momentum() -> OuterKind {
        OuterKind::SlowMomentum { lr: SLOW_MOMENTUM_LR, momentum: OUTER_MOMENTUM }
    }

    /// DiLoCo with the usual defaults (lr 0.7, μ 0.9).
    pub fn nesterov() -> OuterKind {
        OuterKind::Nesterov { lr: NESTEROV_LR, momentum: OUTER_MOMENTUM }
    }
}

/// Where an outer optimizer stands.
#[derive(Debug)]
enum OuterState {
    /// No round yet: the first consensus is taken as is.
    Fresh,
    /// After at least one round: the previous global parameters and the velocity.
    Running { prev: Vec<Tensor>, velocity: Vec<Tensor> },
}

/// An outer optimizer with its state (see the module documentation).
#[derive(Debug)]
pub struct OuterOptimizer {
    kind: OuterKind,
    state: OuterState,
}

impl OuterOptimizer {
    /// An outer optimizer of the given kind with no history.
    ///
    /// # Errors
    /// [`LogicError::InvalidValue`] for a non-finite or non-positive learning rate, or a
    /// momentum outside [0, 1).
    pub fn new(kind: OuterKind) -> LogicResult<OuterOptimizer> {
        if let OuterKind::SlowMomentum { lr, momentum } | OuterKind::Nesterov { lr, momentum } =
            kind
        {
            if !(lr.is_finite() && lr > 0.0) {
                return Err(LogicError::InvalidValue { what: "outer lr", value: f64::from(lr) });
            }
            if !(0.0..1.0).contains(&momentum) {
                return Err(LogicError::InvalidValue {
                    what: "outer momentum",
                    value: f64::from(momentum),
                });
            }
        }
        Ok(OuterOptimizer { kind, state: OuterState::Fresh })
    }

    /// The kind.
    pub fn kind(&self) -> OuterKind {
        self.kind
    }

    /// True when every rank must reset its inner optimizer state after each round (DiLoCo).
    pub fn resets_inner_state(&self) -> bool {
        matches!(self.kind, OuterKind::Nesterov { .. })
    }

    /// The outer velocity (for a checkpoint), once a round has run under a momentum kind.
    pub fn velocity(&self) -> Option<&[Tensor]> {
        match &self.state {
            OuterState::Running { velocity, .. } => Some(velocity),
            OuterState::Fresh => None,
        }
    }

    /// The global parameters of the last round (for a checkpoint), once a round has run.
    pub fn previous(&self) -> Option<&[Tensor]> {
        match &self.state {
            OuterState::Running { prev, .. } => Some(prev),
            OuterState::Fresh => None,
        }
    }

    /// Restores a checkpointed state: the last round's global parameters and the velocity.
    ///
    /// # Errors
    /// [`TensorError::LengthMismatch`] when the two lists differ in length.
    pub fn restore(&mut self, prev: Vec<Tensor>, velocity: Vec<Tensor>) -> TensorResult<()> {
        if prev.len() != velocity.len() {
            return Err(TensorError::LengthMismatch {
                op: "outer restore",
                expected: prev.len(),
                got: velocity.len(),
            });
        }
        self.state = OuterState::Running { prev, velocity };
        Ok(())
    }

    /// Replaces `consensus` (this round's average, in place) with the new global parameters.
    ///
    /// # Errors
    /// [`TensorError::LengthMismatch`] when the parameter list changed length since the last
    /// round; the kernels' shape, dtype and device errors.
    pub fn step(&mut self, consensus: &mut [Tensor], stream: &Stream) -> TensorResult<()> {
        let (lr, momentum, nesterov) = match self.kind {
            OuterKind::Average => return Ok(()),
            OuterKind::SlowMomentum { lr, momentum } => (lr, momentum, false),
            OuterKind::Nesterov { lr, momentum } => (lr, momentum, true),
        };
        let OuterState::Running { prev, velocity } = &mut self.state else {
            // First round: g = 0, so v = 0 and the consensus stands.
            let mut prev = Vec::with_capacity(consensus.len());
            let mut velocity = Vec::with_capacity(consensus.len());
            for c in consensus.iter() {
                prev.push(c.try_clone(stream)?);
                velocity.push(Tensor::zeros(c.shape(), DType::F32, stream)?);
            }
            self.state = OuterState::Running { prev, velocity };
            return Ok(());
        };
        if prev.len() != consensus.len() {
            return Err(TensorError::LengthMismatch {
                op: "outer step",
                expected: prev.len(),
                got: consensus.len(),
            });
        }
        for ((c, p), v) in consensus.iter_mut().zip(prev.iter_mut()).zip(velocity.iter_mut()) {
            // v ← μv + (prev − consensus)
            ops::scale(v, momentum, stream)?;
            ops::axpy(1.0, p, v, stream)?;
            ops::axpy(-1.0, c, v, stream)?;
            if nesterov {
                // prev − lr·(μv + prev − c) = (1 − lr)·prev + lr·c − lr·μ·v
                ops::lerp(c, p, 1.0 - lr, stream)?;
                ops::axpy(-lr * momentum, v, c, stream)?;
            } else {
                // prev − lr·v
                c.copy_from(p, stream)?;
                ops::axpy(-lr, v, c, stream)?;
            }
            p.copy_from(c, stream)?;
        }
        Ok(())
    }
}

/// Checks an EASGD blend factor: finite, in (0, 1].
///
/// # Errors
/// [`LogicError::InvalidValue`] otherwise.
pub fn check_easgd_alpha(alpha: f32) -> LogicResult<f32> {
    if alpha.is_finite() && alpha > 0.0 && alpha <= 1.0 {
        Ok(alpha)
    } else {
        Err(LogicError::InvalidValue { what: "EASGD alpha", value: f64::from(alpha) })
    }
}

/// EASGD blend on a rank: `local ← (1 − α)·local + α·average`, tensor by tensor (α = 1 is a
/// plain overwrite). Buffers are not blended: overwrite them.
///
/// # Errors
/// [`TensorError::LengthMismatch`] when the lists differ in length; the kernels' errors.
pub fn easgd_blend(
    local: &mut [Tensor],
    average: &[Tensor],
    alpha: f32,
    stream: &Stream,
) -> TensorResult<()> {
    if local.len() != average.len() {
        return Err(TensorError::LengthMismatch {
            op: "easgd_blend",
            expected: local.len(),
            got: average.len(),
        });
    }
    for (l, a) in local.iter_mut().zip(average) {
        if alpha == 1.0 {
            // Exactly the average (a lerp would round `l + (a − l)`).
            l.copy_from(a, stream)?;
        } else {
            ops::lerp(l, a, alpha, stream)?;
        }
    }
    Ok(())
}

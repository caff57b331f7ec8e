//! What a replica may offer beyond the required methods, and which trainer options need it:
//! checked once, when the replicas are built, so a run that cannot honour an option fails at
//! `run()` rather than at its first step.

use flodl_tensor::{DType, Device};
use serde::{Deserialize, Serialize};

use crate::contract::replica::Replica;
use crate::{Error, Result};

/// An optional part of the [`Replica`] contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Capability {
    /// Mutable gradients, one per parameter and of its shape, from the replica's construction
    /// on ([`Replica::gradients_mut`] returns them).
    MutableGradients,
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Capability::MutableGradients => {
                write!(f, "mutable gradients (Replica::gradients_mut returns None)")
            }
        }
    }
}

/// A [`Trainer`](crate::Trainer) option that needs a [`Capability`] of the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum TrainerOption {
    /// [`Trainer::max_grad_norm`](crate::Trainer::max_grad_norm): gradient clipping scales the
    /// gradients in place before each optimizer step.
    MaxGradNorm,
}

impl TrainerOption {
    /// The capability the option needs.
    pub fn needs(self) -> Capability {
        match self {
            TrainerOption::MaxGradNorm => Capability::MutableGradients,
        }
    }
}

impl std::fmt::Display for TrainerOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrainerOption::MaxGradNorm => write!(f, "Trainer::max_grad_norm"),
        }
    }
}

/// Checks that `replica` offers what `option` needs.
///
/// # Errors
/// [`Error::MissingCapability`] when it does not offer it at all; [`Error::ReplicaMismatch`]
/// when what it offers does not fit its parameters.
pub(crate) fn require(option: TrainerOption, replica: &mut dyn Replica) -> Result<()> {
    let missing = || Error::MissingCapability { option, capability: option.needs() };
    match option.needs() {
        Capability::MutableGradients => {
            let params: Vec<(Vec<usize>, Device)> =
                replica.parameters().iter().map(|p| (p.shape().to_vec(), p.device())).collect();
            let grads = replica.gradients_mut().ok_or_else(missing)?;
            let fits = grads.len() == params.len()
                && grads.iter().zip(&params).all(|(g, (shape, device))| {
                    g.shape() == shape.as_slice()
                        && g.device() == *device
                        && g.dtype() == DType::F32
                });
            if !fits {
                let shapes: Vec<&[usize]> = params.iter().map(|(s, _)| s.as_slice()).collect();
                let found: Vec<(&[usize], DType)> =
                    grads.iter().map(|g| (g.shape(), g.dtype())).collect();
                return Err(Error::ReplicaMismatch(format!(
                    "{option} needs one f32 gradient per parameter, of its shape and on its \
                     device: parameters {shapes:?}, gradients {found:?}"
                )));
            }
            Ok(())
        }
    }
}

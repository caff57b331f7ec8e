//! What a replica may offer beyond the required methods, and which trainer options need it:
//! two closed sets of plain data, named by [`Error::MissingCapability`](crate::Error) and sent
//! over the wire in a failure, so this file imports nothing of the crate (the check itself is
//! `requirement.rs`).

use serde::{Deserialize, Serialize};

/// An optional part of the [`Replica`](crate::Replica) contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Capability {
    /// Mutable gradients, one per parameter and of its shape, from the replica's construction
    /// on ([`Replica::gradients_mut`](crate::Replica::gradients_mut) returns them).
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

//! The check that a replica offers what a trainer option needs: once, when the replicas are
//! built, so a run that cannot honour an option fails at `run()` rather than at its first step.

use flodl_tensor::{DType, Device};

use crate::contract::capability::{Capability, TrainerOption};
use crate::contract::replica::Replica;
use crate::{Error, Result};

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
                return Err(Error::mismatch(
                    "gradients (one f32 per parameter, of its shape and on its device)",
                    format!("{shapes:?} for {option}"),
                    format!("{found:?}"),
                ));
            }
            Ok(())
        }
    }
}

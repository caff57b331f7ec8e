//! Work weighting of the average: how much each rank's replica counts in the consensus.
//!
//! A rank that trained `n` steps in the window has mass `n^γ` (γ = 1: proportional to work; γ = 0:
//! every rank that stepped counts equally). Parameters are averaged with weights `mass / Σmass`;
//! f32 buffers (batch-norm statistics) with equal weights among the ranks that stepped. A rank
//! with no steps takes no part; a round where nobody stepped has no average at all (every rank
//! keeps its local state).

use crate::control::logic_error::{LogicError, LogicResult};

/// Default work-weighting exponent.
pub(crate) const DEFAULT_GAMMA: f64 = 1.0;

/// Each rank's share of the consensus for one round.
#[derive(Debug, Clone, PartialEq)]
pub struct AverageWeights {
    /// Parameter weights `mass_r / Σmass` (0 for ranks with no steps); they sum to 1.
    pub params: Vec<f32>,
    /// Buffer weights `1 / K` for the `K` ranks that stepped, 0 for the others.
    pub buffers: Vec<f32>,
}

impl AverageWeights {
    /// The ranks that take part (stepped in the window).
    pub fn movers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.buffers.len()).filter(|&r| self.buffers[r] > 0.0)
    }
}

/// Masses `n^γ` per rank (0 for a rank with no steps).
///
/// # Errors
/// [`LogicError::InvalidValue`] for a negative or non-finite γ.
pub(crate) fn work_masses(steps: &[u64], gamma: f64) -> LogicResult<Vec<f64>> {
    if !(gamma.is_finite() && gamma >= 0.0) {
        return Err(LogicError::InvalidValue { what: "work-weighting gamma", value: gamma });
    }
    Ok(steps.iter().map(|&n| if n == 0 { 0.0 } else { (n as f64).powf(gamma) }).collect())
}

/// The round's weights, or `None` when no rank stepped (the round is passed through).
///
/// # Errors
/// As `work_masses`.
pub fn average_weights(steps: &[u64], gamma: f64) -> LogicResult<Option<AverageWeights>> {
    let masses = work_masses(steps, gamma)?;
    let total: f64 = masses.iter().sum();
    let movers = steps.iter().filter(|&&n| n > 0).count();
    if total <= 0.0 || movers == 0 {
        return Ok(None);
    }
    Ok(Some(AverageWeights {
        params: masses.iter().map(|m| (m / total) as f32).collect(),
        buffers: steps.iter().map(|&n| if n > 0 { 1.0 / movers as f32 } else { 0.0 }).collect(),
    }))
}

//! The consensus view both ends of one connection keep under a quantized wire format
//! (`--wire int8`, `--wire q4`), so that only blockwise-quantized deltas from it
//! travel.
//!
//! The controller's end of a rank's connection and the rank's end each hold a [`DeltaCoder`]
//! with the same *view*: the consensus as the rank has it. The states that travel are:
//! - [`Carries::Base`] (the controller's `Init`): the state travels whole, in f32, and both
//!   ends take it as their view; the rank's residual starts at zero.
//! - a consensus update (the controller's `Update`): the controller quantizes
//!   `consensus − view`, and both ends add what the codes say to their view (the same bytes
//!   through the same kernel: the two views stay bitwise equal). What the codes dropped stays in
//!   `consensus − view` and travels with the next update: the controller's error feedback is
//!   its view's lag behind the consensus, which stays f32 on the controller.
//! - a snapshot (the rank's `Snapshot`): the rank quantizes `params − view + residual` with
//!   error feedback ([`ops::quantize_with_feedback`]); the controller reads `view + codes`. The
//!   rank's new residual is kept aside and becomes its residual when the update of that round
//!   arrives, so a snapshot sent again for the same round (another attempt) carries the same
//!   residual and nothing is counted twice.
//!
//! Every delta names the number of updates its sender's view holds (`base`); the receiver
//! refuses one that does not match its own view, so a lost frame becomes a protocol error on
//! that connection, never a silently wrong consensus. One mismatch is expected: a snapshot
//! from an older view than the controller's arrived after its round ended without it (the
//! update that followed is on its way to the rank); it is dropped as stale, as a late snapshot
//! is in any format, and its residual stays the rank's (at most one quantum of that snapshot
//! is lost to the feedback).

use flodl_tensor::quant::QuantFormat;
use flodl_tensor::{DType, Stream, Tensor, ops};
use serde::{Deserialize, Serialize};

/// What a message's model state is to the view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Carries {
    /// No state, or one that always travels whole in f32 and leaves the view alone (an initial
    /// state a rank sends, a final state).
    Whole,
    /// A state both ends take as the view (`Init`).
    Base,
    /// A state that travels as a delta from the view.
    Delta,
}

/// Which way a connection's deltas go, which decides what the view does with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Controller → rank: the consensus; the view advances by every delta.
    Consensus,
    /// Rank → controller: the rank's parameters; the view stays, the sender keeps a residual.
    Replica,
}

/// A quantized delta as it travels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Delta {
    /// Updates the sender's view held when it was encoded.
    pub(crate) base: u64,
    /// The codes and scales ([`QuantFormat`]'s layout) of every value, vectors end to end.
    pub(crate) bytes: Vec<u8>,
}

/// Why a delta could not be made or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DeltaError {
    /// A delta arrived, or had to be made, before any base state.
    #[error("a delta without a base state")]
    NoView,
    /// The state does not have the view's length.
    #[error("a state of {got} values against a view of {view}")]
    Length {
        /// Values of the state.
        got: usize,
        /// Values of the view.
        view: usize,
    },
    /// The delta was made from another view than the receiver's.
    #[error("a delta from view {base}, the receiver's is {view}")]
    Base {
        /// The sender's view.
        base: u64,
        /// The receiver's.
        view: u64,
    },
    /// A delta in a format that is not quantized.
    #[error("a delta in the {0} format")]
    Format(&'static str),
    /// A kernel refused (a NaN or an infinity to quantize or read back, a wrong length).
    #[error("{0}")]
    Kernel(#[from] flodl_tensor::Error),
}

/// One end's view of a connection under a quantized format: see the module docs.
#[derive(Debug)]
pub(crate) struct DeltaCoder {
    format: QuantFormat,
    direction: Direction,
    /// The consensus as the rank has it, and how many updates it holds.
    view: Option<(Vec<f32>, u64)>,
    /// The rank's error feedback: what its past snapshots did not carry.
    residual: Option<Tensor>,
    /// The residual after the snapshot last sent, kept until that round's update arrives.
    pending: Option<Tensor>,
    stream: Stream,
}

impl DeltaCoder {
    /// The coder of one end: `direction` is the way this end's connection's deltas go when it
    /// sends (the controller: consensus; a rank: replica).
    pub(crate) fn new(format: QuantFormat, direction: Direction) -> DeltaCoder {
        DeltaCoder {
            format,
            direction,
            view: None,
            residual: None,
            pending: None,
            stream: Stream::cpu_with_threads(1),
        }
    }

    /// Whether this is the controller's end (it sends the consensus).
    pub(crate) fn is_controller(&self) -> bool {
        self.direction == Direction::Consensus
    }

    /// Takes `values` (a state whole, vectors end to end) as the view: a fresh start.
    pub(crate) fn set_base(&mut self, values: &[f32]) {
        self.view = Some((values.to_vec(), 0));
        self.residual = None;
        self.pending = None;
    }

    /// Encodes `values` as a delta from the view, as this end sends it.
    ///
    /// # Errors
    /// [`DeltaError::NoView`], [`DeltaError::Length`], or the kernel's refusal of a value that
    /// is not finite (the view and the residual are then unchanged).
    pub(crate) fn encode(&mut self, values: &[f32]) -> Result<Delta, DeltaError> {
        let (view, base) = self.view.as_ref().ok_or(DeltaError::NoView)?;
        if values.len() != view.len() {
            return Err(DeltaError::Length { got: values.len(), view: view.len() });
        }
        let n = values.len();
        let delta: Vec<f32> = values.iter().zip(view).map(|(v, w)| v - w).collect();
        let delta = Tensor::from_slice(&delta, &[n], &self.stream)?;
        let mut bytes = vec![0u8; self.format.encoded_len(n)];
        let base = *base;
        match self.direction {
            Direction::Consensus => {
                ops::quantize(self.format, &delta, &mut bytes, &self.stream)?;
                self.advance(&bytes)?;
            }
            Direction::Replica => {
                let mut residual = match &self.residual {
                    Some(r) => Tensor::from_slice(r.as_slice::<f32>()?, &[n], &self.stream)?,
                    None => Tensor::zeros(&[n], DType::F32, &self.stream)?,
                };
                ops::quantize_with_feedback(
                    self.format,
                    &delta,
                    &mut residual,
                    &mut bytes,
                    &self.stream,
                )?;
                self.pending = Some(residual);
            }
        }
        Ok(Delta { base, bytes })
    }

    /// Reads a delta this end receives: the values it stands for (the view plus the codes).
    ///
    /// # Errors
    /// [`DeltaError::NoView`], [`DeltaError::Base`] when it was made from another view, or the
    /// kernel's refusal of a wrong length or a scale that is not finite.
    pub(crate) fn decode(&mut self, delta: &Delta) -> Result<Vec<f32>, DeltaError> {
        let (view, seq) = self.view.as_ref().ok_or(DeltaError::NoView)?;
        if delta.base != *seq {
            return Err(DeltaError::Base { base: delta.base, view: *seq });
        }
        let values = self.read(view, &delta.bytes)?;
        match self.direction {
            // A rank's end receives the consensus: the view advances, and the residual of
            // the snapshot this update answers becomes the rank's.
            Direction::Replica => {
                self.view = Some((values.clone(), seq + 1));
                if let Some(pending) = self.pending.take() {
                    self.residual = Some(pending);
                }
            }
            Direction::Consensus => {}
        }
        Ok(values)
    }

    /// The view plus what `bytes` encodes.
    fn read(&self, view: &[f32], bytes: &[u8]) -> Result<Vec<f32>, DeltaError> {
        let mut codes = Tensor::zeros(&[view.len()], DType::F32, &self.stream)?;
        ops::dequantize(self.format, bytes, &mut codes, &self.stream)?;
        Ok(view.iter().zip(codes.as_slice::<f32>()?).map(|(w, d)| w + d).collect())
    }

    /// The controller's view advances by the codes it sent.
    fn advance(&mut self, bytes: &[u8]) -> Result<(), DeltaError> {
        let (view, seq) = self.view.as_ref().ok_or(DeltaError::NoView)?;
        let values = self.read(view, bytes)?;
        let seq = seq + 1;
        self.view = Some((values, seq));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic stream of values in `[-scale, scale)`.
    fn noise(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    /// Over many rounds in both formats and at lengths on and off the block edges: the two
    /// ends' views stay bitwise equal; the rank's view tracks the true consensus within one
    /// quantum of the last update (the controller's error feedback); the controller's sum of
    /// what the snapshots carried tracks the rank's sum of true deltas within one quantum
    /// (the rank's error feedback), in f64.
    #[test]
    fn both_ends_keep_one_view_and_feedback_bounds_the_drift() -> Result<(), String> {
        for q in QuantFormat::ALL {
            let format = q.name();
            for n in [1, q.block() - 1, q.block(), 3 * q.block() + 5] {
                let mut controller = DeltaCoder::new(q, Direction::Consensus);
                let mut rank = DeltaCoder::new(q, Direction::Replica);
                let init = noise(n, 1, 1.0);
                controller.set_base(&init);
                rank.set_base(&init);
                let mut consensus = init.clone();
                let (mut sent, mut carried) = (vec![0f64; n], vec![0f64; n]);
                for round in 0..200u64 {
                    // The rank trains from its view; its snapshot travels as a delta.
                    let view = rank.view.as_ref().ok_or("no view")?.0.clone();
                    let step = noise(n, round + 7, 0.05);
                    let params: Vec<f32> = view.iter().zip(&step).map(|(v, s)| v + s).collect();
                    let snap = rank.encode(&params).map_err(|e| e.to_string())?;
                    let got = controller.decode(&snap).map_err(|e| e.to_string())?;
                    for i in 0..n {
                        sent[i] += f64::from(params[i]) - f64::from(view[i]);
                        carried[i] += f64::from(got[i]) - f64::from(view[i]);
                    }
                    let quantum = 0.06 * 2.0 / f64::from(q.levels());
                    let drift =
                        sent.iter().zip(&carried).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                    if drift > quantum {
                        return Err(format!("{format} n {n} round {round}: drift {drift}"));
                    }
                    // The controller's consensus moves; the update travels as a delta.
                    consensus = consensus.iter().zip(&got).map(|(c, g)| 0.5 * (c + g)).collect();
                    let update = controller.encode(&consensus).map_err(|e| e.to_string())?;
                    let new_view = rank.decode(&update).map_err(|e| e.to_string())?;
                    let ctl_view = &controller.view.as_ref().ok_or("no view")?.0;
                    if ctl_view != &new_view {
                        return Err(format!("{format} n {n} round {round}: views differ"));
                    }
                    let lag = consensus
                        .iter()
                        .zip(&new_view)
                        .map(|(c, v)| (c - v).abs())
                        .fold(0.0, f32::max);
                    if lag > 0.1 {
                        return Err(format!("{format} n {n} round {round}: view lags by {lag}"));
                    }
                }
            }
        }
        Ok(())
    }

    /// A delta made from another view, a state of another length, a NaN and a delta before
    /// any base are errors, and leave the coder as it was.
    #[test]
    fn mismatches_and_non_finite_values_are_refused() -> Result<(), String> {
        let q = QuantFormat::Q4;
        let mut controller = DeltaCoder::new(q, Direction::Consensus);
        let mut rank = DeltaCoder::new(q, Direction::Replica);
        if !matches!(rank.encode(&[1.0]), Err(DeltaError::NoView)) {
            return Err("a delta without a base".into());
        }
        controller.set_base(&[0.0; 10]);
        rank.set_base(&[0.0; 10]);
        if !matches!(rank.encode(&[0.0; 9]), Err(DeltaError::Length { got: 9, view: 10 })) {
            return Err("a state of another length".into());
        }
        let mut nan = [0.5f32; 10];
        nan[3] = f32::NAN;
        match rank.encode(&nan) {
            Err(DeltaError::Kernel(flodl_tensor::Error::NonFinite { index: 3, .. })) => {}
            other => return Err(format!("a NaN gave {other:?}")),
        }
        let update = controller.encode(&[0.25; 10]).map_err(|e| e.to_string())?;
        let stale = controller.encode(&[0.5; 10]).map_err(|e| e.to_string())?;
        if !matches!(rank.decode(&stale), Err(DeltaError::Base { base: 1, view: 0 })) {
            return Err("a delta from a later view was read".into());
        }
        rank.decode(&update).map_err(|e| e.to_string())?;
        rank.decode(&stale).map_err(|e| e.to_string())?;
        let mut forged = rank.encode(&[0.5; 10]).map_err(|e| e.to_string())?;
        forged.bytes[0..4].copy_from_slice(&f32::INFINITY.to_le_bytes());
        match controller.decode(&forged) {
            Err(DeltaError::Kernel(flodl_tensor::Error::NonFinite { .. })) => Ok(()),
            other => Err(format!("an infinite scale gave {other:?}")),
        }
    }
}

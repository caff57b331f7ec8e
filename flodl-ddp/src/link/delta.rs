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
//!
//! The coder works on a state as its vectors (the message's tensors, end to end) and in one
//! pass each way: encoding reads the vectors, the view and the residual into a scratch delta
//! that the quantization kernel reads; decoding dequantizes into the scratch and writes
//! `view + codes` straight into the message's vectors. Its buffers (the scratch, the residual
//! and the pending one) are kept between frames, and every pass runs on all the machine's
//! threads (the kernels on one shared CPU stream, the element-wise passes on rayon's pool).

use std::sync::OnceLock;

use flodl_tensor::quant::QuantFormat;
use flodl_tensor::{DType, Stream, Tensor, ops};
use rayon::prelude::*;
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
    #[serde(with = "super::raw_run::bytes")]
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
    /// A state could not be cut into the connection's fragments.
    #[error("{0}")]
    Cut(#[from] crate::control::logic_error::LogicError),
    /// A delta of a fragment the connection's cut does not have (`None`: the whole model).
    #[error("a delta of fragment {fragment:?} on a connection of {fragments} fragments")]
    Fragment {
        /// The fragment named.
        fragment: Option<usize>,
        /// The connection's fragments.
        fragments: usize,
    },
    /// A kernel refused (a NaN or an infinity to quantize or read back, a wrong length).
    #[error("{0}")]
    Kernel(#[from] flodl_tensor::Error),
}

/// The CPU stream every coder's kernels run on: all the machine's threads, one pool shared by
/// every connection.
fn stream() -> &'static Stream {
    static STREAM: OnceLock<Stream> = OnceLock::new();
    STREAM.get_or_init(Stream::cpu)
}

/// Values per task of an element-wise pass (a quarter of a MiB of f32).
const PASS: usize = 1 << 16;

/// One end's view, with the buffers its frames reuse.
#[derive(Debug)]
struct View {
    /// The consensus as the rank has it.
    values: Vec<f32>,
    /// Updates it holds.
    seq: u64,
    /// Scratch of the view's length, made at the first delta: the delta to quantize, or the
    /// codes read back.
    scratch: Option<Tensor>,
    /// The rank's error feedback: what its past snapshots did not carry (`None`: zero).
    residual: Option<Tensor>,
    /// The residual after the snapshot last sent, kept until that round's update arrives.
    pending: Option<Tensor>,
    /// Whether `pending` belongs to a snapshot sent since the last update.
    sent: bool,
}

/// One end's view of a connection under a quantized format: see the module docs.
#[derive(Debug)]
pub(crate) struct DeltaCoder {
    format: QuantFormat,
    direction: Direction,
    view: Option<View>,
}

/// The total length of `parts`.
fn total<T: AsRef<[f32]>>(parts: &[T]) -> usize {
    parts.iter().map(|p| p.as_ref().len()).sum()
}

impl DeltaCoder {
    /// The coder of one end: `direction` is the way this end's connection's deltas go when it
    /// sends (the controller: consensus; a rank: replica).
    pub(crate) fn new(format: QuantFormat, direction: Direction) -> DeltaCoder {
        DeltaCoder { format, direction, view: None }
    }

    /// Whether this is the controller's end (it sends the consensus).
    pub(crate) fn is_controller(&self) -> bool {
        self.direction == Direction::Consensus
    }

    /// Takes `values` (a state whole, vectors end to end) as the view: a fresh start.
    #[allow(
        dead_code,
        reason = "the one-vector form of the coder's interface; frames use the parts"
    )]
    pub(crate) fn set_base(&mut self, values: &[f32]) {
        self.set_base_parts(&[values]);
    }

    /// The view's values (the consensus as the rank has it), once a base was set.
    pub(crate) fn view(&self) -> Option<&[f32]> {
        self.view.as_ref().map(|v| v.values.as_slice())
    }

    /// Takes the state of vectors `parts` (end to end) as the view: a fresh start.
    pub(crate) fn set_base_parts(&mut self, parts: &[&[f32]]) {
        let mut values = Vec::with_capacity(total(parts));
        for p in parts {
            values.extend_from_slice(p);
        }
        self.view = Some(View {
            values,
            seq: 0,
            scratch: None,
            residual: None,
            pending: None,
            sent: false,
        });
    }

    /// Encodes `values` as a delta from the view, as this end sends it.
    ///
    /// # Errors
    /// [`DeltaError::NoView`], [`DeltaError::Length`], or the kernel's refusal of a value that
    /// is not finite (the view and the residual are then unchanged).
    #[allow(
        dead_code,
        reason = "the one-vector form of the coder's interface; frames use the parts"
    )]
    pub(crate) fn encode(&mut self, values: &[f32]) -> Result<Delta, DeltaError> {
        self.encode_parts(&[values])
    }

    /// Encodes the state of vectors `parts` (end to end) as a delta from the view, as this end
    /// sends it: see [`DeltaCoder::encode`].
    ///
    /// # Errors
    /// As [`DeltaCoder::encode`].
    pub(crate) fn encode_parts(&mut self, parts: &[&[f32]]) -> Result<Delta, DeltaError> {
        let format = self.format;
        let direction = self.direction;
        let view = self.view.as_mut().ok_or(DeltaError::NoView)?;
        let n = view.values.len();
        let got = total(parts);
        if got != n {
            return Err(DeltaError::Length { got, view: n });
        }
        let s = stream();
        let scratch = View::scratch(&mut view.scratch, n)?;
        let mut bytes = vec![0u8; format.encoded_len(n)];
        match direction {
            Direction::Consensus => {
                // scratch = parts − view
                zip_parts(parts, &view.values, scratch.as_mut_slice::<f32>()?, |p, w, d| {
                    *d = p - w
                });
                ops::quantize(format, scratch, &mut bytes, s)?;
                // The view advances by the codes sent.
                ops::dequantize(format, &bytes, scratch, s)?;
                let codes = scratch.as_slice::<f32>()?;
                view.values
                    .par_chunks_mut(PASS)
                    .zip(codes.par_chunks(PASS))
                    .for_each(|(w, d)| w.iter_mut().zip(d).for_each(|(w, d)| *w += d));
                let base = view.seq;
                view.seq += 1;
                Ok(Delta { base, bytes })
            }
            Direction::Replica => {
                // scratch = parts − view, and the pending residual starts as the residual.
                let mut pending = match view.pending.take() {
                    Some(p) if p.numel() == n => p,
                    _ => Tensor::zeros(&[n], DType::F32, s)?,
                };
                {
                    zip_parts(parts, &view.values, scratch.as_mut_slice::<f32>()?, |p, w, d| {
                        *d = p - w
                    });
                    let into = pending.as_mut_slice::<f32>()?;
                    match &view.residual {
                        Some(r) => {
                            let r = r.as_slice::<f32>()?;
                            into.par_chunks_mut(PASS)
                                .zip(r.par_chunks(PASS))
                                .for_each(|(p, r)| p.copy_from_slice(r));
                        }
                        None => into.par_chunks_mut(PASS).for_each(|p| p.fill(0.0)),
                    }
                }
                let result =
                    ops::quantize_with_feedback(format, scratch, &mut pending, &mut bytes, s);
                // Kept whatever the outcome: its contents only count once `sent`.
                view.pending = Some(pending);
                view.sent = false;
                result?;
                view.sent = true;
                Ok(Delta { base: view.seq, bytes })
            }
        }
    }

    /// The values a delta must be read into: the view's length, once `delta` is known to be
    /// from this end's view.
    ///
    /// # Errors
    /// [`DeltaError::NoView`], or [`DeltaError::Base`] when it was made from another view.
    pub(crate) fn expects(&self, delta: &Delta) -> Result<usize, DeltaError> {
        let view = self.view.as_ref().ok_or(DeltaError::NoView)?;
        if delta.base != view.seq {
            return Err(DeltaError::Base { base: delta.base, view: view.seq });
        }
        Ok(view.values.len())
    }

    /// Reads a delta this end receives: the values it stands for (the view plus the codes).
    ///
    /// # Errors
    /// [`DeltaError::NoView`], [`DeltaError::Base`] when it was made from another view, or the
    /// kernel's refusal of a wrong length or a scale that is not finite.
    #[allow(
        dead_code,
        reason = "the one-vector form of the coder's interface; frames use the parts"
    )]
    pub(crate) fn decode(&mut self, delta: &Delta) -> Result<Vec<f32>, DeltaError> {
        let n = self.view.as_ref().ok_or(DeltaError::NoView)?.values.len();
        let mut values = vec![0.0; n];
        self.decode_parts(delta, &mut [values.as_mut_slice()])?;
        Ok(values)
    }

    /// Reads a delta this end receives into the vectors `parts` (end to end; their lengths
    /// must add up to the view's): see [`DeltaCoder::decode`].
    ///
    /// # Errors
    /// As [`DeltaCoder::decode`], and [`DeltaError::Length`] when the parts are not the view's
    /// length (checked after the base: a stale delta is named as such).
    pub(crate) fn decode_parts(
        &mut self,
        delta: &Delta,
        parts: &mut [&mut [f32]],
    ) -> Result<(), DeltaError> {
        let format = self.format;
        let view = self.view.as_mut().ok_or(DeltaError::NoView)?;
        if delta.base != view.seq {
            return Err(DeltaError::Base { base: delta.base, view: view.seq });
        }
        let n = view.values.len();
        let got = total(parts);
        if got != n {
            return Err(DeltaError::Length { got, view: n });
        }
        let scratch = View::scratch(&mut view.scratch, n)?;
        ops::dequantize(format, &delta.bytes, scratch, stream())?;
        let codes = scratch.as_slice::<f32>()?;
        match self.direction {
            // A rank's end receives the consensus: the view advances, and the residual of
            // the snapshot this update answers becomes the rank's.
            Direction::Replica => {
                view.values
                    .par_chunks_mut(PASS)
                    .zip(codes.par_chunks(PASS))
                    .for_each(|(w, d)| w.iter_mut().zip(d).for_each(|(w, d)| *w += d));
                zip_parts_out(parts, &view.values, |w, out| *out = w);
                view.seq += 1;
                if view.sent {
                    // The old residual's buffer is the next snapshot's pending one.
                    std::mem::swap(&mut view.residual, &mut view.pending);
                    view.sent = false;
                }
            }
            Direction::Consensus => {
                let values = &view.values;
                let mut at = 0;
                for part in parts.iter_mut() {
                    let len = part.len();
                    part.par_chunks_mut(PASS)
                        .zip(values[at..at + len].par_chunks(PASS))
                        .zip(codes[at..at + len].par_chunks(PASS))
                        .for_each(|((o, w), d)| {
                            o.iter_mut().zip(w).zip(d).for_each(|((o, w), d)| *o = w + d)
                        });
                    at += len;
                }
            }
        }
        Ok(())
    }
}

impl View {
    /// The scratch, of the view's length (made at the first call).
    fn scratch(scratch: &mut Option<Tensor>, n: usize) -> Result<&mut Tensor, DeltaError> {
        match scratch {
            Some(t) if t.numel() == n => {}
            _ => *scratch = Some(Tensor::zeros(&[n], DType::F32, stream())?),
        }
        scratch.as_mut().ok_or(DeltaError::NoView)
    }
}

/// `f(part value, view value, &mut out value)` over the parts (end to end) against `view`
/// and `out`, in parallel.
fn zip_parts(
    parts: &[&[f32]],
    view: &[f32],
    out: &mut [f32],
    f: impl Fn(f32, f32, &mut f32) + Sync,
) {
    let mut at = 0;
    for part in parts {
        let len = part.len();
        part.par_chunks(PASS)
            .zip(view[at..at + len].par_chunks(PASS))
            .zip(out[at..at + len].par_chunks_mut(PASS))
            .for_each(|((p, w), o)| {
                p.iter().zip(w).zip(o.iter_mut()).for_each(|((p, w), o)| f(*p, *w, o))
            });
        at += len;
    }
}

/// `f(view value, &mut part value)` over the parts (end to end) against `view`, in parallel.
fn zip_parts_out(parts: &mut [&mut [f32]], view: &[f32], f: impl Fn(f32, &mut f32) + Sync) {
    let mut at = 0;
    for part in parts.iter_mut() {
        let len = part.len();
        part.par_chunks_mut(PASS)
            .zip(view[at..at + len].par_chunks(PASS))
            .for_each(|(o, w)| o.iter_mut().zip(w).for_each(|(o, w)| f(*w, o)));
        at += len;
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
                    let view = rank.view.as_ref().ok_or("no view")?.values.clone();
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
                    let ctl_view = &controller.view.as_ref().ok_or("no view")?.values;
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

    /// Cut into parts anywhere (on every block edge, one value either side of it, and at
    /// random): a state encodes to the same bytes as whole and reads back into its parts as
    /// whole; each value read back is within half its block's step of the f64 truth
    /// (`view + (params − view)`, the step `max |delta| / levels` computed in f64); and the
    /// rank's residual is what the codes left out, in f64.
    #[test]
    fn parts_match_the_whole_and_the_f64_reference() -> Result<(), String> {
        for q in QuantFormat::ALL {
            let b = q.block();
            let n = 5 * b + 3;
            let init = noise(n, 11, 1.0);
            let params: Vec<f32> =
                init.iter().zip(noise(n, 12, 0.05)).map(|(v, d)| v + d).collect();
            let mut cuts: Vec<usize> =
                (1..=5).flat_map(|k| [k * b - 1, k * b, k * b + 1]).collect();
            cuts.extend(noise(7, 13, 1.0).iter().map(|x| ((x.abs() * n as f32) as usize).min(n)));
            cuts.sort_unstable();
            cuts.dedup();
            let mut bounds = vec![0];
            bounds.extend(cuts.iter().copied().filter(|&c| c > 0 && c < n));
            bounds.push(n);
            let parts: Vec<&[f32]> = bounds.windows(2).map(|w| &params[w[0]..w[1]]).collect();
            let coders = || {
                let (mut c, mut r) = (
                    DeltaCoder::new(q, Direction::Consensus),
                    DeltaCoder::new(q, Direction::Replica),
                );
                c.set_base_parts(&[&init[..7], &init[7..]]);
                r.set_base(&init);
                (c, r)
            };
            let (mut whole_ctl, mut whole_rank) = coders();
            let (mut ctl, mut rank) = coders();
            let whole = whole_rank.encode(&params).map_err(|e| e.to_string())?;
            let cut = rank.encode_parts(&parts).map_err(|e| e.to_string())?;
            if whole != cut {
                return Err(format!("{q}: the parts encode to other bytes than the whole"));
            }
            let back = whole_ctl.decode(&whole).map_err(|e| e.to_string())?;
            let mut out: Vec<Vec<f32>> =
                bounds.windows(2).map(|w| vec![0.0; w[1] - w[0]]).collect();
            let mut slots: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
            ctl.decode_parts(&cut, &mut slots).map_err(|e| e.to_string())?;
            if out.concat() != back {
                return Err(format!("{q}: the parts read back other values than the whole"));
            }
            let residual =
                rank.view.as_ref().and_then(|v| v.pending.as_ref()).ok_or("no pending")?;
            let residual = residual.as_slice::<f32>().map_err(|e| e.to_string())?;
            for (k, block) in (0..n).collect::<Vec<_>>().chunks(b).enumerate() {
                let delta = |i: usize| f64::from(params[i]) - f64::from(init[i]);
                let step = block.iter().map(|&i| delta(i).abs()).fold(0.0, f64::max)
                    / f64::from(q.levels());
                for &i in block {
                    let truth = f64::from(init[i]) + delta(i);
                    let err = (f64::from(back[i]) - truth).abs();
                    if err > 0.5 * step * (1.0 + 1e-4) + 1e-6 {
                        return Err(format!("{q} block {k} value {i}: {err} off, step {step}"));
                    }
                    let left = delta(i) - (f64::from(back[i]) - f64::from(init[i]));
                    if (f64::from(residual[i]) - left).abs() > 1e-6 {
                        return Err(format!("{q} value {i}: residual {} for {left}", residual[i]));
                    }
                }
            }
        }
        Ok(())
    }
}

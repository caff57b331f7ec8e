//! How a [`wire`](super::wire) message becomes one frame of a network connection and back:
//! bincode 2, the lane it travels on, and the optional packing of model states.
//!
//! A frame is the bincode 2 encoding of a [`Packed`] message: the message itself and the values
//! of the model states it carries taken out of it, in f32 as one byte string per state vector
//! ([`super::raw_run`]: one copy each way, not bincode's value-by-value walk), under
//! [`WireFormat::Bf16`] packed as bf16 (half the bytes; the lengths of the emptied vectors
//! travel with them). Under the quantized formats ([`WireFormat::Int8`], [`WireFormat::Q4`])
//! the consensus updates and the snapshots travel as blockwise-quantized deltas from the views
//! both ends of the connection keep ([`super::views`]; the whole state of a model cut into
//! fragments as one delta per fragment); every other state travels whole in f32. In every
//! format, a starting state the receiver holds already travels as its digest
//! ([`super::held`]). Checkpoint parts (optimizer state, positions) always travel in f32, so a
//! bundle is exact.

use std::fmt;
use std::str::FromStr;

use half::bf16;
use serde::{Deserialize, Serialize};

use super::delta::{Carries, Delta, DeltaError};
use super::held::Held;
use super::raw_run::{self, F32Run};
use super::views::Views;
use super::wire::{ToCoordinator, ToWorker};
use crate::control::logic_error::{LogicError, LogicResult};
use crate::state::HostState;

/// How model states travel between processes. The consensus on the controller is f32 in every
/// format; in-process ranks always exchange f32.
///
/// The quantized formats apply to the host backend only (the collective backend sums in place
/// and refuses them with a typed configuration error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireFormat {
    /// Full precision.
    #[default]
    F32,
    /// Snapshots, updates and initial states as bfloat16: half the bytes.
    Bf16,
    /// Host backend: snapshots and consensus updates as deltas from the last consensus, 8-bit
    /// codes with a scale per 64 values (0.27× f32), with error feedback on both sides.
    Int8,
    /// Host backend: as [`WireFormat::Int8`] in 4-bit codes with a scale per 128 values
    /// (0.14× f32).
    Q4,
}

impl WireFormat {
    /// Every format, in declaration order.
    pub const ALL: [WireFormat; 4] =
        [WireFormat::F32, WireFormat::Bf16, WireFormat::Int8, WireFormat::Q4];

    /// The lower-case name (`"f32"`, `"bf16"`, `"int8"`, `"q4"`).
    pub fn name(self) -> &'static str {
        match self {
            WireFormat::F32 => "f32",
            WireFormat::Bf16 => "bf16",
            WireFormat::Int8 => "int8",
            WireFormat::Q4 => "q4",
        }
    }

    /// The blockwise quantization of a quantized format (deltas from a view), none otherwise.
    pub fn quantized(self) -> Option<flodl_tensor::quant::QuantFormat> {
        match self {
            WireFormat::F32 | WireFormat::Bf16 => None,
            WireFormat::Int8 => Some(flodl_tensor::quant::QuantFormat::Int8),
            WireFormat::Q4 => Some(flodl_tensor::quant::QuantFormat::Q4),
        }
    }
}

impl fmt::Display for WireFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WireFormat {
    type Err = LogicError;

    fn from_str(s: &str) -> LogicResult<WireFormat> {
        let lower = s.trim().to_ascii_lowercase();
        WireFormat::ALL.into_iter().find(|w| w.name() == lower).ok_or_else(|| LogicError::Parse {
            what: "wire format",
            input: s.to_string(),
            expected: "f32, bf16, int8, q4",
        })
    }
}

/// Which lane of a connection a frame takes: model states on the bulk lane, so a large frame
/// never holds up a heartbeat or an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Small messages: orders, reports, heartbeats.
    Control,
    /// Messages carrying a model state.
    Bulk,
}

/// Why a frame could not be made or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    /// The message did not encode.
    #[error("cannot encode a {what} frame: {source}")]
    Encode {
        /// The message's direction.
        what: &'static str,
        /// bincode's error.
        source: bincode::error::EncodeError,
    },
    /// The bytes are not a message.
    #[error("a {what} frame does not decode: {source}")]
    Decode {
        /// The message's direction.
        what: &'static str,
        /// bincode's error.
        source: bincode::error::DecodeError,
    },
    /// The frame decoded, with bytes left over.
    #[error("a {what} frame has {extra} bytes past its message")]
    Trailing {
        /// The message's direction.
        what: &'static str,
        /// Bytes left over.
        extra: usize,
    },
    /// The packed bf16 values do not fill the message's states.
    #[error("a {what} frame's packed values do not fit its states: {detail}")]
    Packing {
        /// The message's direction.
        what: &'static str,
        /// What did not fit.
        detail: String,
    },
    /// A quantized delta could not be made or read (no view, another view, a value that is
    /// not finite).
    #[error("a {what} frame's delta: {source}")]
    Delta {
        /// The message's direction.
        what: &'static str,
        /// What went wrong.
        source: DeltaError,
    },
    /// A frame names a starting state by a digest this end does not hold.
    #[error("a {what} frame names a starting state this end does not hold")]
    Named {
        /// The message's direction.
        what: &'static str,
    },
    /// A snapshot made from an older view than the controller's: it arrived after the round it
    /// was meant for had ended (the update that followed is on its way to the rank). It is
    /// stale, as it would be in any format; the connection stays.
    #[error("a {what} frame's delta is from view {base}, the controller is at {view}")]
    Stale {
        /// The message's direction.
        what: &'static str,
        /// The sender's view.
        base: u64,
        /// The receiver's.
        view: u64,
    },
}

impl FrameError {
    /// Whether the frame is only late (the connection is sound).
    pub(crate) fn is_stale(&self) -> bool {
        matches!(self, FrameError::Stale { .. })
    }
}

/// A message as it travels: the message and its states' values taken out of it: in f32 one
/// byte string per state vector, under bf16 packed, under a quantized format its state's
/// deltas, or the digest of a starting state the receiver holds.
#[derive(Serialize, Deserialize)]
struct Packed<M> {
    msg: M,
    /// Every state vector travelling in f32, in order.
    f32: Vec<F32Run>,
    /// The length of every state vector emptied otherwise, in order.
    lens: Vec<u64>,
    /// Their values, bf16 little-endian, in order.
    #[serde(with = "raw_run::bytes")]
    bf16: Vec<u8>,
    /// Their values as quantized deltas from the connection's views: one (a fragment, or a
    /// model not cut), or one per fragment in order (the whole state of a cut model).
    deltas: Vec<Delta>,
    /// The digest of the starting state the receiver holds already ([`super::held`]): its
    /// values are not here.
    named: Option<[u8; 32]>,
}

/// A message that may carry model states: the lane it takes and its states, for packing.
pub(crate) trait Framed: Serialize + serde::de::DeserializeOwned {
    /// The direction, for errors.
    const WHAT: &'static str;
    /// The lane the message travels on.
    fn lane(&self) -> Lane;
    /// The model states it carries (checkpoint parts excluded), in a fixed order.
    fn states_mut(&mut self) -> Vec<&mut HostState>;
    /// What its state is to a quantized connection's view.
    fn carries(&self) -> Carries;
    /// The fragment its state is the part of (`None`: the whole state).
    fn fragment(&self) -> Option<usize>;
}

impl Framed for ToWorker {
    const WHAT: &'static str = "coordinator-to-rank";

    fn lane(&self) -> Lane {
        match self {
            ToWorker::Init { .. } | ToWorker::Update { .. } => Lane::Bulk,
            // Behind the update it may name by digest (so it arrives after it), and model-sized
            // when it carries the consensus.
            ToWorker::Mirror { .. } => Lane::Bulk,
            _ => Lane::Control,
        }
    }

    fn states_mut(&mut self) -> Vec<&mut HostState> {
        match self {
            ToWorker::Init { state, .. } | ToWorker::Update { state, .. } => vec![state],
            _ => Vec::new(),
        }
    }

    fn carries(&self) -> Carries {
        match self {
            ToWorker::Init { .. } => Carries::Base,
            ToWorker::Update { .. } => Carries::Delta,
            _ => Carries::Whole,
        }
    }

    fn fragment(&self) -> Option<usize> {
        match self {
            ToWorker::Update { fragment, .. } => *fragment,
            _ => None,
        }
    }
}

impl Framed for ToCoordinator {
    const WHAT: &'static str = "rank-to-coordinator";

    fn lane(&self) -> Lane {
        match self {
            ToCoordinator::Snapshot { .. } | ToCoordinator::Final { .. } => Lane::Bulk,
            ToCoordinator::Ready { initial: Some(_), .. } => Lane::Bulk,
            // A checkpoint part holds the optimizer state (and maybe the model): model-sized.
            ToCoordinator::Reduced { capture: Some(_), .. } => Lane::Bulk,
            _ => Lane::Control,
        }
    }

    fn states_mut(&mut self) -> Vec<&mut HostState> {
        match self {
            ToCoordinator::Snapshot { state, .. } => vec![state],
            ToCoordinator::Final { state: Some(state), .. }
            | ToCoordinator::Ready { initial: Some(state), .. } => vec![state],
            _ => Vec::new(),
        }
    }

    fn carries(&self) -> Carries {
        match self {
            ToCoordinator::Snapshot { .. } => Carries::Delta,
            _ => Carries::Whole,
        }
    }

    fn fragment(&self) -> Option<usize> {
        match self {
            ToCoordinator::Snapshot { fragment, .. } => *fragment,
            _ => None,
        }
    }
}

/// The bincode configuration of frames.
fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes `msg` as one frame in `format` with no view (f32 and bf16, or a message that
/// carries no delta); returns its lane and bytes.
pub(crate) fn encode<M: Framed>(msg: M, format: WireFormat) -> Result<(Lane, Vec<u8>), FrameError> {
    encode_with(msg, format, None, None)
}

/// The first state of a message: the one a `Base` or a `Delta` message carries.
fn first_state<M: Framed>(msg: &mut M) -> Option<&mut HostState> {
    msg.states_mut().into_iter().next()
}

/// Takes every state vector of `msg` out whole, in order, into `runs`.
fn take_runs<M: Framed>(msg: &mut M, runs: &mut Vec<F32Run>) {
    for state in msg.states_mut() {
        for values in state.params.iter_mut().chain(state.buffers.iter_mut()) {
            runs.push(F32Run(std::mem::take(values)));
        }
    }
}

/// Puts `runs` back into `msg`'s emptied state vectors, in order.
fn put_runs<M: Framed>(msg: &mut M, runs: Vec<F32Run>) -> Result<(), FrameError> {
    let packing = |detail: &str| FrameError::Packing { what: M::WHAT, detail: detail.into() };
    let mut runs = runs.into_iter();
    for state in msg.states_mut() {
        for slot in state.params.iter_mut().chain(state.buffers.iter_mut()) {
            let run = runs.next().ok_or_else(|| packing("fewer f32 runs than state vectors"))?;
            if !slot.is_empty() {
                return Err(packing("a state vector with f32 values and a run"));
            }
            *slot = run.0;
        }
    }
    match runs.next() {
        Some(_) => Err(packing("more f32 runs than state vectors")),
        None => Ok(()),
    }
}

/// Empties every state vector of `msg`, keeping their lengths in `lens`, in order.
fn empty_states<M: Framed>(msg: &mut M, lens: &mut Vec<u64>) {
    for state in msg.states_mut() {
        for values in state.params.iter_mut().chain(state.buffers.iter_mut()) {
            lens.push(values.len() as u64);
            *values = Vec::new();
        }
    }
}

/// Encodes `msg` as one frame in `format`, through `views` (this end's views) under a
/// quantized format, naming its starting state when it is the one `held` says the receiver
/// holds; returns its lane and bytes.
pub(crate) fn encode_with<M: Framed>(
    mut msg: M,
    format: WireFormat,
    views: Option<&mut Views>,
    held: Option<&Held>,
) -> Result<(Lane, Vec<u8>), FrameError> {
    let lane = msg.lane();
    let (mut lens, mut bf16, mut deltas, mut named) = (Vec::new(), Vec::new(), Vec::new(), None);
    let mut f32 = Vec::new();
    let delta_error = |source| FrameError::Delta { what: M::WHAT, source };
    let carries = msg.carries();
    let named_here = carries == Carries::Base
        && held.is_some_and(|held| first_state(&mut msg).is_some_and(|s| held.is(s)));
    match (format, carries) {
        _ if named_here => {
            if let Some(views) = views
                && let Some(state) = first_state(&mut msg)
            {
                views.set_base(state).map_err(delta_error)?;
            }
            named = held.map(Held::digest);
            empty_states(&mut msg, &mut lens);
        }
        (WireFormat::Bf16, _) => {
            for state in msg.states_mut() {
                for values in state.params.iter_mut().chain(state.buffers.iter_mut()) {
                    lens.push(values.len() as u64);
                    bf16.reserve(values.len() * 2);
                    for v in std::mem::take(values) {
                        bf16.extend_from_slice(&bf16::from_f32(v).to_le_bytes());
                    }
                }
            }
        }
        (WireFormat::F32, _) | (_, Carries::Whole) => take_runs(&mut msg, &mut f32),
        (_, Carries::Base) => {
            if let Some(views) = views
                && let Some(state) = first_state(&mut msg)
            {
                views.set_base(state).map_err(delta_error)?;
            }
            take_runs(&mut msg, &mut f32);
        }
        (_, Carries::Delta) => {
            let views = views.ok_or(delta_error(DeltaError::Format(format.name())))?;
            let fragment = msg.fragment();
            if let Some(state) = first_state(&mut msg) {
                deltas = views.encode(fragment, state).map_err(delta_error)?;
            }
            empty_states(&mut msg, &mut lens);
        }
    }
    // The frame's size is about its runs' and packed values' bytes: reserved once.
    let values: usize = f32.iter().map(|r| 4 * r.0.len()).sum();
    let coded: usize = deltas.iter().map(|d| d.bytes.len()).sum();
    let packed = Packed { msg, f32, lens, bf16, deltas, named };
    let mut bytes = Vec::with_capacity(values + coded + packed.bf16.len() + 4096);
    bincode::serde::encode_into_std_write(&packed, &mut bytes, config())
        .map_err(|source| FrameError::Encode { what: M::WHAT, source })?;
    Ok((lane, bytes))
}

/// Decodes one frame with no view (f32 and bf16); packed bf16 values are widened back into the
/// message's states.
pub(crate) fn decode<M: Framed>(bytes: &[u8]) -> Result<M, FrameError> {
    decode_with(bytes, None, None)
}

/// Puts the state `held` holds back into `msg`, for a frame that names it by `digest` with the
/// vectors' lengths `lens`.
fn unname<M: Framed>(
    msg: &mut M,
    digest: &[u8; 32],
    lens: &[u64],
    held: Option<&mut Held>,
) -> Result<(), FrameError> {
    let packing = |detail: &str| FrameError::Packing { what: M::WHAT, detail: detail.into() };
    let state =
        held.and_then(|held| held.take(digest)).ok_or(FrameError::Named { what: M::WHAT })?;
    let own: Vec<u64> = state.params.iter().chain(&state.buffers).map(|v| v.len() as u64).collect();
    let slot = first_state(msg).ok_or_else(|| packing("a state named where none can be"))?;
    let layout = slot.params.len() == state.params.len()
        && slot.buffers.len() == state.buffers.len()
        && slot.params.iter().chain(&slot.buffers).all(Vec::is_empty);
    if !layout || own != lens {
        return Err(packing("a named state of another layout than the one held"));
    }
    *slot = state;
    Ok(())
}

/// Decodes one frame; packed bf16 values are widened back into the message's states, deltas
/// are read through `views` (this end's views), and a starting state named by digest is the
/// one `held` holds. A base state becomes every view.
pub(crate) fn decode_with<M: Framed>(
    bytes: &[u8],
    mut views: Option<&mut Views>,
    held: Option<&mut Held>,
) -> Result<M, FrameError> {
    let (packed, read): (Packed<M>, usize) = bincode::serde::decode_from_slice(bytes, config())
        .map_err(|source| FrameError::Decode { what: M::WHAT, source })?;
    if read != bytes.len() {
        return Err(FrameError::Trailing { what: M::WHAT, extra: bytes.len() - read });
    }
    let Packed { mut msg, f32, lens, bf16, deltas, named } = packed;
    let packing = |detail: String| FrameError::Packing { what: M::WHAT, detail };
    let delta_error = |source| FrameError::Delta { what: M::WHAT, source };
    if bf16.len() % 2 != 0 {
        return Err(packing(format!("{} bytes of bf16", bf16.len())));
    }
    let carries = msg.carries();
    let fragment = msg.fragment();
    if !f32.is_empty()
        && (named.is_some() || !lens.is_empty() || !bf16.is_empty() || !deltas.is_empty())
    {
        return Err(packing("f32 runs beside values packed otherwise".into()));
    }
    if let Some(digest) = named {
        if carries != Carries::Base || !bf16.is_empty() || !deltas.is_empty() {
            return Err(packing("a named state where none can be".into()));
        }
        unname(&mut msg, &digest, &lens, held)?;
    }
    // The deltas are checked against the views before anything is made of them.
    let delta_values = match (deltas.is_empty(), carries) {
        (true, _) => None,
        (false, Carries::Delta) if bf16.is_empty() => {
            let views = views
                .as_deref_mut()
                .ok_or(packing("a delta on a connection without a view".into()))?;
            match views.expects(fragment, &deltas) {
                Ok(n) => Some(n),
                Err(DeltaError::Base { base, view }) if views.is_controller() && base < view => {
                    return Err(FrameError::Stale { what: M::WHAT, base, view });
                }
                Err(e) => return Err(delta_error(e)),
            }
        }
        (false, _) => return Err(packing("a delta where none can be".into())),
    };
    if !f32.is_empty() {
        put_runs(&mut msg, f32)?;
    } else if named.is_none() {
        fill(&mut msg, lens, &bf16, delta_values)?;
    }
    if delta_values.is_some()
        && let Some(views) = views.as_deref_mut()
        && let Some(state) = first_state(&mut msg)
    {
        views.decode(fragment, &deltas, state).map_err(delta_error)?;
    }
    if carries == Carries::Base
        && let Some(views) = views
        && let Some(state) = first_state(&mut msg)
    {
        views.set_base(state).map_err(delta_error)?;
    }
    Ok(msg)
}

/// Gives `msg`'s emptied state vectors their lengths `lens` back: widened from the `bf16`
/// values, or zeros of `delta_values` in all to be read from the deltas.
fn fill<M: Framed>(
    msg: &mut M,
    lens: Vec<u64>,
    bf16: &[u8],
    delta_values: Option<usize>,
) -> Result<(), FrameError> {
    let packing = |detail: String| FrameError::Packing { what: M::WHAT, detail };
    // The values packed: the views' length under deltas, else the bf16 values.
    let packed = delta_values.unwrap_or(bf16.len() / 2);
    let mut lens = lens.into_iter();
    let mut at = 0;
    if lens.len() != 0 {
        for state in msg.states_mut() {
            for slot in state.params.iter_mut().chain(state.buffers.iter_mut()) {
                let len = lens.next().ok_or_else(|| packing("too few lengths".into()))?;
                if !slot.is_empty() {
                    return Err(packing("a packed state vector also holds f32 values".into()));
                }
                let len = usize::try_from(len).map_err(|_| packing(format!("length {len}")))?;
                if len > packed - at {
                    return Err(packing(format!("{len} values announced, fewer packed")));
                }
                match delta_values {
                    // Filled from the deltas, once every length is known to fit.
                    Some(_) => *slot = vec![0.0; len],
                    None => slot.extend(
                        bf16[2 * at..2 * (at + len)]
                            .chunks_exact(2)
                            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
                    ),
                }
                at += len;
            }
        }
    }
    if lens.next().is_some() || at != packed {
        return Err(packing("more values packed than the states hold".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::fragment::Fragments;
    use crate::link::wire::Window;

    fn state(n: usize) -> HostState {
        HostState {
            params: vec![(0..n).map(|i| (i % 64) as f32 * 0.5 - 3.0).collect(), vec![1.0, -2.0]],
            buffers: vec![vec![0.25; 3]],
        }
    }

    /// A collective reduce's report, with a checkpoint part or without.
    fn reduced(part: bool) -> ToCoordinator {
        let capture = part.then(|| {
            Box::new(crate::link::wire::RankCapture {
                optimizer: Vec::new(),
                optimizer_steps: 2,
                model: None,
                outer: None,
                position: None,
            })
        });
        ToCoordinator::Reduced {
            rank: 1,
            round: 3,
            steps: 4,
            sync_ms: 1.5,
            divergence: None,
            capture,
        }
    }

    fn window() -> Window {
        Window { round: 3, target: 5, limit: 7, wall: None }
    }

    /// Every lane rule and both formats: f32 frames come back equal, bf16 frames come back
    /// rounded to bf16 (exact here: the values are representable) and about half the size.
    #[test]
    fn frames_round_trip_in_both_formats() -> Result<(), String> {
        let big = 10_000;
        let update = ToWorker::Update {
            state: state(big),
            next: window(),
            eval: None,
            global_step: 4,
            fragment: None,
        };
        let snapshot = ToCoordinator::Snapshot {
            rank: 1,
            round: 2,
            attempt: 0,
            state: state(big),
            steps: 3,
            capture: None,
            exchange: Default::default(),
            fragment: None,
        };
        type Case = Box<dyn Fn(WireFormat) -> Result<usize, String>>;
        let cases: Vec<Case> = vec![
            Box::new(move |f| round_trip(&update, f)),
            Box::new(move |f| round_trip(&snapshot, f)),
            Box::new(|f| round_trip(&ToWorker::Ping, f)),
            Box::new(|f| {
                let ready =
                    ToCoordinator::Ready { rank: 1, shapes: vec![], initial: None, holds: None };
                round_trip(&ready, f)
            }),
        ];
        for (i, case) in cases.iter().enumerate() {
            let full = case(WireFormat::F32)?;
            let half = case(WireFormat::Bf16)?;
            if i < 2 && (half as f64) > 0.55 * full as f64 {
                return Err(format!("case {i}: bf16 frame {half} bytes, f32 {full}"));
            }
        }
        let lanes = [
            (
                ToWorker::Init { state: state(2), restore: None, window: window(), global_step: 0 }
                    .lane(),
                Lane::Bulk,
            ),
            (ToWorker::Ping.lane(), Lane::Control),
            (
                ToWorker::Snapshot { round: 1, attempt: 0, capture: None, fragment: None }.lane(),
                Lane::Control,
            ),
            (
                ToCoordinator::Ready {
                    rank: 0,
                    shapes: vec![],
                    initial: Some(state(1)),
                    holds: None,
                }
                .lane(),
                Lane::Bulk,
            ),
            (ToCoordinator::Alive { rank: 0 }.lane(), Lane::Control),
            (reduced(true).lane(), Lane::Bulk),
            (reduced(false).lane(), Lane::Control),
        ];
        for (i, (got, want)) in lanes.iter().enumerate() {
            if got != want {
                return Err(format!("lane case {i}: {got:?}, want {want:?}"));
            }
        }
        Ok(())
    }

    fn round_trip<M: Framed + Clone + PartialEq + std::fmt::Debug>(
        msg: &M,
        format: WireFormat,
    ) -> Result<usize, String> {
        let (lane, bytes) = encode(msg.clone(), format).map_err(|e| e.to_string())?;
        if lane != msg.lane() {
            return Err(format!("{msg:?} framed on {lane:?}"));
        }
        let back: M = decode(&bytes).map_err(|e| e.to_string())?;
        if &back != msg {
            return Err(format!("{format}: {msg:?} came back different"));
        }
        Ok(bytes.len())
    }

    /// Under q4, through both ends' coders: an `Init` sets both views, a snapshot and an update
    /// travel as deltas in about 0.14× of f32's bytes, a snapshot that arrives after the
    /// controller's view moved on is `Stale` (the connection is sound), and an update the rank
    /// cannot place (it missed one) is a protocol error.
    #[test]
    fn quantized_frames_go_through_the_views() -> Result<(), String> {
        use crate::link::delta::Direction;
        let q = WireFormat::Q4.quantized().ok_or("q4 is quantized")?;
        let (mut ctl, mut rnk) =
            (Views::new(q, Direction::Consensus, 1), Views::new(q, Direction::Replica, 1));
        let n = 10_000;
        let init =
            ToWorker::Init { state: state(n), restore: None, window: window(), global_step: 0 };
        let (_, bytes) =
            encode_with(init, WireFormat::Q4, Some(&mut ctl), None).map_err(|e| e.to_string())?;
        let _: ToWorker = decode_with(&bytes, Some(&mut rnk), None).map_err(|e| e.to_string())?;
        let snapshot = |s: HostState| ToCoordinator::Snapshot {
            rank: 1,
            round: 1,
            attempt: 0,
            state: s,
            steps: 3,
            capture: None,
            exchange: Default::default(),
            fragment: None,
        };
        let mut moved = state(n);
        moved.params[0].iter_mut().for_each(|v| *v += 0.01);
        let (_, snap) = encode_with(snapshot(moved.clone()), WireFormat::Q4, Some(&mut rnk), None)
            .map_err(|e| e.to_string())?;
        let (_, full) =
            encode(snapshot(moved.clone()), WireFormat::F32).map_err(|e| e.to_string())?;
        if snap.len() as f64 > 0.14 * full.len() as f64 {
            return Err(format!(
                "a q4 snapshot of {} bytes against f32's {}",
                snap.len(),
                full.len()
            ));
        }
        match decode_with::<ToCoordinator>(&snap, Some(&mut ctl), None) {
            Ok(ToCoordinator::Snapshot { state: got, .. }) => {
                let err = got.params[0]
                    .iter()
                    .zip(&moved.params[0])
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                if err > 0.5 {
                    return Err(format!("the snapshot came back {err} off"));
                }
            }
            other => return Err(format!("the snapshot gave {other:?}")),
        }
        let update = |s| ToWorker::Update {
            state: s,
            next: window(),
            eval: None,
            global_step: 4,
            fragment: None,
        };
        let (_, first) = encode_with(update(moved.clone()), WireFormat::Q4, Some(&mut ctl), None)
            .map_err(|e| e.to_string())?;
        match decode_with::<ToCoordinator>(&snap, Some(&mut ctl), None) {
            Err(e @ FrameError::Stale { base: 0, view: 1, .. }) if e.is_stale() => {}
            other => return Err(format!("a late snapshot gave {other:?}")),
        }
        let (_, second) = encode_with(update(state(n)), WireFormat::Q4, Some(&mut ctl), None)
            .map_err(|e| e.to_string())?;
        match decode_with::<ToWorker>(&second, Some(&mut rnk), None) {
            Err(FrameError::Delta { .. }) => {}
            other => return Err(format!("an update past a missed one gave {other:?}")),
        }
        decode_with::<ToWorker>(&first, Some(&mut rnk), None).map_err(|e| e.to_string())?;
        decode_with::<ToWorker>(&second, Some(&mut rnk), None).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Under q4 with the model cut into 3 fragments, a snapshot and an update of the whole
    /// state travel as one delta per fragment (about q4's bytes of the whole model, not f32's)
    /// and come back within a quantum; every view moves on, so a fragment's delta after them
    /// is read, and an update the rank cannot place (it missed one) is refused.
    #[test]
    fn a_whole_state_of_a_cut_model_travels_as_a_delta_per_fragment() -> Result<(), String> {
        use crate::link::delta::Direction;
        let q = WireFormat::Q4.quantized().ok_or("q4 is quantized")?;
        let (mut ctl, mut rnk) =
            (Views::new(q, Direction::Consensus, 3), Views::new(q, Direction::Replica, 3));
        let base = HostState {
            params: [7000, 4000, 3000, 2000]
                .iter()
                .map(|&n| (0..n).map(|i| ((i * 37) % 101) as f32 * 0.02 - 1.0).collect())
                .collect(),
            buffers: vec![vec![0.5; 3]],
        };
        let init =
            ToWorker::Init { state: base.clone(), restore: None, window: window(), global_step: 0 };
        let (_, bytes) =
            encode_with(init, WireFormat::Q4, Some(&mut ctl), None).map_err(|e| e.to_string())?;
        let _: ToWorker = decode_with(&bytes, Some(&mut rnk), None).map_err(|e| e.to_string())?;
        let mut moved = base.clone();
        for (t, p) in moved.params.iter_mut().enumerate() {
            p.iter_mut().enumerate().for_each(|(i, v)| *v += ((i + t) % 7) as f32 * 0.003);
        }
        moved.buffers[0][1] = 0.51;
        let far = |a: &HostState, b: &HostState| -> f32 {
            let pairs = a.params.iter().chain(&a.buffers).zip(b.params.iter().chain(&b.buffers));
            pairs.flat_map(|(x, y)| x.iter().zip(y).map(|(x, y)| (x - y).abs())).fold(0.0, f32::max)
        };
        let snapshot = ToCoordinator::Snapshot {
            rank: 1,
            round: 1,
            attempt: 0,
            state: moved.clone(),
            steps: 3,
            capture: None,
            exchange: Default::default(),
            fragment: None,
        };
        let (_, full) = encode(snapshot.clone(), WireFormat::F32).map_err(|e| e.to_string())?;
        let (_, snap) = encode_with(snapshot, WireFormat::Q4, Some(&mut rnk), None)
            .map_err(|e| e.to_string())?;
        if snap.len() as f64 > 0.14 * full.len() as f64 {
            return Err(format!(
                "a whole q4 snapshot of {} bytes, f32's {}",
                snap.len(),
                full.len()
            ));
        }
        match decode_with::<ToCoordinator>(&snap, Some(&mut ctl), None) {
            Ok(ToCoordinator::Snapshot { state, .. }) if far(&state, &moved) < 0.005 => {}
            Ok(ToCoordinator::Snapshot { state, .. }) => {
                return Err(format!("the whole snapshot came back {} off", far(&state, &moved)));
            }
            other => return Err(format!("the whole snapshot gave {other:?}")),
        }
        let update = |state, fragment| ToWorker::Update {
            state,
            next: window(),
            eval: None,
            global_step: 4,
            fragment,
        };
        let (_, whole) =
            encode_with(update(moved.clone(), None), WireFormat::Q4, Some(&mut ctl), None)
                .map_err(|e| e.to_string())?;
        if whole.len() as f64 > 0.14 * full.len() as f64 {
            return Err(format!(
                "a whole q4 update of {} bytes, f32's {}",
                whole.len(),
                full.len()
            ));
        }
        let cut = Fragments::of_state(&moved, 3).map_err(|e| e.to_string())?;
        let part = cut.part(1, &moved).map_err(|e| e.to_string())?;
        let (_, next) =
            encode_with(update(part.clone(), Some(1)), WireFormat::Q4, Some(&mut ctl), None)
                .map_err(|e| e.to_string())?;
        match decode_with::<ToWorker>(&next, Some(&mut rnk), None) {
            Err(FrameError::Delta { .. }) => {}
            other => return Err(format!("an update past a missed whole one gave {other:?}")),
        }
        match decode_with::<ToWorker>(&whole, Some(&mut rnk), None) {
            Ok(ToWorker::Update { state, .. }) if far(&state, &moved) < 0.005 => {}
            other => return Err(format!("the whole update gave {other:?}")),
        }
        match decode_with::<ToWorker>(&next, Some(&mut rnk), None) {
            Ok(ToWorker::Update { state, fragment: Some(1), .. }) if far(&state, &part) < 0.005 => {
                Ok(())
            }
            other => Err(format!("fragment 1's update after the whole one gave {other:?}")),
        }
    }

    /// A starting state the rank holds travels as its digest (in f32 and through q4's views,
    /// which both take it as their base); the same frame at an end that holds nothing is
    /// refused, and another state travels whole.
    #[test]
    fn a_starting_state_the_rank_holds_travels_as_its_digest() -> Result<(), String> {
        use crate::link::delta::Direction;
        let n = 10_000;
        let init =
            |state| ToWorker::Init { state, restore: None, window: window(), global_step: 0 };
        let mut other = state(n);
        other.params[0][5] += 1.0;
        for format in [WireFormat::F32, WireFormat::Q4] {
            let views = |d| format.quantized().map(|q| Views::new(q, d, 1));
            let (mut ctl, mut rnk) = (views(Direction::Consensus), views(Direction::Replica));
            let mut own = Held::own(state(n));
            let peer = Held::peer(own.digest());
            let (_, named) = encode_with(init(state(n)), format, ctl.as_mut(), Some(&peer))
                .map_err(|e| e.to_string())?;
            if named.len() > 1000 {
                return Err(format!("{format}: a named starting state took {} bytes", named.len()));
            }
            if !matches!(decode::<ToWorker>(&named), Err(FrameError::Named { .. })) {
                return Err(format!("{format}: a named state decoded where none is held"));
            }
            match decode_with::<ToWorker>(&named, rnk.as_mut(), Some(&mut own)) {
                Ok(ToWorker::Init { state: got, .. }) if got == state(n) => {}
                other => return Err(format!("{format}: the named state gave {other:?}")),
            }
            let (_, carried) = encode_with(init(other.clone()), format, ctl.as_mut(), Some(&peer))
                .map_err(|e| e.to_string())?;
            if carried.len() < 4 * n {
                return Err(format!("{format}: another state took {} bytes", carried.len()));
            }
            match decode_with::<ToWorker>(&carried, rnk.as_mut(), Some(&mut own)) {
                Ok(ToWorker::Init { state: got, .. }) if got == other => {}
                other => return Err(format!("{format}: another state gave {other:?}")),
            }
        }
        Ok(())
    }

    /// Garbage, truncations and tampered packings are errors, never panics.
    #[test]
    fn bad_frames_are_errors() -> Result<(), String> {
        let msg = ToCoordinator::Final { rank: 2, state: Some(state(40)), capture: None };
        let (_, bytes) = encode(msg, WireFormat::Bf16).map_err(|e| e.to_string())?;
        for cut in 0..bytes.len() {
            if decode::<ToCoordinator>(&bytes[..cut]).is_ok() {
                return Err(format!("decoded from {cut} of {} bytes", bytes.len()));
            }
        }
        let mut longer = bytes.clone();
        longer.push(0);
        if decode::<ToCoordinator>(&longer).is_ok() {
            return Err("a frame with a trailing byte decoded".into());
        }
        let noise: Vec<u8> =
            (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [1, 7, 64, 4096] {
            let _ = decode::<ToWorker>(&noise[..len]);
            let _ = decode::<ToCoordinator>(&noise[..len]);
        }
        // Forged packings of a state of two vectors: more bf16 values claimed than held; f32
        // runs too few, too many, beside values left in the message, beside lengths.
        let run = |n: usize| F32Run(vec![1.5; n]);
        // (values left in the message, runs, lengths, bf16 bytes)
        type Forgery = (Vec<f32>, Vec<F32Run>, Vec<u64>, Vec<u8>);
        let forgeries: [Forgery; 5] = [
            (vec![], vec![], vec![10, 0], vec![0; 4]),
            (vec![], vec![run(3)], vec![], vec![]),
            (vec![], vec![run(3), run(0), run(1)], vec![], vec![]),
            (vec![2.0], vec![run(3), run(1)], vec![], vec![]),
            (vec![], vec![run(3), run(1)], vec![3, 1], vec![]),
        ];
        for (case, (inline, f32, lens, bf16)) in forgeries.into_iter().enumerate() {
            let forged = Packed {
                msg: ToCoordinator::Final {
                    rank: 0,
                    state: Some(HostState { params: vec![inline, vec![]], buffers: vec![] }),
                    capture: None,
                },
                f32,
                lens,
                bf16,
                deltas: Vec::new(),
                named: None,
            };
            let bytes =
                bincode::serde::encode_to_vec(&forged, config()).map_err(|e| e.to_string())?;
            match decode::<ToCoordinator>(&bytes) {
                Err(FrameError::Packing { .. }) => {}
                other => return Err(format!("forgery {case} gave {other:?}")),
            }
        }
        Ok(())
    }
}

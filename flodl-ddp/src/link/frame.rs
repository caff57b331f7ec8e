//! How a [`wire`](super::wire) message becomes one frame of a network connection and back:
//! bincode 2, the lane it travels on, and the optional packing of model states.
//!
//! A frame is the bincode 2 encoding of a [`Packed`] message: the message itself and, under
//! [`WireFormat::Bf16`], the values of the model states it carries taken out of it and packed
//! as bf16 (half the bytes; the lengths of the emptied vectors travel with them). Under the
//! quantized formats ([`WireFormat::Int8`], [`WireFormat::Q4`]) the consensus updates and the
//! snapshots travel as blockwise-quantized deltas from the view both ends of the connection
//! keep ([`super::delta`]); every other state travels whole in f32. Checkpoint parts
//! (optimizer state, positions) always travel in f32, so a bundle is exact.

use std::fmt;
use std::str::FromStr;

use half::bf16;
use serde::{Deserialize, Serialize};

use super::delta::{Carries, Delta, DeltaError};
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

/// A message as it travels: the message and, under bf16, its states' values, or under a
/// quantized format its state's delta.
#[derive(Serialize, Deserialize)]
struct Packed<M> {
    msg: M,
    /// The length of every state vector emptied, in order.
    lens: Vec<u64>,
    /// Their values, bf16 little-endian, in order.
    bf16: Vec<u8>,
    /// Their values as a quantized delta from the connection's view.
    delta: Option<Delta>,
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
    /// What a message that [`Framed::carries`] a delta of the whole state is under a cut into
    /// fragments (the views are per fragment): the controller's update becomes every view, a
    /// rank's snapshot travels whole.
    const WHOLE_UNDER_CUT: Carries;
}

/// What `msg`'s state is to `views`: [`Framed::carries`], except a delta of the whole state
/// under a cut into fragments ([`Framed::WHOLE_UNDER_CUT`]).
fn carried<M: Framed>(msg: &M, views: Option<&Views>) -> Carries {
    match msg.carries() {
        Carries::Delta if msg.fragment().is_none() && views.is_some_and(Views::is_cut) => {
            M::WHOLE_UNDER_CUT
        }
        carries => carries,
    }
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

    const WHOLE_UNDER_CUT: Carries = Carries::Base;
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
            ToCoordinator::Snapshot { state, .. } | ToCoordinator::Final { state, .. } => {
                vec![state]
            }
            ToCoordinator::Ready { initial: Some(state), .. } => vec![state],
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

    const WHOLE_UNDER_CUT: Carries = Carries::Whole;
}

/// The bincode configuration of frames.
fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes `msg` as one frame in `format` with no view (f32 and bf16, or a message that
/// carries no delta); returns its lane and bytes.
pub(crate) fn encode<M: Framed>(msg: M, format: WireFormat) -> Result<(Lane, Vec<u8>), FrameError> {
    encode_with(msg, format, None)
}

/// The vectors of `msg`'s states, in order (end to end they are the state a coder sees).
fn parts<M: Framed>(msg: &mut M) -> Vec<&[f32]> {
    msg.states_mut()
        .into_iter()
        .flat_map(|state| {
            let state: &HostState = state;
            state.params.iter().chain(state.buffers.iter()).map(Vec::as_slice)
        })
        .collect()
}

/// The vectors of `msg`'s states, in order, to be written.
fn parts_mut<M: Framed>(msg: &mut M) -> Vec<&mut [f32]> {
    msg.states_mut()
        .into_iter()
        .flat_map(|state| {
            state.params.iter_mut().chain(state.buffers.iter_mut()).map(Vec::as_mut_slice)
        })
        .collect()
}

/// The whole state of a message that carries a base state (`Init`: one state).
fn base_state<M: Framed>(msg: &mut M) -> Option<&HostState> {
    msg.states_mut().into_iter().next().map(|s| &*s)
}

/// Encodes `msg` as one frame in `format`, through `views` (this end's views) under a
/// quantized format; returns its lane and bytes.
pub(crate) fn encode_with<M: Framed>(
    mut msg: M,
    format: WireFormat,
    views: Option<&mut Views>,
) -> Result<(Lane, Vec<u8>), FrameError> {
    let lane = msg.lane();
    let (mut lens, mut bf16, mut delta) = (Vec::new(), Vec::new(), None);
    let delta_error = |source| FrameError::Delta { what: M::WHAT, source };
    let carries = carried(&msg, views.as_deref());
    match (format, carries) {
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
        (WireFormat::F32, _) | (_, Carries::Whole) => {}
        (_, Carries::Base) => {
            if let Some(views) = views
                && let Some(state) = base_state(&mut msg)
            {
                views.set_base(state).map_err(delta_error)?;
            }
        }
        (_, Carries::Delta) => {
            let views = views.ok_or(delta_error(DeltaError::Format(format.name())))?;
            let coder = views.coder(msg.fragment()).map_err(delta_error)?;
            delta = Some(coder.encode_parts(&parts(&mut msg)).map_err(delta_error)?);
            for state in msg.states_mut() {
                for values in state.params.iter_mut().chain(state.buffers.iter_mut()) {
                    lens.push(values.len() as u64);
                    *values = Vec::new();
                }
            }
        }
    }
    let packed = Packed { msg, lens, bf16, delta };
    let bytes = bincode::serde::encode_to_vec(&packed, config())
        .map_err(|source| FrameError::Encode { what: M::WHAT, source })?;
    Ok((lane, bytes))
}

/// Decodes one frame with no view (f32 and bf16); packed bf16 values are widened back into the
/// message's states.
pub(crate) fn decode<M: Framed>(bytes: &[u8]) -> Result<M, FrameError> {
    decode_with(bytes, None)
}

/// Decodes one frame; packed bf16 values are widened back into the message's states, and a
/// delta is read through `views` (this end's views). A base state becomes every view.
pub(crate) fn decode_with<M: Framed>(
    bytes: &[u8],
    mut views: Option<&mut Views>,
) -> Result<M, FrameError> {
    let (packed, read): (Packed<M>, usize) = bincode::serde::decode_from_slice(bytes, config())
        .map_err(|source| FrameError::Decode { what: M::WHAT, source })?;
    if read != bytes.len() {
        return Err(FrameError::Trailing { what: M::WHAT, extra: bytes.len() - read });
    }
    let Packed { mut msg, lens, bf16, delta } = packed;
    let packing = |detail: String| FrameError::Packing { what: M::WHAT, detail };
    let delta_error = |source| FrameError::Delta { what: M::WHAT, source };
    if bf16.len() % 2 != 0 {
        return Err(packing(format!("{} bytes of bf16", bf16.len())));
    }
    let carries = carried(&msg, views.as_deref());
    let fragment = msg.fragment();
    // A delta is checked against the view before anything is made of it.
    let delta = match (delta, carries) {
        (None, _) => None,
        (Some(delta), Carries::Delta) if bf16.is_empty() => {
            let views = views
                .as_deref_mut()
                .ok_or(packing("a delta on a connection without a view".into()))?;
            let coder = views.coder(fragment).map_err(delta_error)?;
            match coder.expects(&delta) {
                Ok(n) => Some((delta, n)),
                Err(DeltaError::Base { base, view }) if coder.is_controller() && base < view => {
                    return Err(FrameError::Stale { what: M::WHAT, base, view });
                }
                Err(e) => return Err(delta_error(e)),
            }
        }
        (Some(_), _) => return Err(packing("a delta where none can be".into())),
    };
    // The values packed: the view's length under a delta, else the bf16 values.
    let packed = delta.as_ref().map_or(bf16.len() / 2, |(_, n)| *n);
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
                match delta {
                    // Filled from the delta below, once every length is known to fit.
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
    if let Some((delta, _)) = delta
        && let Some(views) = views.as_deref_mut()
    {
        let coder = views.coder(fragment).map_err(delta_error)?;
        coder.decode_parts(&delta, &mut parts_mut(&mut msg)).map_err(delta_error)?;
    }
    if carries == Carries::Base
        && let Some(views) = views
        && let Some(state) = base_state(&mut msg)
    {
        views.set_base(state).map_err(delta_error)?;
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
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
                round_trip(&ToCoordinator::Ready { rank: 1, shapes: vec![], initial: None }, f)
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
                ToCoordinator::Ready { rank: 0, shapes: vec![], initial: Some(state(1)) }.lane(),
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
            encode_with(init, WireFormat::Q4, Some(&mut ctl)).map_err(|e| e.to_string())?;
        let _: ToWorker = decode_with(&bytes, Some(&mut rnk)).map_err(|e| e.to_string())?;
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
        let (_, snap) = encode_with(snapshot(moved.clone()), WireFormat::Q4, Some(&mut rnk))
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
        match decode_with::<ToCoordinator>(&snap, Some(&mut ctl)) {
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
        let (_, first) = encode_with(update(moved.clone()), WireFormat::Q4, Some(&mut ctl))
            .map_err(|e| e.to_string())?;
        match decode_with::<ToCoordinator>(&snap, Some(&mut ctl)) {
            Err(e @ FrameError::Stale { base: 0, view: 1, .. }) if e.is_stale() => {}
            other => return Err(format!("a late snapshot gave {other:?}")),
        }
        let (_, second) = encode_with(update(state(n)), WireFormat::Q4, Some(&mut ctl))
            .map_err(|e| e.to_string())?;
        match decode_with::<ToWorker>(&second, Some(&mut rnk)) {
            Err(FrameError::Delta { .. }) => {}
            other => return Err(format!("an update past a missed one gave {other:?}")),
        }
        decode_with::<ToWorker>(&first, Some(&mut rnk)).map_err(|e| e.to_string())?;
        decode_with::<ToWorker>(&second, Some(&mut rnk)).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Garbage, truncations and tampered packings are errors, never panics.
    #[test]
    fn bad_frames_are_errors() -> Result<(), String> {
        let msg = ToCoordinator::Final { rank: 2, state: state(40), capture: None };
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
        // A packing that claims more values than it holds.
        let forged = Packed {
            msg: ToCoordinator::Final {
                rank: 0,
                state: HostState { params: vec![vec![]], buffers: vec![] },
                capture: None,
            },
            lens: vec![10],
            bf16: vec![0; 4],
            delta: None,
        };
        let bytes = bincode::serde::encode_to_vec(&forged, config()).map_err(|e| e.to_string())?;
        match decode::<ToCoordinator>(&bytes) {
            Err(FrameError::Packing { .. }) => Ok(()),
            other => Err(format!("a forged packing gave {other:?}")),
        }
    }
}

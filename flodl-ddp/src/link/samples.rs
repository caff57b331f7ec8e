//! One of every wire message each way, with every optional part filled and left out: the seeds
//! of the wire tests (here) and of the fuzz test.

use std::collections::BTreeMap;

use super::failure::{FailureKind, RankFailure};
use super::wire::{
    CaptureRequest, Chunk, GroupKey, RankCapture, RankRestore, Readiness, Regroup, Window,
};
use super::wire::{ToCoordinator, ToWorker};
use crate::contract::capability::{Capability, TrainerOption};
use crate::control::metrics::{EvalMetrics, WorkTally};
use crate::error::Divergence;
use crate::state::{HostState, HostTensor};

fn state() -> HostState {
    HostState { params: vec![vec![1.5, -2.0], vec![f32::MIN_POSITIVE]], buffers: vec![vec![3.0]] }
}

fn capture() -> RankCapture {
    let t = HostTensor { shape: vec![2], data: vec![0.25, 4.0] };
    RankCapture {
        optimizer: vec![t.clone()],
        optimizer_steps: 17,
        model: Some(state()),
        outer: Some((vec![t.clone()], vec![t])),
        position: Some((Chunk { epoch: 2, offset: 128, len: 64 }, 1)),
    }
}

/// One of every message each way, with every optional part filled and left out.
pub(crate) fn messages() -> (Vec<ToWorker>, Vec<ToCoordinator>) {
    let window =
        Window { round: 9, target: 4, limit: 6, wall: Some(std::time::Duration::from_millis(12)) };
    let chunk = Chunk { epoch: 1, offset: 640, len: 320 };
    let restore = RankRestore {
        optimizer: vec![HostTensor { shape: vec![1], data: vec![7.0] }],
        optimizer_steps: 3,
        outer: None,
        global_step: 88,
    };
    let request = Some(CaptureRequest { model: true });
    let mut scalars = BTreeMap::new();
    scalars.insert("grad_norm".to_string(), (2.5, 3));
    scalars.insert("ünïcode loss".to_string(), (-1.0, 1));
    let mut time = crate::control::breakdown::TimeBreakdown::default();
    time.add(crate::control::breakdown::Activity::Compute, 9.5);
    let work = WorkTally {
        batches: 5,
        samples: 320,
        loss_sum: 1.25,
        compute_ms: 9.5,
        time: time.closed(12.25),
        scalars,
        cache: Some(crate::control::metrics::CacheTally { hits: 300, misses: 20 }),
    };
    let failure = RankFailure { kind: FailureKind::Replica, message: "boom".into() };
    #[allow(unused_mut)] // a build with cuda adds an NCCL regroup
    let mut to_rank = vec![
        ToWorker::Init { state: state(), restore: Some(Box::new(restore)), window, global_step: 0 },
        ToWorker::Init { state: HostState::default(), restore: None, window, global_step: 41 },
        ToWorker::Work(chunk),
        ToWorker::Stage { chunks: vec![chunk, Chunk { epoch: 2, offset: 0, len: 64 }] },
        ToWorker::Stage { chunks: Vec::new() },
        ToWorker::Reduce { next: window, eval: Some(3), global_step: 99, capture: request },
        ToWorker::Reduce { next: window, eval: None, global_step: 0, capture: None },
        ToWorker::Due { round: 9 },
        ToWorker::Last { round: 2 },
        ToWorker::Snapshot { round: 4, attempt: 2, capture: request, fragment: None },
        ToWorker::Snapshot { round: 5, attempt: 0, capture: None, fragment: Some(3) },
        ToWorker::Resume,
        ToWorker::Update {
            state: state(),
            next: window,
            eval: None,
            global_step: 12,
            fragment: None,
        },
        ToWorker::Update {
            state: state(),
            next: window,
            eval: Some(1),
            global_step: 13,
            fragment: Some(1),
        },
        ToWorker::Evaluate { epoch: 5 },
        ToWorker::Finish { capture: true, state: true },
        ToWorker::Finish { capture: false, state: false },
        ToWorker::Stop,
        ToWorker::Ping,
        ToWorker::Regroup { generation: 2, members: vec![0, 2], how: Regroup::Host },
        ToWorker::MakeGroupId { generation: 3 },
        ToWorker::Regroup {
            generation: 4,
            members: vec![0, 1, 2],
            how: Regroup::InMemory(GroupKey(7)),
        },
        ToWorker::Join { window, global_step: 57 },
        ToWorker::AbortGroup { generation: u64::MAX },
        ToWorker::Mirror { frame: vec![7, 0, 255, 3] },
    ];
    #[cfg(feature = "cuda")]
    if let Ok(id) = flodl_nccl::UniqueId::try_from(vec![9u8; flodl_nccl::UniqueId::LEN]) {
        to_rank.push(ToWorker::Regroup { generation: 3, members: vec![1], how: Regroup::Nccl(id) });
    }
    let to_coordinator = vec![
        ToCoordinator::Ready {
            rank: 0,
            shapes: vec![vec![2, 3], vec![3]],
            initial: Some(state()),
            holds: None,
        },
        ToCoordinator::Ready { rank: 1, shapes: vec![], initial: None, holds: Some([7; 32]) },
        ToCoordinator::ChunkDone { rank: 1, chunk, work: work.into() },
        ToCoordinator::Progress {
            rank: 2,
            round: 7,
            steps: 4,
            wall_ms: 3.5,
            why: Readiness::Idle,
            works: 11,
            tail_ms: Some(0.75),
            exposed_ms: Some(12.5),
        },
        ToCoordinator::Reduced {
            rank: 0,
            round: 7,
            steps: 4,
            sync_ms: 0.5,
            divergence: Some(0.01),
            capture: Some(Box::new(capture())),
        },
        ToCoordinator::Snapshot {
            exchange: Default::default(),
            rank: 1,
            round: 3,
            attempt: 1,
            state: state(),
            steps: 2,
            capture: None,
            fragment: Some(2),
        },
        ToCoordinator::Evaluated {
            rank: 0,
            epoch: 1,
            eval: Some(EvalMetrics { loss: 0.1, accuracy: 0.97, samples: 10_000 }),
        },
        ToCoordinator::Final { rank: 0, state: Some(state()), capture: Some(Box::new(capture())) },
        ToCoordinator::Final { rank: 1, state: None, capture: None },
        ToCoordinator::Alive { rank: 3 },
        ToCoordinator::Failed { rank: 2, failure },
        ToCoordinator::Failed {
            rank: 0,
            failure: RankFailure {
                kind: FailureKind::MissingCapability {
                    option: TrainerOption::MaxGradNorm,
                    capability: Capability::MutableGradients,
                },
                message: "needs".into(),
            },
        },
        ToCoordinator::Diverged { rank: 1, step: 40, cause: Divergence::Loss(f32::INFINITY) },
        ToCoordinator::Diverged { rank: 0, step: 41, cause: Divergence::Parameters },
        ToCoordinator::Reducing { rank: 1, round: 8 },
        ToCoordinator::ReduceFailed { rank: 1, round: 8, generation: 0, error: "lost".into() },
        ToCoordinator::Joining { rank: 0, generation: 1 },
        ToCoordinator::Joined { rank: 0, generation: 1 },
        ToCoordinator::GroupId { rank: 1, generation: 3, how: Regroup::Host },
    ];
    (to_rank, to_coordinator)
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    use super::*;
    use crate::link::frame::{WireFormat, encode};
    use crate::link::wire::WIRE_VERSION;

    fn round_trip<T>(msg: &T) -> Result<T, String>
    where
        T: Serialize + serde::de::DeserializeOwned,
    {
        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(msg, config).map_err(|e| e.to_string())?;
        let (back, read) =
            bincode::serde::decode_from_slice(&bytes, config).map_err(|e| e.to_string())?;
        if read != bytes.len() {
            return Err(format!("decoded {read} of {} bytes", bytes.len()));
        }
        Ok(back)
    }

    /// Every wire message (each seed) survives bincode 2 unchanged, and the rank a rank message
    /// names is kept.
    #[test]
    fn every_wire_message_round_trips_through_bincode() -> Result<(), String> {
        let (to_rank, to_coordinator) = messages();
        for msg in &to_rank {
            let back = round_trip(msg)?;
            if &back != msg {
                return Err(format!("{msg:?} came back as {back:?}"));
            }
        }
        for msg in &to_coordinator {
            let back = round_trip(msg)?;
            if &back != msg || back.rank() != msg.rank() {
                return Err(format!("{msg:?} came back as {back:?}"));
            }
        }
        Ok(())
    }

    /// The version and the digest of the messages' frames it names (see
    /// [`super::super::wire::WIRE_VERSION`]).
    const ENCODING: (u32, &str) =
        (1, "488c117311e2abbfcb00faf443a1943fff965aab72a1a5981ad4874a9e18d43d");

    /// The digest of the frames of every message but the NCCL regroup, which exists only in
    /// builds with `cuda` (the last variant, so the others encode alike in both builds).
    fn encoding_digest() -> Result<String, String> {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        let (to_rank, to_coordinator) = messages();
        let mut frame = |bytes: Vec<u8>| {
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        for msg in to_rank {
            #[cfg(feature = "cuda")]
            if matches!(&msg, ToWorker::Regroup { how: Regroup::Nccl(_), .. }) {
                continue;
            }
            let (_, bytes) = encode(msg, WireFormat::F32).map_err(|e| e.to_string())?;
            frame(bytes);
        }
        for msg in to_coordinator {
            let (_, bytes) = encode(msg, WireFormat::F32).map_err(|e| e.to_string())?;
            frame(bytes);
        }
        Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }

    /// A change to any message's encoding changes the digest of their frames, and then the
    /// version must be raised with it: two builds that encode differently never share a number.
    #[test]
    fn the_wire_version_names_this_encoding() -> Result<(), String> {
        let digest = encoding_digest()?;
        let (version, recorded) = ENCODING;
        if digest != recorded {
            let next = WIRE_VERSION + 1;
            return Err(format!(
                "the sample messages' frames changed (digest {digest}): if a message or its \
                 encoding changed, raise WIRE_VERSION (link/wire.rs) to {next} and set ENCODING \
                 here to ({next}, \"{digest}\"); if only a sample's values did, set it to \
                 ({WIRE_VERSION}, \"{digest}\")"
            ));
        }
        if version != WIRE_VERSION {
            return Err(format!(
                "WIRE_VERSION is {WIRE_VERSION} but the frames are those of version {version}: \
                 the version changes with the encoding, and only then"
            ));
        }
        Ok(())
    }

    /// Truncated encodings are refused with an error, never a panic.
    #[test]
    fn truncated_messages_are_decode_errors() -> Result<(), String> {
        let config = bincode::config::standard();
        let (to_rank, _) = messages();
        for msg in &to_rank {
            let bytes = bincode::serde::encode_to_vec(msg, config).map_err(|e| e.to_string())?;
            for cut in 0..bytes.len() {
                let decoded: Result<(ToWorker, usize), _> =
                    bincode::serde::decode_from_slice(&bytes[..cut], config);
                if decoded.is_ok() {
                    return Err(format!("{msg:?} decoded from {cut} of {} bytes", bytes.len()));
                }
            }
        }
        Ok(())
    }
}

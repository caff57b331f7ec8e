//! A rank's and the controller's ends of one connection with a model-sized state, for the wire
//! bench (`benches/benches/wire.rs`); not part of the API.

use super::delta::Direction;
use super::frame::{self, WireFormat};
use super::views::Views;
use super::wire::{ToCoordinator, ToWorker, Window};
use crate::state::HostState;

/// Both ends of one connection in one format, their views set from one `Init`.
#[derive(Debug)]
pub struct Rig {
    format: WireFormat,
    rank: Option<Views>,
    controller: Option<Views>,
    state: HostState,
}

/// A rank's snapshot, ready to be encoded (cloned outside the timed part).
#[derive(Debug, Clone)]
pub struct Snapshot(ToCoordinator);

/// A consensus update, ready to be encoded.
#[derive(Debug, Clone)]
pub struct Update(ToWorker);

/// Deterministic values in `[-scale, scale)`.
fn noise(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn window() -> Window {
    Window { round: 1, target: 1, limit: 1, wall: None }
}

impl Rig {
    /// Both ends in `format`, their views a state of tensors of `sizes` values.
    ///
    /// # Errors
    /// A frame that cannot be made or read (as its line).
    pub fn new(format: WireFormat, sizes: &[usize]) -> Result<Rig, String> {
        let params: Vec<Vec<f32>> =
            sizes.iter().enumerate().map(|(i, &n)| noise(n, i as u64, 0.1)).collect();
        let state = HostState { params, buffers: Vec::new() };
        let mut rig = Rig {
            format,
            rank: format.quantized().map(|q| Views::new(q, Direction::Replica, 1)),
            controller: format.quantized().map(|q| Views::new(q, Direction::Consensus, 1)),
            state: state.clone(),
        };
        let init = ToWorker::Init { state, restore: None, window: window(), global_step: 0 };
        let (_, bytes) = frame::encode_with(init, format, rig.controller.as_mut(), None)
            .map_err(|e| e.to_string())?;
        frame::decode_with::<ToWorker>(&bytes, rig.rank.as_mut(), None)
            .map_err(|e| e.to_string())?;
        Ok(rig)
    }

    /// A snapshot a step away from the view.
    pub fn snapshot(&self) -> Snapshot {
        let mut state = self.state.clone();
        for (i, v) in state.params.iter_mut().enumerate() {
            let step = noise(v.len(), 100 + i as u64, 0.01);
            for (x, d) in v.iter_mut().zip(step) {
                *x += d;
            }
        }
        Snapshot(ToCoordinator::Snapshot {
            rank: 1,
            round: 1,
            attempt: 0,
            state,
            steps: 1,
            capture: None,
            exchange: Default::default(),
            fragment: None,
        })
    }

    /// A consensus a step away from the view.
    pub fn update(&self) -> Update {
        let Snapshot(ToCoordinator::Snapshot { state, .. }) = self.snapshot() else {
            unreachable!("snapshot() makes a snapshot")
        };
        Update(ToWorker::Update {
            state,
            next: window(),
            eval: None,
            global_step: 1,
            fragment: None,
        })
    }

    /// The rank's end encodes `snapshot` into a frame.
    ///
    /// # Errors
    /// The frame's error, as its line.
    pub fn encode_snapshot(&mut self, snapshot: Snapshot) -> Result<Vec<u8>, String> {
        frame::encode_with(snapshot.0, self.format, self.rank.as_mut(), None)
            .map(|(_, bytes)| bytes)
            .map_err(|e| e.to_string())
    }

    /// The controller's end decodes a snapshot's frame (its view stays: repeatable).
    ///
    /// # Errors
    /// The frame's error, as its line.
    pub fn decode_snapshot(&mut self, bytes: &[u8]) -> Result<(), String> {
        frame::decode_with::<ToCoordinator>(bytes, self.controller.as_mut(), None)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// The controller's end encodes `update` into a frame (its view advances by it).
    ///
    /// # Errors
    /// The frame's error, as its line.
    pub fn encode_update(&mut self, update: Update) -> Result<Vec<u8>, String> {
        frame::encode_with(update.0, self.format, self.controller.as_mut(), None)
            .map(|(_, bytes)| bytes)
            .map_err(|e| e.to_string())
    }
}

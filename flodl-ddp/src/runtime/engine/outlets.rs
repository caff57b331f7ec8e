//! What the engine writes into: the channels and flags a run's threads share with the face's
//! handle (`Outlets`), and what a finished run returns (`TrainedState`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use flodl_tensor::{Stream, Tensor};
use serde::{Deserialize, Serialize};

use crate::contract::replica::Replica;
use crate::control::metrics::{EpochMetrics, GuardEvent, ReduceEvent};
use crate::runtime::engine::capture::SaveRequest;
use crate::runtime::engine::fault::{DeadFlags, FaultEvent, RejoinEvent};
use crate::state::{HostState, HostTensor};
use crate::{Error, Result};

/// The channels and flags a run's threads share with its handle.
#[derive(Debug, Clone)]
pub(crate) struct Outlets {
    /// Epoch metrics, in order (capacity: the number of epochs, so never full).
    pub(crate) epochs: flume::Sender<EpochMetrics>,
    /// Reduce events (dropped when the handle does not drain them).
    pub(crate) reduces: flume::Sender<ReduceEvent>,
    /// Divergence-guard events (dropped when the handle does not drain them).
    pub(crate) guards: flume::Sender<GuardEvent>,
    /// Set to stop the run.
    pub(crate) cancel: Arc<AtomicBool>,
    /// A checkpoint asked for at the next reduce.
    pub(crate) save_now: Arc<SaveRequest>,
    /// Rank deaths (dropped when the handle does not drain them).
    pub(crate) faults: flume::Sender<FaultEvent>,
    /// Ranks joining again (dropped when the handle does not drain them).
    pub(crate) rejoins: flume::Sender<RejoinEvent>,
    /// Which ranks the coordinator declared dead.
    pub(crate) dead: DeadFlags,
    /// Sent once every replica is built and checked and training starts.
    pub(crate) started: flume::Sender<()>,
}

/// What a finished run returns: the averaged model and the run's metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainedState {
    /// The averaged parameters, in the replica's order.
    pub params: Vec<HostTensor>,
    /// The averaged buffers, in the replica's order.
    pub buffers: Vec<HostTensor>,
    /// Every epoch's metrics, in order.
    pub epochs: Vec<EpochMetrics>,
    /// Reduces performed.
    pub reduces: u64,
    /// Wall time of the run in milliseconds (replica construction included).
    pub wall_ms: f64,
    /// Training wall time in milliseconds: the first batch handed out to the last epoch done
    /// (replica construction and the final evaluation excluded).
    pub train_ms: f64,
    /// Samples trained, all ranks and epochs together.
    pub samples: usize,
    /// Every rank death the run survived, in order (the same events
    /// [`crate::DdpHandle::poll_fault_events`] streams while it runs).
    #[serde(default)]
    pub faults: Vec<FaultEvent>,
    /// Every rank that joined the run again after its death, in order (the same events
    /// [`crate::DdpHandle::poll_rejoin_events`] streams while it runs).
    #[serde(default)]
    pub rejoins: Vec<RejoinEvent>,
}

impl TrainedState {
    /// Training throughput in samples per second (`samples / train_ms`).
    pub fn throughput(&self) -> f64 {
        if self.train_ms > 0.0 { self.samples as f64 * 1000.0 / self.train_ms } else { 0.0 }
    }

    /// The last evaluation of the run, if any.
    pub fn final_eval(&self) -> Option<crate::EvalMetrics> {
        self.epochs.iter().rev().find_map(|e| e.eval)
    }
}

impl TrainedState {
    /// Writes the parameters and buffers into `replica` (same architecture) on `stream`, then
    /// has the replica take them into its model ([`Replica::import_parameters`]), so one whose
    /// model lives in another stack's variables computes with the loaded state too.
    ///
    /// # Errors
    /// [`Error::ReplicaMismatch`] when the counts or shapes differ; tensor errors; whatever the
    /// replica's import raises.
    pub fn load_into(&self, replica: &mut dyn Replica, stream: &Stream) -> Result<()> {
        load(&self.params, replica.parameters_mut(), "parameters", stream)?;
        load(&self.buffers, replica.buffers_mut(), "buffers", stream)?;
        replica.import_parameters()
    }
}

fn load(src: &[HostTensor], dst: &mut [Tensor], what: &str, stream: &Stream) -> Result<()> {
    if src.len() != dst.len() {
        return Err(Error::mismatch(
            "tensors of a trained state",
            format!("{} {what} (the replica's)", dst.len()),
            src.len(),
        ));
    }
    for (s, d) in src.iter().zip(dst) {
        if s.shape != d.shape() {
            return Err(Error::mismatch(
                "a tensor's shape in a trained state",
                format!("{what} {:?} (the replica's)", d.shape()),
                format!("{:?}", s.shape),
            ));
        }
        d.copy_from_host(&s.data, stream)?;
    }
    Ok(())
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Pairs host values with their shapes (parameters first, then buffers).
pub(crate) fn trained_state(
    shapes: &[Vec<usize>],
    state: HostState,
    epochs: Vec<EpochMetrics>,
    reduces: u64,
    wall_ms: f64,
    train_ms: f64,
    faults: Vec<FaultEvent>,
) -> Result<TrainedState> {
    let n = state.params.len();
    if shapes.len() != n + state.buffers.len() {
        return Err(Error::mismatch(
            "shapes of a trained state",
            format!("{n} parameters and {} buffers", state.buffers.len()),
            format!("{} shapes", shapes.len()),
        ));
    }
    let pair = |shapes: &[Vec<usize>], values: Vec<Vec<f32>>| -> Vec<HostTensor> {
        shapes.iter().zip(values).map(|(s, data)| HostTensor { shape: s.clone(), data }).collect()
    };
    let samples = epochs.iter().map(|e| e.samples).sum();
    Ok(TrainedState {
        params: pair(&shapes[..n], state.params),
        buffers: pair(&shapes[n..], state.buffers),
        epochs,
        reduces,
        wall_ms,
        train_ms,
        samples,
        faults,
        rejoins: Vec::new(),
    })
}

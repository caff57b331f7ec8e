//! The controller's state as one serializable value: who is in the run now, and the books at
//! the cut of the last completed reduce (what the consensus holds). The parameters themselves
//! live on every rank; the host backend's controller also keeps the consensus it averaged.

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::checkpoint::EpochCoverage;
use crate::control::dispatch::Dispatcher;
use crate::control::elche::{ElChe, ElCheState};
use crate::control::guard::Guard;
use crate::control::metrics::EpochMetrics;
use crate::runtime::engine::roster::Standing;
use crate::runtime::engine::standby::term::Term;
use crate::state::{HostState, HostTensor};

/// The books as of a completed reduce: what a controller taking over resumes from. Work done
/// after it is in no consensus yet, so it is left out (a takeover trains it again).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Cut {
    /// Reduces completed: the consensus version.
    pub(crate) reduces: u64,
    /// Batches of all ranks up to the reduce.
    pub(crate) global_step: u64,
    /// The oldest epoch not complete: the schedule's position.
    pub(crate) epoch: usize,
    /// The completed ranges of every open epoch (the dispatcher's book, as a checkpoint holds
    /// it), with the leading parts of held chunks that the reduce took in
    /// ([`Dispatcher::reduced_parts`]): exactly what the consensus holds, so a takeover trains
    /// every sample once.
    pub(crate) coverage: Vec<EpochCoverage>,
    /// ElChe's estimates (`Cadence` and `Async` runs).
    pub(crate) elche: Option<ElCheState>,
    /// The divergence guard's state.
    pub(crate) guard: Guard,
    /// Host backend: the outer optimizer's previous consensus and velocity, once it has run.
    pub(crate) outer: Option<(Vec<HostTensor>, Vec<HostTensor>)>,
    /// Host backend: the consensus the reduce produced, or where the standby finds it.
    pub(crate) consensus: CutConsensus,
    /// The epochs completed, with their metrics.
    pub(crate) epochs: Vec<EpochMetrics>,
    /// The shapes of the replica's parameters then buffers (the consensus is flat).
    pub(crate) shapes: Vec<Vec<usize>>,
}

/// Where a cut's consensus is.
///
/// Carrying it costs a whole model's bytes on the controller's link, and their copies and
/// encoding on its thread, per reduce (measured at 80 MB: BENCHMARKS, "the standby's mirror"),
/// while over an f32 wire the
/// standby's process already holds those exact bits: its rank was just sent them as its
/// update (or, joining, as its starting state). A cut then names them by digest, and the
/// standby's mirror takes its rank's copy when the digests agree (`Mirror::accept`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum CutConsensus {
    /// None: the collective backend's consensus lives on the ranks only.
    Absent,
    /// In the cut.
    Carried(HostState),
    /// The state last sent to the standby's rank, whose [`HostState::digest`] this is.
    Sent { digest: [u8; 32] },
}

impl CutConsensus {
    /// The consensus, when the cut carries it.
    pub(crate) fn carried(&self) -> Option<&HostState> {
        match self {
            CutConsensus::Carried(state) => Some(state),
            CutConsensus::Absent | CutConsensus::Sent { .. } => None,
        }
    }
}

/// What the books a cut is read from hold beyond the dispatcher and ElChe.
#[derive(Debug)]
pub(crate) struct CutParts<'a> {
    pub(crate) reduces: u64,
    pub(crate) global_step: u64,
    /// The run's seed (the epochs' permutations).
    pub(crate) seed: u64,
    pub(crate) guard: &'a Guard,
    pub(crate) outer: Option<(Vec<HostTensor>, Vec<HostTensor>)>,
    pub(crate) consensus: Option<&'a HostState>,
    /// The digest of the whole state the standby's rank holds from the update of this cut,
    /// when it stands for `consensus`: the cut names it rather than carrying it
    /// ([`CutConsensus::Sent`]).
    pub(crate) sent: Option<[u8; 32]>,
    pub(crate) epochs: Vec<EpochMetrics>,
    pub(crate) shapes: &'a [Vec<usize>],
}

impl Cut {
    /// The cut of `dispatch` and `elche` at a completed reduce (the one rule both the controller
    /// and the tests read a cut by).
    ///
    /// # Errors
    /// [`crate::Error::Checkpoint`] when the dispatcher's book makes no coverage.
    pub(crate) fn of(
        dispatch: &Dispatcher,
        elche: Option<&ElChe>,
        parts: CutParts<'_>,
    ) -> Result<Cut> {
        Ok(Cut {
            reduces: parts.reduces,
            global_step: parts.global_step,
            epoch: dispatch.oldest(),
            coverage: dispatch.coverage(&dispatch.reduced_parts(), parts.seed)?,
            elche: elche.map(ElChe::state),
            guard: parts.guard.clone(),
            outer: parts.outer,
            consensus: match parts.consensus {
                None => CutConsensus::Absent,
                Some(_) if let Some(digest) = parts.sent => CutConsensus::Sent { digest },
                Some(state) => CutConsensus::Carried(state.clone()),
            },
            epochs: parts.epochs,
            shapes: parts.shapes.to_vec(),
        })
    }
}

/// The controller's state: its term, every seat's standing now, and the books at the last
/// reduce's cut (`None` before the first one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ControllerState {
    pub(crate) term: Term,
    pub(crate) seats: Vec<Standing>,
    pub(crate) cut: Option<Box<Cut>>,
}

impl ControllerState {
    /// The state of a controller of `term` that has completed no reduce yet.
    pub(crate) fn new(term: Term, seats: Vec<Standing>) -> ControllerState {
        ControllerState { term, seats, cut: None }
    }
}

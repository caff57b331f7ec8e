//! Checkpoints in a running run: what each rank captures at a reduce, how the coordinator
//! assembles and saves a bundle from it, and how a resumed run is seeded from one.
//!
//! A save is taken at a reduce. On the collective backend every rank captures right after its
//! all-reduce (and outer step), on the host backend with its snapshot; from then until the
//! coordinator lets it go (`Resume`, or the host backend's `Update`) the rank trains nothing,
//! so the completions the coordinator has credited and the ranks' positions describe one cut of
//! the run. A rank's capture holds its inner optimizer state and its position in the chunk it
//! was training; the lowest live rank also sends the consensus model and its copy of the outer
//! optimizer (the host backend's consensus and outer optimizer are the coordinator's own).
//!
//! The bundle's RNG list stays empty: the runtime draws nothing at run time (epoch permutations
//! are a pure function of the seed and the epoch, and replicas are seeded at construction), so
//! there is no generator state to save. A replica with generators of its own (dropout, say)
//! would have to expose them for an exact resume.

use std::collections::BTreeMap;
use std::path::PathBuf;

use flodl_tensor::{Stream, Tensor};

use crate::checkpoint::{
    Checkpoint, CheckpointError, EpochCoverage, OpaqueState, RankMap, SampleRange, SaveReason,
    TensorRecord, TensorSet,
};
use crate::control::elche::ElCheState;
use crate::control::guard::Guard;
use crate::control::metrics::EpochMetrics;
use crate::control::outer::OuterOptimizer;
use crate::link::wire::{RankCapture, RankRestore};
use crate::runtime::engine::run_config::{CheckpointPlan, Resumed, RunConfig};
use crate::runtime::engine::standby::Cut;
use crate::runtime::spec::{ResumeTerms, RunSpec};
use crate::state::{HostState, HostTensor};
use crate::{Error, Internal, Result};

/// Names of the tensor sets in a bundle written by the runtime.
const PARAM: &str = "param";
const BUFFER: &str = "buffer";
const OPTIMIZER: &str = "optimizer";
const OUTER_PREV: &str = "outer.prev";
const OUTER_VELOCITY: &str = "outer.velocity";
/// Extras written by the runtime.
const EXTRA_EPOCHS: &str = "epochs";
const EXTRA_GUARD: &str = "guard";
const EXTRA_OPTIMIZER_STEPS: &str = "optimizer_steps";
const EXTRA_RESUME_TERMS: &str = "resume_terms";
const EXTRA_DEVICES: &str = "devices";

/// A checkpoint asked for through the handle, taken by the coordinator at its next reduce:
/// save, or save and stop the run.
#[derive(Debug, Default)]
pub(crate) struct SaveRequest(std::sync::atomic::AtomicU8);

impl SaveRequest {
    const SAVE: u8 = 1;
    const STOP: u8 = 2;

    /// Asks for a save (and a stop after it when `stop`); a stop asked once stays asked.
    pub(crate) fn ask(&self, stop: bool) {
        let want = if stop { Self::STOP } else { Self::SAVE };
        self.0.fetch_max(want, std::sync::atomic::Ordering::AcqRel);
    }

    /// The pending request, cleared: `Some(stop)`.
    pub(crate) fn take(&self) -> Option<bool> {
        match self.0.swap(0, std::sync::atomic::Ordering::AcqRel) {
            0 => None,
            asked => Some(asked >= Self::STOP),
        }
    }
}

/// Everything except tensors that a bundle records about the run at its cut.
#[derive(Debug)]
pub(crate) struct Progress<'a> {
    pub(crate) reason: SaveReason,
    pub(crate) global_step: u64,
    pub(crate) epoch: usize,
    pub(crate) reduces: u64,
    pub(crate) elche: Option<ElCheState>,
    pub(crate) guard: &'a Guard,
    pub(crate) epochs: &'a [EpochMetrics],
    pub(crate) coverage: Vec<EpochCoverage>,
}

/// Copies `tensors` to the host with their shapes.
pub(crate) fn host_tensors(tensors: &[Tensor], stream: &Stream) -> Result<Vec<HostTensor>> {
    tensors
        .iter()
        .map(|t| Ok(HostTensor { shape: t.shape().to_vec(), data: t.to_vec::<f32>(stream)? }))
        .collect()
}

/// Writes host values into `tensors`, checking count and sizes first (nothing is written on a
/// mismatch).
pub(crate) fn write_host(
    what: &str,
    tensors: &mut [Tensor],
    values: &[HostTensor],
    stream: &Stream,
) -> Result<()> {
    if tensors.len() != values.len() {
        return Err(Error::mismatch(
            "tensors restored from a checkpoint",
            format!("{} {what} tensors (the replica's)", tensors.len()),
            values.len(),
        ));
    }
    if let Some((t, v)) = tensors.iter().zip(values).find(|(t, v)| t.shape() != v.shape.as_slice())
    {
        return Err(Error::mismatch(
            "a tensor's shape in a checkpoint",
            format!("{what} {:?} (the replica's)", t.shape()),
            format!("{:?}", v.shape),
        ));
    }
    for (t, v) in tensors.iter_mut().zip(values) {
        t.copy_from_host(&v.data, stream)?;
    }
    Ok(())
}

/// The outer optimizer's state on the host, once it has run.
pub(crate) fn outer_state(
    outer: &OuterOptimizer,
    stream: &Stream,
) -> Result<Option<(Vec<HostTensor>, Vec<HostTensor>)>> {
    match (outer.previous(), outer.velocity()) {
        (Some(prev), Some(velocity)) => {
            Ok(Some((host_tensors(prev, stream)?, host_tensors(velocity, stream)?)))
        }
        _ => Ok(None),
    }
}

/// Restores an outer optimizer from host values.
pub(crate) fn restore_outer(
    outer: &mut OuterOptimizer,
    state: &(Vec<HostTensor>, Vec<HostTensor>),
    stream: &Stream,
) -> Result<()> {
    let upload = |ts: &[HostTensor]| -> Result<Vec<Tensor>> {
        ts.iter().map(|t| Ok(Tensor::from_slice(&t.data, &t.shape, stream)?)).collect()
    };
    outer.restore(upload(&state.0)?, upload(&state.1)?)?;
    Ok(())
}

fn set_of(prefix: &str, tensors: &[HostTensor]) -> Result<TensorSet> {
    let records = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| TensorRecord::from_f32(format!("{prefix}.{i}"), t.shape.clone(), &t.data))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(TensorSet::from_records(records)?)
}

fn host_of(set: &TensorSet, prefix: &str) -> Result<Vec<HostTensor>> {
    set.records()
        .iter()
        .filter(|r| r.name().strip_prefix(prefix).is_some_and(|rest| rest.starts_with('.')))
        .map(|r| {
            let data = r.to_f32_vec().ok_or_else(|| {
                CheckpointError::malformed(format!("{} is {}, not f32", r.name(), r.dtype()))
            })?;
            Ok(HostTensor { shape: r.shape().to_vec(), data })
        })
        .collect()
}

/// The model signature the replicas of a run define: parameter `i` is `param.i`.
pub(crate) fn signature(shapes: &[Vec<usize>]) -> crate::checkpoint::ModelSignature {
    crate::checkpoint::ModelSignature::new(
        shapes
            .iter()
            .enumerate()
            .map(|(i, s)| crate::checkpoint::SignatureEntry {
                name: format!("{PARAM}.{i}"),
                shape: s.clone(),
                dtype: crate::checkpoint::StoredDType::F32,
            })
            .collect(),
    )
}

/// Assembles a bundle from the ranks' captures (indexed by rank; `None` for a dead rank) and
/// the coordinator's state. `consensus` and `outer` are the host backend's (the collective
/// backend's come from the capture that holds the model).
pub(crate) fn assemble(
    cfg: &RunConfig,
    shapes: &[Vec<usize>],
    captures: &[Option<RankCapture>],
    consensus: Option<&HostState>,
    outer: Option<(Vec<HostTensor>, Vec<HostTensor>)>,
    progress: Progress<'_>,
) -> Result<Checkpoint> {
    assemble_for(&cfg.spec, shapes, captures, consensus, outer, progress)
}

/// [`assemble`] for a run of `spec` (what a standby taking over knows of the run: every
/// process agrees on the spec).
pub(crate) fn assemble_for(
    spec: &RunSpec,
    shapes: &[Vec<usize>],
    captures: &[Option<RankCapture>],
    consensus: Option<&HostState>,
    outer: Option<(Vec<HostTensor>, Vec<HostTensor>)>,
    progress: Progress<'_>,
) -> Result<Checkpoint> {
    let from_rank = captures.iter().flatten().find(|c| c.model.is_some());
    let model = consensus
        .or_else(|| from_rank.and_then(|c| c.model.as_ref()))
        .ok_or(Internal::NothingCaptured)?;
    let outer = outer.or_else(|| from_rank.and_then(|c| c.outer.clone()));
    let n = model.params.len();
    if shapes.len() != n + model.buffers.len() {
        return Err(Error::mismatch(
            "tensors of a captured model",
            shapes.len(),
            format!("{n} parameters and {} buffers", model.buffers.len()),
        ));
    }
    let pair = |shapes: &[Vec<usize>], values: &[Vec<f32>]| -> Vec<HostTensor> {
        shapes
            .iter()
            .zip(values)
            .map(|(s, d)| HostTensor { shape: s.clone(), data: d.clone() })
            .collect()
    };
    let mut ckpt = Checkpoint::new(
        set_of(PARAM, &pair(&shapes[..n], &model.params))?,
        spec.world(),
        spec.compat_hash()?,
    );
    ckpt.buffers = set_of(BUFFER, &pair(&shapes[n..], &model.buffers))?;
    ckpt.optimizer = captures
        .iter()
        .map(|c| {
            c.as_ref().map_or_else(|| Ok(TensorSet::new()), |c| set_of(OPTIMIZER, &c.optimizer))
        })
        .collect::<Result<_>>()?;
    if let Some((prev, velocity)) = &outer {
        let mut set = set_of(OUTER_PREV, prev)?;
        for r in set_of(OUTER_VELOCITY, velocity)?.records() {
            set.push(r.clone())?;
        }
        ckpt.outer = set;
    }
    ckpt.reason = progress.reason;
    ckpt.global_step = progress.global_step;
    ckpt.epoch = progress.epoch as u64;
    ckpt.reduce_version = progress.reduces;
    ckpt.elche = progress.elche.as_ref().map(OpaqueState::encode).transpose()?;
    ckpt.coverage = progress.coverage;
    let mut extras = BTreeMap::new();
    extras.insert(EXTRA_EPOCHS.to_owned(), OpaqueState::encode(&progress.epochs)?);
    extras.insert(EXTRA_GUARD.to_owned(), OpaqueState::encode(progress.guard)?);
    let steps: Vec<u64> =
        captures.iter().map(|c| c.as_ref().map_or(0, |c| c.optimizer_steps)).collect();
    extras.insert(EXTRA_OPTIMIZER_STEPS.to_owned(), OpaqueState::encode(&steps)?);
    extras.insert(EXTRA_RESUME_TERMS.to_owned(), OpaqueState::encode(&spec.resume_terms())?);
    let devices: Vec<String> = spec.devices.iter().map(ToString::to_string).collect();
    extras.insert(EXTRA_DEVICES.to_owned(), OpaqueState::encode(&devices)?);
    ckpt.extras = extras;
    ckpt.validate()?;
    Ok(ckpt)
}

/// What a standby taking over starts from: its mirror's last cut as a bundle, assembled as a
/// save is, so the new controller starts through the one resume path (the consensus, the outer
/// optimizer, ElChe, the guard, the schedule's position and the open epochs' coverage). The
/// ranks' inner optimizer states are on the ranks, not in the mirror: the bundle holds none, so
/// a rank resumed from it starts its optimizer afresh.
///
/// The bundle a controller of `spec`'s run taking over from `cut` resumes from.
///
/// # Errors
/// [`Error::Protocol`] when the cut holds no consensus (the collective backend's is on the
/// ranks only; the standby's mirror resolves one named by digest before it keeps a cut); a checkpoint error when the cut's shapes do not fit its consensus.
pub(crate) fn takeover_bundle(spec: &RunSpec, cut: &Cut) -> Result<Checkpoint> {
    let consensus = cut
        .consensus
        .carried()
        .ok_or_else(|| Error::protocol("the mirrored cut holds no consensus"))?;
    let progress = Progress {
        reason: SaveReason::Fault {
            detail: format!("a standby took over at reduce {}", cut.reduces),
        },
        global_step: cut.global_step,
        epoch: cut.epoch,
        reduces: cut.reduces,
        elche: cut.elche.clone(),
        guard: &cut.guard,
        epochs: &cut.epochs,
        coverage: cut.coverage.clone(),
    };
    let parts = vec![None; spec.world()];
    assemble_for(spec, &cut.shapes, &parts, Some(consensus), cut.outer.clone(), progress)
}

/// Decodes a bundle for a resumed run of `cfg` (its terms already checked): the consensus and
/// outer state for every rank, and each rank's inner optimizer state by the [`RankMap`] rule
/// (the saving world may be another size).
pub(crate) fn decode(cfg: &RunConfig, bundle: Checkpoint) -> Result<Resumed> {
    let params = host_of(&bundle.params, PARAM)?;
    let buffers = host_of(&bundle.buffers, BUFFER)?;
    let consensus = HostState {
        params: params.into_iter().map(|t| t.data).collect(),
        buffers: buffers.into_iter().map(|t| t.data).collect(),
    };
    let outer = {
        let prev = host_of(&bundle.outer, OUTER_PREV)?;
        let velocity = host_of(&bundle.outer, OUTER_VELOCITY)?;
        (!prev.is_empty()).then_some((prev, velocity))
    };
    let steps: Vec<u64> = match bundle.extras.get(EXTRA_OPTIMIZER_STEPS) {
        Some(s) => s.decode()?,
        None => Vec::new(),
    };
    let map = RankMap::of(&bundle, cfg.world());
    let ranks = (0..cfg.world())
        .map(|r| {
            let (optimizer, optimizer_steps) = match map.source(r) {
                Some(old) => match bundle.optimizer.get(old) {
                    Some(set) => (host_of(set, OPTIMIZER)?, steps.get(old).copied().unwrap_or(0)),
                    None => (Vec::new(), 0),
                },
                None => (Vec::new(), 0),
            };
            Ok(RankRestore {
                optimizer,
                optimizer_steps,
                outer: outer.clone(),
                global_step: bundle.global_step,
            })
        })
        .collect::<Result<_>>()?;
    let elche = bundle.elche.as_ref().map(OpaqueState::decode::<ElCheState>).transpose()?;
    let guard = bundle.extras.get(EXTRA_GUARD).map(OpaqueState::decode::<Guard>).transpose()?;
    let epochs = match bundle.extras.get(EXTRA_EPOCHS) {
        Some(e) => e.decode::<Vec<EpochMetrics>>()?,
        None => Vec::new(),
    };
    let coverage = bundle.coverage.clone();
    Ok(Resumed { bundle, consensus, ranks, elche, guard, epochs, coverage, map })
}

impl Checkpoint {
    /// The metrics of the epochs a run had completed when it wrote this bundle (empty for a
    /// bundle no run wrote). A resumed run's final state starts with them.
    ///
    /// # Errors
    /// [`CheckpointError::Malformed`] when the recorded metrics do not decode.
    pub fn epoch_metrics(&self) -> std::result::Result<Vec<EpochMetrics>, CheckpointError> {
        match self.extras.get(EXTRA_EPOCHS) {
            Some(e) => e.decode(),
            None => Ok(Vec::new()),
        }
    }

    /// The settings of the run that wrote this bundle which a resuming run must share (`None`
    /// for a bundle written before they were recorded, or by no run).
    ///
    /// # Errors
    /// [`CheckpointError::Malformed`] or a decode error when the recorded terms do not decode.
    pub fn resume_terms(&self) -> std::result::Result<Option<ResumeTerms>, CheckpointError> {
        self.extras.get(EXTRA_RESUME_TERMS).map(OpaqueState::decode).transpose()
    }

    /// The devices of the run that wrote this bundle, one per rank (`cpu`, `cuda:1`; a cluster
    /// run's name the kind only), when it recorded them.
    ///
    /// # Errors
    /// As [`resume_terms`](Self::resume_terms).
    pub fn saved_devices(&self) -> std::result::Result<Option<Vec<String>>, CheckpointError> {
        self.extras.get(EXTRA_DEVICES).map(OpaqueState::decode).transpose()
    }
}

/// Saves `ckpt` in the plan's store: as the newest step bundle, or under `name`.
pub(crate) fn save(
    plan: &CheckpointPlan,
    ckpt: &Checkpoint,
    name: Option<&str>,
) -> Result<PathBuf> {
    let path = match name {
        Some(name) => plan.store.save_named(name, ckpt)?,
        None => plan.store.save(ckpt)?,
    };
    tracing::info!(path = %path.display(), step = ckpt.global_step, reason = ?ckpt.reason, "checkpoint saved");
    Ok(path)
}

/// The partial positions of the captures: `(epoch, trained leading range of the chunk)`.
pub(crate) fn partial_ranges(
    captures: &[Option<RankCapture>],
    batch_size: usize,
) -> Vec<(usize, SampleRange)> {
    captures
        .iter()
        .flatten()
        .filter_map(|c| c.position)
        .filter(|(_, done)| *done > 0)
        .map(|(chunk, done)| {
            (chunk.epoch, SampleRange::new(chunk.offset, (done * batch_size).min(chunk.len)))
        })
        .collect()
}

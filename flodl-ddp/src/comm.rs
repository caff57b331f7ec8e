//! A rank's end of the collective backend: the work-weighted in-place average.

use flodl_nccl::{AbortHandle, HostComm};
use flodl_tensor::{Device, Stream, Tensor};

use crate::Result;

/// The communicator a rank averages through.
#[derive(Debug)]
pub(crate) enum RankComm {
    /// The in-process host collective: CPU tensors are reduced in place, device tensors
    /// through host mirrors.
    Host {
        /// The communicator.
        comm: HostComm,
        /// Host copies of device tensors (empty for CPU ranks).
        mirrors: Vec<Vec<f32>>,
    },
}

impl RankComm {
    /// One communicator per rank for `world` ranks, each waiting at most `timeout`.
    pub(crate) fn host_group(world: usize, timeout: std::time::Duration) -> Vec<RankComm> {
        HostComm::group(world)
            .into_iter()
            .map(|mut comm| {
                comm.set_timeout(timeout);
                RankComm::Host { comm, mirrors: Vec::new() }
            })
            .collect()
    }

    /// A handle that aborts this communicator's group.
    pub(crate) fn abort_handle(&self) -> AbortHandle {
        match self {
            RankComm::Host { comm, .. } => comm.abort_handle(),
        }
    }

    /// Agrees with every rank on the averaging weights of a reduce in which this rank trained
    /// `steps` batches: `None` when no rank stepped, else this rank's parameter weight
    /// `steps / Σ steps` and buffer weight `1 / ranks that stepped` (0 when it did not step).
    /// Every rank must call this, then [`reduce`](Self::reduce) identically, for each reduce.
    ///
    /// # Errors
    /// Collective errors (abort, timeout, peer lost, mismatch).
    pub(crate) fn weights(&mut self, steps: usize) -> Result<Option<(f32, f32)>> {
        match self {
            RankComm::Host { comm, .. } => {
                let mass = steps as f32;
                let mover = if steps > 0 { 1.0 } else { 0.0 };
                let mut meta = [mass, mover];
                comm.all_reduce_sum_f32(&mut [&mut meta[..]])?;
                let [total, movers] = meta;
                if total <= 0.0 || movers <= 0.0 {
                    return Ok(None);
                }
                Ok(Some((mass / total, mover / movers)))
            }
        }
    }

    /// Replaces `tensors` on every rank by `Σ_r weight_r · tensors_r`, in place.
    ///
    /// # Errors
    /// Collective errors and tensor errors.
    pub(crate) fn reduce(
        &mut self,
        tensors: &mut [Tensor],
        weight: f32,
        stream: &Stream,
    ) -> Result<()> {
        match self {
            RankComm::Host { comm, mirrors } => {
                host_weighted(comm, mirrors, tensors, weight, stream)
            }
        }
    }
}

/// In-place weighted all-reduce of `tensors` through the host collective.
fn host_weighted(
    comm: &mut HostComm,
    mirrors: &mut Vec<Vec<f32>>,
    tensors: &mut [Tensor],
    weight: f32,
    stream: &Stream,
) -> Result<()> {
    if tensors.iter().all(|t| t.device() == Device::Cpu) {
        let mut slices = Vec::with_capacity(tensors.len());
        for t in tensors.iter_mut() {
            slices.push(t.as_mut_slice::<f32>()?);
        }
        comm.all_reduce_weighted_f32(&mut slices, weight)?;
        return Ok(());
    }
    mirrors.resize_with(tensors.len(), Vec::new);
    for (t, m) in tensors.iter().zip(mirrors.iter_mut()) {
        m.resize(t.numel(), 0.0);
        t.copy_to_host(m, stream)?;
    }
    {
        let mut slices: Vec<&mut [f32]> =
            mirrors.iter_mut().take(tensors.len()).map(|m| m.as_mut_slice()).collect();
        comm.all_reduce_weighted_f32(&mut slices, weight)?;
    }
    for (t, m) in tensors.iter_mut().zip(mirrors.iter()) {
        t.copy_from_host(m, stream)?;
    }
    Ok(())
}

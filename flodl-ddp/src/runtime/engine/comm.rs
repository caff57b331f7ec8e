//! A rank's end of the collective backend: the work-weighted in-place average.

use flodl_nccl::{AbortHandle, HostComm};
use flodl_tensor::{Device, Stream, Tensor};

use crate::config_error::{ConfigError, Field};
use crate::control::weighting::average_weights;
use crate::link::wire::{GroupKey, Regroup};
use crate::{Internal, Result};

/// How a rank joins the collective backend, decided before the ranks start.
#[derive(Debug)]
pub(crate) enum CommPlan {
    /// A ready host communicator (CPU ranks, and mixed CPU/GPU worlds).
    Host(RankComm),
    /// NCCL: every rank is a GPU and joins the group named by this id inside its own thread.
    #[cfg(feature = "cuda")]
    Nccl { id: flodl_nccl::UniqueId, world: usize },
    /// MPI: a CPU rank in its own process joins the MPI world it was started in (`mpirun`),
    /// whose rank and size must be the cluster's.
    #[cfg(feature = "mpi")]
    Mpi { world: usize },
    /// The in-memory engine: the rank claims its place in the host group of this key, in
    /// this process (see [`crate::runtime::engine::host_groups`]).
    InMemory { key: GroupKey, world: usize },
}

impl CommPlan {
    /// The plan of the group of `size` members that `how` names by an id the controller
    /// relayed (NCCL, the in-memory engine); `None` for a shrunk host group, which is built
    /// from the current one.
    pub(crate) fn relayed(how: &Regroup, size: usize) -> Option<CommPlan> {
        match how {
            Regroup::Host => None,
            Regroup::InMemory(key) => Some(CommPlan::InMemory { key: *key, world: size }),
            #[cfg(feature = "cuda")]
            Regroup::Nccl(id) => Some(CommPlan::Nccl { id: id.clone(), world: size }),
        }
    }

    /// Joins the group as `rank` on `device` (NCCL: blocks until every rank joined, at most
    /// `timeout`).
    ///
    /// # Errors
    /// NCCL errors (library missing, timeout, no GPU) and tensor errors.
    pub(crate) fn join(
        self,
        rank: usize,
        device: Device,
        timeout: std::time::Duration,
    ) -> Result<RankComm> {
        match self {
            CommPlan::Host(comm) => {
                let _ = (rank, device, timeout);
                Ok(comm)
            }
            CommPlan::InMemory { key, world } => {
                let comm = crate::runtime::engine::host_groups::claim(key, rank, world, timeout)?;
                Ok(RankComm::Host { comm, mirrors: Vec::new() })
            }
            #[cfg(feature = "cuda")]
            CommPlan::Nccl { id, world } => {
                let Device::Cuda(ordinal) = device else {
                    return Err(ConfigError::unsupported(
                        Field::Devices,
                        format!("an NCCL rank trains on a GPU, this one on {device}"),
                    )
                    .into());
                };
                let comm = flodl_nccl::NcclComm::new(&id, rank, world, ordinal, timeout)?;
                let stream = Stream::new(device)?;
                let meta = Tensor::zeros(&[world], flodl_tensor::DType::F32, &stream)?;
                let fence = flodl_tensor::Event::new(device)?;
                Ok(RankComm::Device { comm: Box::new(comm), stream, meta, fence })
            }
            #[cfg(feature = "mpi")]
            CommPlan::Mpi { world } => {
                if device != Device::Cpu {
                    return Err(ConfigError::unsupported(
                        Field::Devices,
                        format!("an MPI rank trains on the CPU, this one on {device}"),
                    )
                    .into());
                }
                let mut comm = flodl_nccl::MpiComm::world()?;
                comm.set_timeout(timeout);
                RankComm::across(Box::new(comm), rank, world)
            }
        }
    }
}

/// The communicator a rank averages through.
pub(crate) enum RankComm {
    /// The in-process host collective: CPU tensors are reduced in place, device tensors
    /// through host mirrors.
    Host {
        /// The communicator.
        comm: HostComm,
        /// Host copies of device tensors (empty for CPU ranks).
        mirrors: Vec<Vec<f32>>,
    },
    /// A device collective (NCCL) reducing the tensors in place on a comm stream that is
    /// fenced after the compute stream's work.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Device {
        /// The communicator.
        comm: Box<dyn flodl_nccl::Collective>,
        /// The comm stream.
        stream: Stream,
        /// Every rank's step count on the device (one slot per rank).
        meta: Tensor,
        /// Recorded on the compute stream; the comm stream waits for it.
        fence: flodl_tensor::Event,
    },
    /// A collective across processes (MPI) reducing CPU tensors in place on the rank's thread.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Across {
        /// The communicator.
        comm: Box<dyn flodl_nccl::Collective>,
        /// Every rank's step count (one slot per rank).
        meta: Tensor,
    },
}

impl RankComm {
    /// A communicator across processes for CPU tensors, checked to be rank `rank` of a world
    /// of `world` (the cluster identity's).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    fn across(
        comm: Box<dyn flodl_nccl::Collective>,
        rank: usize,
        world: usize,
    ) -> Result<RankComm> {
        if comm.rank() != rank || comm.world_size() != world {
            return Err(ConfigError::unsupported(
                Field::Cluster,
                format!(
                    "the MPI world says rank {} of {}, the cluster identity rank {rank} of \
                     {world}: start the ranks with mpirun (fdl launch --mpi)",
                    comm.rank(),
                    comm.world_size()
                ),
            )
            .into());
        }
        let stream = Stream::cpu_with_threads(1);
        let meta = Tensor::zeros(&[comm.world_size()], flodl_tensor::DType::F32, &stream)?;
        Ok(RankComm::Across { comm, meta })
    }
}

impl std::fmt::Debug for RankComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RankComm::Host { comm, .. } => f.debug_tuple("Host").field(comm).finish(),
            RankComm::Device { comm, .. } => {
                f.debug_struct("Device").field("rank", &comm.rank()).finish_non_exhaustive()
            }
            RankComm::Across { comm, .. } => {
                f.debug_struct("Across").field("rank", &comm.rank()).finish_non_exhaustive()
            }
        }
    }
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
            RankComm::Device { comm, .. } | RankComm::Across { comm, .. } => comm.abort_handle(),
        }
    }

    /// Agrees with every rank on the averaging weights of a reduce in which this rank trained
    /// `steps` batches: every rank's count is gathered (one sum over a slot per rank), then
    /// [`average_weights`] with exponent `gamma` gives `None` when no rank stepped, else this
    /// rank's parameter weight `steps^γ / Σ steps^γ` and buffer weight `1 / ranks that stepped`
    /// (both 0 when it did not step). Every rank computes the same weights from the same counts.
    /// Every rank must call this, then [`reduce`](Self::reduce) identically, for each reduce.
    ///
    /// # Errors
    /// Collective errors (abort, timeout, peer lost, mismatch); [`Error::Logic`] for a bad γ.
    pub(crate) fn weights(&mut self, steps: usize, gamma: f64) -> Result<Option<(f32, f32)>> {
        let (rank, world) = match self {
            RankComm::Host { comm, .. } => (comm.rank(), comm.world_size()),
            RankComm::Device { comm, .. } | RankComm::Across { comm, .. } => {
                (comm.rank(), comm.world_size())
            }
        };
        let mut host = vec![0.0f32; world];
        if let Some(slot) = host.get_mut(rank) {
            // Exact: step counts stay far below 2^24.
            *slot = steps as f32;
        }
        match self {
            RankComm::Host { comm, .. } => comm.all_reduce_sum_f32(&mut [&mut host[..]])?,
            RankComm::Device { comm, stream, meta, .. } => {
                meta.copy_from_host(&host, stream)?;
                comm.all_reduce_sum(&mut [meta], stream)?;
                meta.copy_to_host(&mut host, stream)?;
            }
            RankComm::Across { comm, meta } => {
                let stream = Stream::cpu_with_threads(1);
                meta.copy_from_host(&host, &stream)?;
                comm.all_reduce_sum(&mut [meta], &stream)?;
                meta.copy_to_host(&mut host, &stream)?;
            }
        }
        let all: Vec<u64> = host.iter().map(|&s| s.max(0.0).round() as u64).collect();
        let weights = average_weights(&all, gamma)?;
        Ok(weights.map(|w| {
            (
                w.params.get(rank).copied().unwrap_or(0.0),
                w.buffers.get(rank).copied().unwrap_or(0.0),
            )
        }))
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
            RankComm::Device { comm, stream: comm_stream, fence, .. } => {
                // The comm stream starts after the compute stream's last write; the collective
                // returns once it has finished on the comm stream, so compute may go on after.
                fence.record(stream)?;
                comm_stream.wait_event(fence)?;
                let mut refs: Vec<&mut Tensor> = tensors.iter_mut().collect();
                comm.all_reduce_weighted(&mut refs, weight, comm_stream)?;
                Ok(())
            }
            RankComm::Across { comm, .. } => {
                let mut refs: Vec<&mut Tensor> = tensors.iter_mut().collect();
                comm.all_reduce_weighted(&mut refs, weight, stream)?;
                Ok(())
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

impl RankComm {
    /// The communicator of the host group formed by `survivors` (ranks of this
    /// communicator's group, strictly increasing, this rank included): [`HostComm::shrink`],
    /// which never blocks; every survivor calls this with the same list. A group named by a
    /// relayed id (NCCL, the in-memory engine) is joined afresh instead
    /// ([`CommPlan::relayed`]).
    ///
    /// # Errors
    /// [`Internal::ShrinkNotHost`] when this is no host communicator; collective errors (a bad list).
    pub(crate) fn shrink(
        &self,
        survivors: &[usize],
        timeout: std::time::Duration,
    ) -> Result<RankComm> {
        match self {
            RankComm::Host { comm, .. } => {
                let mut comm = comm.shrink(survivors)?;
                comm.set_timeout(timeout);
                Ok(RankComm::Host { comm, mirrors: Vec::new() })
            }
            _ => Err(Internal::ShrinkNotHost.into()),
        }
    }

    /// Whether a failed reduce may have written part of the tensors (NCCL), so the rank must
    /// restore them; a host collective fails before it writes anything.
    pub(crate) fn writes_partially(&self) -> bool {
        matches!(self, RankComm::Device { .. })
    }

    /// After a failed reduce: waits until the comm stream no longer touches the tensors (an
    /// aborted NCCL group's kernels exit), so they can be restored. Its own error is the
    /// failure already being reported, so it is not returned.
    pub(crate) fn settle(&self) {
        if let RankComm::Device { stream, .. } = self
            && let Err(e) = stream.synchronize()
        {
            tracing::debug!(error = %e, "comm stream after a failed reduce");
        }
    }
}

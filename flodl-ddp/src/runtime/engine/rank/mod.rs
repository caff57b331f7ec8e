//! A rank: its replica, stream, prefetcher, batch buffers and communicator (`Worker`), its
//! loop (`rank_loop.rs`) and its position in the reduce window (`window_state.rs`).

mod attack;
mod emulation;
mod merge;
pub(crate) mod rank_loop;
mod window_state;

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flodl_data::{BatchPicks, CacheReport, Dataset, HostBatch};
use flodl_tensor::{DType, Device, Stream, Tensor, ops};

use crate::contract::capability::TrainerOption;
use crate::contract::evaluation::EvalBatches;
use crate::contract::replica::{Batch, Replica, ReplicaContext};
use crate::contract::requirement::require;
use crate::contract::staging::{device_batch, upload};
use crate::control::breakdown::Activity;
use crate::control::fragment::{Fragments, Piece};
use crate::control::metrics::{EvalMetrics, WorkTally, drain_scalars};
use crate::control::outer::{OuterKind, OuterOptimizer};
use crate::error::Peer;
use crate::link::failure::RankFailure;
use crate::link::wire::{
    CaptureRequest, Chunk, RankCapture, RankRestore, Readiness, Regroup, ToCoordinator, ToWorker,
    Window,
};
use crate::link::{LinkError, RankLink};
use crate::runtime::engine::capture::{host_tensors, outer_state, restore_outer, write_host};
use crate::runtime::engine::comm::{CommPlan, RankComm};
use crate::runtime::engine::divergence::{
    check_loss, check_norm, check_parameters, check_snapshot,
};
use crate::runtime::engine::fault::{Group, Interrupted, is_group_fault};
use crate::runtime::engine::ledger::Ledger;
use crate::runtime::engine::outlets::panic_message;
use crate::runtime::engine::prefetch::ChunkFeeds;
use crate::runtime::engine::run_config::RunConfig;
use crate::runtime::engine::staging::{self, Stager};
use crate::state::HostState;
use crate::{Error, Result};

use emulation::{SlowerDevice, jitter};
use merge::merge_piece;

/// How long a rank waits for a prefetched batch before it services its link.
const PREFETCH_POLL: Duration = Duration::from_millis(50);

/// The epoch permutations a rank is currently reading or staging (at most three at a time).
#[derive(Debug)]
struct Permutations {
    len: usize,
    seed: u64,
    cache: VecDeque<(usize, Vec<usize>)>,
}

impl Permutations {
    fn get(&mut self, epoch: usize) -> &[usize] {
        if let Some(i) = self.cache.iter().position(|(e, _)| *e == epoch) {
            return &self.cache[i].1;
        }
        if self.cache.len() >= 3 {
            self.cache.pop_front();
        }
        let perm = flodl_data::epoch_permutation(self.len, self.seed, epoch as u64);
        self.cache.push_back((epoch, perm));
        self.cache.back().map_or(&[], |(_, p)| p.as_slice())
    }

    /// `epoch`'s permutation when it is computed already (empty otherwise).
    fn peek(&self, epoch: usize) -> &[usize] {
        self.cache.iter().find(|(e, _)| *e == epoch).map_or(&[], |(_, p)| p.as_slice())
    }
}

/// One rank's training state.
pub(crate) struct Worker {
    pub(crate) rank: usize,
    cfg: Arc<RunConfig>,
    stream: Stream,
    replica: Box<dyn Replica>,
    host: HostBatch,
    batch: Batch,
    eval_batches: EvalBatches,
    perms: Permutations,
    /// Where the rank reads its training samples: its staging cache when it stages, else the
    /// training set.
    data: Arc<dyn Dataset>,
    /// The rank's staging cache, when it stages.
    stager: Option<Stager>,
    /// The prefetcher and its chunk feeds, when the rank prefetches.
    feeds: Option<ChunkFeeds>,
    comm: Option<RankComm>,
    /// Collective backend: the parameters before the reduce, kept to measure the divergence
    /// (allocated at the first measured reduce).
    pre_reduce: Vec<Tensor>,
    /// Collective backend: this rank's copy of the outer optimizer.
    outer: OuterOptimizer,
    /// Collective backend on NCCL: the buffers before the reduce, restored when it fails.
    pre_buffers: Vec<Tensor>,
    /// The emulated slower device this rank is made into by its slowdown.
    slower: SlowerDevice,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("rank", &self.rank).finish_non_exhaustive()
    }
}

/// The stream a rank computes on: one thread on a CPU, a new stream on a GPU.
pub(crate) fn rank_stream(device: Device) -> Result<Stream> {
    match device {
        Device::Cpu => Ok(Stream::cpu_with_threads(1)),
        d => Ok(Stream::new(d)?),
    }
}

impl Worker {
    /// Builds rank `rank`'s replica and buffers (on the calling thread).
    pub(crate) fn build(rank: usize, cfg: Arc<RunConfig>, comm: Option<CommPlan>) -> Result<Self> {
        let device = cfg.device(rank);
        let stream = rank_stream(device)?;
        let ctx = ReplicaContext {
            rank,
            world: cfg.world(),
            device,
            stream: stream.clone(),
            batch_size: cfg.spec.batch_size,
            seed: cfg.spec.seed,
        };
        let mut replica = (cfg.factory)(&ctx)?;
        if cfg.spec.max_grad_norm.is_some() {
            require(TrainerOption::MaxGradNorm, replica.as_mut())?;
        }
        if let Some(t) = replica
            .parameters()
            .iter()
            .chain(replica.buffers())
            .find(|t| t.dtype() != DType::F32 || t.device() != device)
        {
            return Err(Error::mismatch(
                "parameters' and buffers' dtype and device",
                format!("f32 on {device}"),
                format!("{:?} on {}", t.dtype(), t.device()),
            ));
        }
        let layout = cfg.dataset.layout().clone();
        let host = HostBatch::new(&layout, device);
        let batch = device_batch(&layout, cfg.spec.batch_size, &stream)?;
        let comm = match comm {
            Some(plan) => Some(plan.join(rank, device, cfg.spec.stall_timeout)?),
            None => None,
        };
        let outer = OuterOptimizer::new(cfg.spec.outer)?;
        let perms =
            Permutations { len: cfg.dataset.len(), seed: cfg.spec.seed, cache: VecDeque::new() };
        let ranks_here = if cfg.own.is_some() { 1 } else { cfg.world() };
        let stager = match cfg.spec.staging.config_for(cfg.dataset.as_ref(), ranks_here) {
            Some(config) => Some(Stager::new(cfg.dataset.clone(), config)?),
            None => None,
        };
        let data = stager.as_ref().map_or_else(|| cfg.dataset.clone(), Stager::dataset);
        let feeds = match cfg.spec.prefetch.depth_on(device) {
            Some(depth) => Some(ChunkFeeds::new(
                data.clone(),
                device,
                depth,
                cfg.spec.seed,
                cfg.spec.stall_timeout,
            )?),
            None => None,
        };
        Ok(Worker {
            rank,
            cfg,
            stream,
            replica,
            host,
            batch,
            eval_batches: EvalBatches::default(),
            perms,
            data,
            stager,
            feeds,
            comm,
            pre_reduce: Vec::new(),
            outer,
            pre_buffers: Vec::new(),
            slower: SlowerDevice::default(),
        })
    }

    /// Shapes of the parameters then the buffers.
    pub(crate) fn shapes(&self) -> Vec<Vec<usize>> {
        self.replica
            .parameters()
            .iter()
            .chain(self.replica.buffers())
            .map(|t| t.shape().to_vec())
            .collect()
    }

    /// The cut of the replica's parameters into `count` fragments (`--fragments`), as the
    /// controller cuts the starting state.
    ///
    /// # Errors
    /// [`crate::LogicError::TooManyFragments`] for more fragments than parameter values.
    pub(crate) fn fragments(&self, count: usize) -> Result<Fragments> {
        let sizes: Vec<usize> = self.replica.parameters().iter().map(Tensor::numel).collect();
        Ok(Fragments::cut(&sizes, count)?)
    }

    /// Advises the rank's staging cache, when it stages, of `chunks` (the coordinator's stage
    /// advisory), skipping the `skip` positions of the first it has already trained.
    pub(crate) fn stage(&mut self, chunks: &[Chunk], skip: usize) {
        if let Some(stager) = &self.stager {
            // Every epoch named is computed first, then read.
            let mut epochs: Vec<usize> = chunks.iter().map(|c| c.epoch).collect();
            epochs.dedup();
            for &e in epochs.iter().take(3) {
                self.perms.get(e);
            }
            let perms = &self.perms;
            stager.advise(chunks, skip, |e| perms.peek(e));
        }
    }

    /// Trains one batch: the picks at `offset..offset + batch_size` of `epoch`'s permutation.
    pub(crate) fn train_batch(
        &mut self,
        epoch: usize,
        offset: usize,
        step: u64,
    ) -> Result<Trained> {
        let bs = self.cfg.spec.batch_size;
        let perm = self.perms.get(epoch);
        let picks = perm.get(offset..offset + bs).ok_or_else(|| {
            Error::protocol(format!("batch at {offset} runs past an epoch of {}", perm.len()))
        })?;
        if let Some(audit) = &self.cfg.audit {
            audit(self.rank, epoch, picks);
        }
        let cache = self.data.fetch_traced(picks, &mut self.host)?;
        upload(&mut self.host, &mut self.batch, &self.stream)?;
        let (loss, ms) = self.train_loaded(step)?;
        Ok(Trained { loss, ms, cache })
    }

    /// Trains batch `index` of `chunk` (`next`: the chunk queued after it, if any), fetched
    /// now or taken from the prefetcher. Returns the loss and the step's time in ms, or `None`
    /// when the rank prefetches and the batch was not ready within a short poll (call again
    /// after servicing the control channel).
    ///
    /// # Errors
    /// As [`train_batch`](Self::train_batch); when prefetching, [`Error::Timeout`] once the
    /// batch has been waited for longer than the stall timeout, the batch's fetch or upload
    /// error, [`Error::Prefetch`] when the prefetcher is out of step.
    pub(crate) fn train_chunk_batch(
        &mut self,
        chunk: Chunk,
        index: usize,
        next: Option<Chunk>,
        step: u64,
    ) -> Result<Option<Trained>> {
        let bs = self.cfg.spec.batch_size;
        let offset = chunk.offset + index * bs;
        let Some(feeds) = self.feeds.as_mut() else {
            return self.train_batch(chunk.epoch, offset, step).map(Some);
        };
        let perms = &mut self.perms;
        let plan = |c: Chunk| chunk_picks(perms, c, bs);
        match next {
            Some(next) => feeds.ensure(&[chunk, next], plan)?,
            None => feeds.ensure(&[chunk], plan)?,
        }
        let Some(mut ready) = feeds.next(chunk, index, PREFETCH_POLL)? else { return Ok(None) };
        if index * bs + bs >= chunk.len {
            feeds.finished(chunk);
        }
        let perm = self.perms.get(chunk.epoch);
        let picks = perm.get(offset..offset + bs).ok_or_else(|| {
            Error::protocol(format!("batch at {offset} runs past an epoch of {}", perm.len()))
        })?;
        if ready.keys().len() != picks.len()
            || ready.keys().iter().zip(picks).any(|(k, &p)| k.sample != p)
        {
            return Err(Error::Prefetch(format!(
                "batch {index} of {chunk:?} holds other samples than its picks"
            )));
        }
        if let Some(audit) = &self.cfg.audit {
            audit(self.rank, chunk.epoch, picks);
        }
        ready.wait(&self.stream)?;
        self.batch.exchange(ready.tensors_mut())?;
        let cache = ready.cache();
        // Hands the previous batch's tensors (trained and synchronized) back for reuse.
        drop(ready);
        let (loss, ms) = self.train_loaded(step)?;
        Ok(Some(Trained { loss, ms, cache }))
    }

    /// Trains the batch in `self.batch` at cohort step `step`: forward, backward, optimizer step,
    /// then the emulated slowdown. Returns the loss and the step's time in ms.
    fn train_loaded(&mut self, step: u64) -> Result<(f32, f64)> {
        let t0 = Instant::now();
        let loss = self.replica.train_step(&self.batch)?;
        check_loss(loss, self.rank, step)?;
        if let Some(max_norm) = self.cfg.spec.max_grad_norm {
            self.clip_gradients(max_norm)?;
        }
        self.replica.step(self.cfg.lr(step))?;
        self.stream.synchronize()?;
        let factor = self.cfg.slowdown(self.rank, step) * jitter(self.rank, step);
        self.slower.hold(t0.elapsed(), factor);
        Ok((loss, t0.elapsed().as_secs_f64() * 1000.0))
    }

    /// Scales the gradients so their global L2 norm is at most `max_norm` (the replica's
    /// gradients were checked when it was built).
    fn clip_gradients(&mut self, max_norm: f32) -> Result<()> {
        let option = TrainerOption::MaxGradNorm;
        let grads = self
            .replica
            .gradients_mut()
            .ok_or(Error::MissingCapability { option, capability: option.needs() })?;
        let mut refs: Vec<&mut Tensor> = grads.iter_mut().collect();
        ops::clip_global_norm(&mut refs, max_norm, &self.stream)?;
        Ok(())
    }

    /// The parameters and buffers, copied to the host (brought up to date by the replica
    /// first).
    pub(crate) fn snapshot(&mut self) -> Result<HostState> {
        self.replica.export_parameters()?;
        let read = |ts: &[Tensor]| -> Result<Vec<Vec<f32>>> {
            ts.iter().map(|t| Ok(t.to_vec::<f32>(&self.stream)?)).collect()
        };
        Ok(HostState {
            params: read(self.replica.parameters())?,
            buffers: read(self.replica.buffers())?,
        })
    }

    /// The values of `pieces` of the parameters (one vector per piece, in order: a fragment's
    /// part, as [`Fragments::part`] cuts it from a whole snapshot) and every buffer, copied to
    /// the host. Only the pieces are read where the tensors are in host memory; a device
    /// tensor is read whole and its run kept.
    ///
    /// # Errors
    /// [`Error::Mismatch`](crate::Error) when a piece does not fit the replica; a tensor
    /// operation's error.
    pub(crate) fn snapshot_part(&mut self, pieces: &[Piece]) -> Result<HostState> {
        self.replica.export_parameters()?;
        let tensors = self.replica.parameters();
        let params = pieces
            .iter()
            .map(|p| {
                let t = tensors.get(p.tensor).filter(|t| p.start + p.len <= t.numel());
                let Some(t) = t else {
                    let size = tensors.get(p.tensor).map_or(0, Tensor::numel);
                    return Err(Error::mismatch("a fragment's piece", size, p.start + p.len));
                };
                Ok(match t.as_slice::<f32>() {
                    Ok(values) => values[p.range()].to_vec(),
                    Err(_) => t.to_vec::<f32>(&self.stream)?[p.range()].to_vec(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let buffers = self.replica.buffers().iter();
        let buffers = buffers.map(|t| Ok(t.to_vec::<f32>(&self.stream)?)).collect::<Result<_>>()?;
        Ok(HostState { params, buffers })
    }

    /// Overwrites the parameters and buffers with `state`.
    pub(crate) fn load(&mut self, state: &HostState) -> Result<()> {
        let stream = self.stream.clone();
        let write = |ts: &mut [Tensor], vs: &[Vec<f32>]| -> Result<()> {
            if ts.len() != vs.len() {
                return Err(Error::mismatch(
                    "tensors of a state to load",
                    format!("{} (the replica's)", ts.len()),
                    vs.len(),
                ));
            }
            for (t, v) in ts.iter_mut().zip(vs) {
                t.copy_from_host(v, &stream)?;
            }
            Ok(())
        };
        write(self.replica.parameters_mut(), &state.params)?;
        write(self.replica.buffers_mut(), &state.buffers)?;
        self.replica.import_parameters()
    }

    /// Host backend: takes the round's average into each parameter by [`merge_piece`]: with
    /// `sent` (the parameters of the rank's snapshot), `now + μ·(average − sent)`, μ = `blend`
    /// or 1 (the rank keeps what it trained since its snapshot); otherwise the average or,
    /// under EASGD (`blend` = α), a pull towards it by α. Buffers become the average's. An
    /// outer optimizer that resets inner state resets it. With `pieces` (a fragment's,
    /// `--fragments`), the average and `sent` hold those runs of values only, in that order,
    /// and every other value is left as it is.
    pub(crate) fn take_average(
        &mut self,
        avg: &HostState,
        sent: Option<&[Vec<f32>]>,
        blend: Option<f32>,
        pieces: Option<&[Piece]>,
    ) -> Result<()> {
        let stream = self.stream.clone();
        // The average is shifted by what the rank trained since its snapshot: read it now.
        self.replica.export_parameters()?;
        let params = self.replica.parameters_mut();
        let all: Vec<Piece>;
        let index = match pieces {
            Some(p) => p,
            None => {
                all = params.iter().enumerate().map(|(t, p)| Piece::whole(t, p.numel())).collect();
                &all
            }
        };
        if index.len() != avg.params.len()
            || index.iter().any(|p| p.tensor >= params.len())
            || sent.is_some_and(|s| s.len() != index.len())
        {
            return Err(Error::mismatch(
                "parameters of an averaged state",
                format!("{} (the replica's {})", index.len(), params.len()),
                format!("{} averaged, {:?} sent", avg.params.len(), sent.map(|s| s.len())),
            ));
        }
        for (i, piece) in index.iter().enumerate() {
            let sent = sent.map(|s| s[i].as_slice());
            merge_piece(&mut params[piece.tensor], piece, &avg.params[i], sent, blend, &stream)?;
        }
        let buffers = self.replica.buffers_mut();
        if buffers.len() != avg.buffers.len() {
            return Err(Error::mismatch(
                "buffers of an averaged state",
                format!("{} (the replica's)", buffers.len()),
                avg.buffers.len(),
            ));
        }
        for (t, a) in buffers.iter_mut().zip(&avg.buffers) {
            t.copy_from_host(a, &stream)?;
        }
        if self.outer.resets_inner_state() {
            self.replica.reset_optimizer(&stream)?;
        }
        self.replica.import_parameters()
    }

    /// Builds the communicator of the next group, of `size` members, this rank being the
    /// `me`-th: a group named by a relayed id (NCCL, the in-memory engine) is joined afresh,
    /// the old one aborted (it may still hold a collective that never completes); a host group
    /// shrinks to the members at `positions` of the current one. A rank without a
    /// communicator (host backend) has nothing to shrink.
    fn regroup_comm(
        &mut self,
        positions: Option<&[usize]>,
        size: usize,
        me: usize,
        how: &Regroup,
    ) -> Result<()> {
        let device = self.cfg.device(self.rank);
        let timeout = self.cfg.comm_timeout();
        if let Some(plan) = CommPlan::relayed(how, size) {
            if let Some(old) = self.comm.take() {
                old.abort_handle().abort();
            }
            self.comm = Some(plan.join(me, device, timeout)?);
            return Ok(());
        }
        if let (Some(comm), Some(positions)) = (self.comm.as_ref(), positions) {
            self.comm = Some(comm.shrink(positions, timeout)?);
        }
        Ok(())
    }

    /// The id of a new collective group this rank is the lowest member of (a run whose ranks
    /// have seats of their own): a fresh NCCL unique id on a GPU rank, a fresh key of this
    /// process's host groups under the in-memory engine.
    ///
    /// # Errors
    /// NCCL errors (library missing); [`Error::Protocol`] when the run's groups are not
    /// formed through the controller.
    pub(crate) fn make_group_id(&self) -> Result<Regroup> {
        if self.cfg.spec.collective_engine() == Some(crate::CollectiveEngine::InMemory) {
            return Ok(Regroup::InMemory(crate::runtime::engine::host_groups::fresh_key()));
        }
        #[cfg(feature = "cuda")]
        if matches!(self.cfg.device(self.rank), Device::Cuda(_)) {
            return Ok(Regroup::Nccl(flodl_nccl::UniqueId::new()?));
        }
        Err(Error::protocol("asked for a group id in a run whose groups need none"))
    }

    /// Averages with the other ranks through the collective; returns the time it took in ms
    /// and, when the run measures it and this rank stepped, its divergence
    /// `‖W_pre − W_post‖ / ‖W_post‖` (from a pre-reduce copy of the parameters).
    pub(crate) fn all_reduce(&mut self, steps: usize) -> Result<Reduced> {
        let t0 = Instant::now();
        let Some(comm) = self.comm.as_mut() else {
            return Err(Error::NoCommunicator);
        };
        self.stream.synchronize()?;
        // Before the group meets: a replica whose model lives elsewhere copies it in now.
        self.replica.export_parameters()?;
        let (mut divergence, mut norm) = (None, None);
        if let Some((wp, wb)) = comm.weights(steps, self.cfg.spec.gamma)? {
            let measure = self.cfg.measures_divergence() && wp > 0.0;
            // What a failed collective may leave written: NCCL anything; the host collective
            // nothing of the failed operation, but the parameters when the buffers' fails.
            let partial = comm.writes_partially();
            let restore = partial || !self.replica.buffers().is_empty();
            if measure || restore {
                keep_copy(&mut self.pre_reduce, self.replica.parameters(), &self.stream)?;
            }
            if partial {
                keep_copy(&mut self.pre_buffers, self.replica.buffers(), &self.stream)?;
            }
            let mut reduced = comm.reduce(self.replica.parameters_mut(), wp, &self.stream);
            if reduced.is_ok() && !self.replica.buffers().is_empty() {
                reduced = comm.reduce(self.replica.buffers_mut(), wb, &self.stream);
            }
            if let Err(e) = reduced {
                // The state before the reduce, so the survivors can redo it.
                comm.settle();
                if restore {
                    put_back(self.replica.parameters_mut(), &self.pre_reduce, &self.stream)?;
                }
                if partial {
                    put_back(self.replica.buffers_mut(), &self.pre_buffers, &self.stream)?;
                }
                return Err(e);
            }
            if measure {
                let (d, post) =
                    divergence_of(&self.pre_reduce, self.replica.parameters(), &self.stream)?;
                divergence = Some(d);
                // Plain averaging leaves the parameters as measured: their norm is the check.
                norm = matches!(self.outer.kind(), OuterKind::Average).then_some(post);
            }
            // A round with movers: the outer step, identical on every rank.
            self.outer.step(self.replica.parameters_mut(), &self.stream)?;
            if self.outer.resets_inner_state() {
                self.replica.reset_optimizer(&self.stream)?;
            }
            self.replica.import_parameters()?;
        }
        Ok(Reduced { sync_ms: t0.elapsed().as_secs_f64() * 1000.0, divergence, norm })
    }

    /// This rank's checkpoint part: its optimizer state, its position, and the model with the
    /// outer optimizer when `request.model`.
    pub(crate) fn capture(
        &mut self,
        request: CaptureRequest,
        position: Option<(Chunk, usize)>,
    ) -> Result<RankCapture> {
        let (model, outer) = if request.model {
            (Some(self.snapshot()?), outer_state(&self.outer, &self.stream)?)
        } else {
            (None, None)
        };
        Ok(RankCapture {
            optimizer: host_tensors(self.replica.optimizer_state(), &self.stream)?,
            optimizer_steps: self.replica.optimizer_steps(),
            model,
            outer,
            position,
        })
    }

    /// Restores the optimizer and outer-optimizer state of a resumed checkpoint.
    pub(crate) fn restore(&mut self, restore: &RankRestore) -> Result<()> {
        let stream = self.stream.clone();
        if !restore.optimizer.is_empty() {
            write_host(
                "optimizer",
                self.replica.optimizer_state_mut(),
                &restore.optimizer,
                &stream,
            )?;
        }
        self.replica.set_optimizer_steps(restore.optimizer_steps);
        if let Some(outer) = &restore.outer {
            restore_outer(&mut self.outer, outer, &stream)?;
        }
        Ok(())
    }

    /// Evaluates the test dataset, when there is one and the replica supports it.
    pub(crate) fn evaluate(&mut self) -> Result<Option<EvalMetrics>> {
        let Some(test) = self.cfg.test.clone() else { return Ok(None) };
        let bs = self.cfg.spec.batch_size;
        self.eval_batches.evaluate(self.replica.as_mut(), test.as_ref(), bs, &self.stream)
    }
}

/// Makes `copy` an exact copy of `tensors` (allocated on first use or when the count changes).
fn keep_copy(copy: &mut Vec<Tensor>, tensors: &[Tensor], stream: &Stream) -> Result<()> {
    if copy.len() != tensors.len() {
        *copy = tensors.iter().map(|t| t.try_clone(stream)).collect::<flodl_tensor::Result<_>>()?;
    } else {
        for (c, t) in copy.iter_mut().zip(tensors) {
            c.copy_from(t, stream)?;
        }
    }
    Ok(())
}

/// Overwrites `tensors` with the copy [`keep_copy`] made of them.
fn put_back(tensors: &mut [Tensor], copy: &[Tensor], stream: &Stream) -> Result<()> {
    if copy.len() != tensors.len() {
        return Err(Error::mismatch(
            "tensors of the pre-reduce copy",
            format!("{} (the replica's)", tensors.len()),
            copy.len(),
        ));
    }
    for (t, c) in tensors.iter_mut().zip(copy) {
        t.copy_from(c, stream)?;
    }
    Ok(())
}

/// `‖pre − post‖ / ‖post‖` over a list of tensors, and `‖post‖`.
fn divergence_of(pre: &[Tensor], post: &[Tensor], stream: &Stream) -> Result<(f64, f64)> {
    let mut diff_sq = 0.0;
    for (a, b) in pre.iter().zip(post) {
        let d = ops::l2_norm_diff(a, b, stream)?;
        diff_sq += d * d;
    }
    let refs: Vec<&Tensor> = post.iter().collect();
    let post_norm = ops::global_l2_norm(&refs, stream)?;
    Ok((crate::control::guard::divergence(diff_sq.sqrt(), post_norm), post_norm))
}

/// What a rank's collective all-reduce gives back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reduced {
    /// The reduce's wall time in ms.
    pub(crate) sync_ms: f64,
    /// The rank's divergence, when the run measures it and the rank stepped.
    pub(crate) divergence: Option<f64>,
    /// The parameters' global L2 norm as left by the reduce, when it was computed on the way
    /// (a measured reduce under plain averaging): their finiteness check, without another pass.
    pub(crate) norm: Option<f64>,
}

/// One trained batch: its loss, its step's time in ms (emulated slowdown included) and, when the
/// rank stages, where its samples came from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Trained {
    pub(crate) loss: f32,
    pub(crate) ms: f64,
    pub(crate) cache: Option<CacheReport>,
}

/// The batches of `chunk`: consecutive `batch_size` slices of its epoch's permutation from its
/// offset, as many as the rank trains for it (the same picks [`Worker::train_batch`] takes).
fn chunk_picks(perms: &mut Permutations, chunk: Chunk, bs: usize) -> Result<Vec<BatchPicks>> {
    let perm = perms.get(chunk.epoch);
    let end = chunk.offset + chunk.len.div_ceil(bs) * bs;
    let picks = perm.get(chunk.offset..end).ok_or_else(|| {
        Error::protocol(format!("{chunk:?} runs past an epoch of {}", perm.len()))
    })?;
    Ok(picks.chunks_exact(bs).map(|p| BatchPicks { picks: p.to_vec(), valid: p.len() }).collect())
}

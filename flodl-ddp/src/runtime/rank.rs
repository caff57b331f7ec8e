//! A rank: its replica, stream, prefetcher, batch buffers and communicator, and its loop.

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
use crate::control::metrics::{EvalMetrics, WorkTally, drain_scalars};
use crate::control::outer::{OuterKind, OuterOptimizer, easgd_blend};
use crate::error::Peer;
use crate::link::failure::RankFailure;
use crate::link::wire::{
    CaptureRequest, Chunk, RankCapture, RankRestore, Readiness, Regroup, ToCoordinator, ToWorker,
    Window,
};
use crate::link::{LinkError, RankLink};
use crate::runtime::capture::{host_tensors, outer_state, restore_outer, write_host};
use crate::runtime::comm::{CommPlan, RankComm};
use crate::runtime::divergence::{check_loss, check_norm, check_parameters, check_snapshot};
use crate::runtime::fault::{Group, Interrupted, is_group_fault};
use crate::runtime::handle::panic_message;
use crate::runtime::ledger::Ledger;
use crate::runtime::prefetch::ChunkFeeds;
use crate::runtime::staging::{self, Stager};
use crate::runtime::trainer::RunConfig;
use crate::state::HostState;
use crate::{Error, Result};

/// How long a rank waits for a prefetched batch before it services its link.
const PREFETCH_POLL: Duration = Duration::from_millis(50);

/// Below this, a slowdown wait spins: a sleep overshoots by tens of microseconds.
const SPIN_BELOW: Duration = Duration::from_micros(300);

/// Holds the rank for `d`, the extra time an emulated slower device would have spent: sleeps
/// (freeing the core, as a busy accelerator would) and spins only the last stretch, so short
/// steps are slowed by the right factor.
fn emulate_slower_device(d: Duration) {
    let end = Instant::now() + d;
    if d > SPIN_BELOW {
        std::thread::sleep(d - SPIN_BELOW / 2);
    }
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

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
        let factor = self.cfg.slowdown(self.rank);
        if factor > 1.0 {
            emulate_slower_device(t0.elapsed().mul_f64(factor - 1.0));
        }
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

    /// Host backend: takes the round's average. Each parameter becomes the average shifted by
    /// what the rank trained since its snapshot (`average + (now − sent)` when `sent` is
    /// given), or, under EASGD (`blend` = α), is pulled towards that target by α; buffers
    /// become the average's. An outer optimizer that resets inner state resets it.
    pub(crate) fn take_average(
        &mut self,
        avg: &HostState,
        sent: Option<&[Vec<f32>]>,
        blend: Option<f32>,
    ) -> Result<()> {
        let stream = self.stream.clone();
        // The average is shifted by what the rank trained since its snapshot: read it now.
        self.replica.export_parameters()?;
        let params = self.replica.parameters_mut();
        if params.len() != avg.params.len() || sent.is_some_and(|s| s.len() != params.len()) {
            return Err(Error::mismatch(
                "parameters of an averaged state",
                format!("{} (the replica's)", params.len()),
                format!("{} averaged, {:?} sent", avg.params.len(), sent.map(|s| s.len())),
            ));
        }
        for (i, t) in params.iter_mut().enumerate() {
            let a = &avg.params[i];
            if a.len() != t.numel() {
                return Err(Error::mismatch("an averaged tensor's size", t.numel(), a.len()));
            }
            let shifted = match sent {
                Some(sent) => {
                    let now = t.to_vec::<f32>(&stream)?;
                    if now.len() != sent[i].len() {
                        return Err(Error::mismatch(
                            "a tensor's size since its snapshot",
                            sent[i].len(),
                            now.len(),
                        ));
                    }
                    Some(
                        now.iter()
                            .zip(a)
                            .zip(&sent[i])
                            .map(|((x, a), s)| a + (x - s))
                            .collect::<Vec<f32>>(),
                    )
                }
                None => None,
            };
            let target: &[f32] = shifted.as_deref().unwrap_or(a);
            match blend {
                Some(alpha) => {
                    let target = Tensor::from_slice(target, t.shape(), &stream)?;
                    easgd_blend(
                        std::slice::from_mut(t),
                        std::slice::from_ref(&target),
                        alpha,
                        &stream,
                    )?;
                }
                None => t.copy_from_host(target, &stream)?,
            }
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
            return Ok(Regroup::InMemory(crate::runtime::host_groups::fresh_key()));
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

/// Sends `msg` to the coordinator over `link` (waiting at most `wait` for room), noting when in
/// `last_sent`.
fn send_on(
    link: &dyn RankLink,
    last_sent: &Cell<Instant>,
    msg: ToCoordinator,
    wait: Duration,
) -> Result<()> {
    last_sent.set(Instant::now());
    link.send(msg, wait).map_err(|e| match e {
        LinkError::Timeout(after) => Error::Timeout { what: "room on the link", after },
        LinkError::Gone | LinkError::Full => Error::PeerGone(Peer::Coordinator),
    })
}

/// Tells the coordinator over `link` that `rank` is alive when it has sent nothing for `beat`.
fn heartbeat_on(
    link: &dyn RankLink,
    rank: usize,
    last_sent: &Cell<Instant>,
    beat: Duration,
    wait: Duration,
) -> Result<()> {
    if last_sent.get().elapsed() >= beat {
        send_on(link, last_sent, ToCoordinator::Alive { rank }, wait)?;
    }
    Ok(())
}

/// The coordinator's next message to `rank` over `link`, waited for up to `stall`, saying the
/// rank is alive whenever it has been quiet for `beat`: before every wait, not only after one
/// that timed out. The coordinator pings a rank it has not written to for a beat, which is
/// about when the rank's beat falls due: a ping that lands first, turn after turn (a loaded
/// machine wakes the rank late, to find it queued), would otherwise keep the rank quiet until
/// the watchdog declares it dead.
fn wait_on(
    link: &dyn RankLink,
    rank: usize,
    last_sent: &Cell<Instant>,
    beat: Duration,
    stall: Duration,
) -> Result<ToWorker> {
    let deadline = Instant::now() + stall;
    loop {
        heartbeat_on(link, rank, last_sent, beat, stall)?;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout { what: "a message from the coordinator", after: stall });
        }
        match link.recv(beat.min(left)) {
            Ok(msg) => return Ok(msg),
            Err(LinkError::Timeout(_) | LinkError::Full) => {}
            Err(LinkError::Gone) => return Err(Error::PeerGone(Peer::Coordinator)),
        }
    }
}

/// What a rank's loop does after handling a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Exit,
}

/// The chunk a rank is working through.
#[derive(Debug)]
struct Current {
    chunk: Chunk,
    done: usize,
    work: WorkTally,
}

/// What a rank's last host snapshot carried, while the round that averages it runs.
#[derive(Debug)]
struct Sent {
    /// Steps and ms of the window at the snapshot.
    steps: usize,
    wall_ms: f64,
    /// The parameters it sent, kept when the rank may train on before the update (`Async`).
    params: Option<Vec<Vec<f32>>>,
}

/// A rank's position in its reduce window.
#[derive(Debug)]
struct WindowState {
    window: Window,
    steps: usize,
    /// Time in training calls (steps with their batches' fetch and upload): the window's pace.
    wall_ms: f64,
    /// When the window opened, and the training ms carried into it from before.
    opened: Instant,
    carried_ms: f64,
    reported: Option<Readiness>,
    /// Host backend: the snapshot taken for the pending round.
    sent: Option<Sent>,
}

impl WindowState {
    /// The start of `window`, with `carried` steps and ms already in it.
    fn new(window: Window, carried: (usize, f64)) -> WindowState {
        WindowState {
            window,
            steps: carried.0,
            wall_ms: carried.1,
            opened: Instant::now(),
            carried_ms: carried.1,
            reported: None,
            sent: None,
        }
    }

    /// Whether the window is reached: by its count, or once its clock — the wall time since
    /// it opened (plus what was carried in) — reaches the window's wall time.
    ///
    /// The clock is the rank's wall time, not its time in training calls: everything else the
    /// rank did meanwhile (an evaluation, a checkpoint part, its loop, a descheduled moment)
    /// delays it as much as a step would, and the anchor, whose window is that wall time
    /// measured in its own steps, would otherwise wait for this rank at every reduce.
    fn is_reached(&self) -> bool {
        let clock_ms = self.carried_ms + self.opened.elapsed().as_secs_f64() * 1000.0;
        self.window.is_reached(self.steps, clock_ms)
    }
}

/// Where a rank's loop stands.
#[derive(Debug)]
enum Stage {
    /// Waiting for the initial weights.
    Starting,
    /// Training its window.
    Training,
    /// Captured for a checkpoint: trains nothing until the coordinator lets it go.
    Paused,
    /// Its group broke inside a reduce: waits for the regroup that redoes it.
    Interrupted(Interrupted),
}

/// A rank's side of the run: trains the chunks it is given and takes part in reduces, talking
/// to the coordinator only through its link.
pub(crate) struct RankLoop<'a> {
    worker: Worker,
    cfg: Arc<RunConfig>,
    link: &'a dyn RankLink,
    stage: Stage,
    queue: VecDeque<Chunk>,
    current: Option<Current>,
    win: WindowState,
    /// Chunks received so far (an `Idle` report names it, so a stale one is recognised).
    works: u64,
    last_sent: Cell<Instant>,
    /// Batches of all ranks up to the last reduce (what the schedule is indexed by).
    global_step: u64,
    /// Collective backend: the rank's current group.
    group: Group,
    /// Where the rank's time went since its last chunk report (sent with the next one).
    ledger: Ledger,
    /// The latest window whose anchor is ready ([`ToWorker::Due`]).
    due: Option<u64>,
}

impl std::fmt::Debug for RankLoop<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankLoop")
            .field("rank", &self.worker.rank)
            .field("stage", &self.stage)
            .finish_non_exhaustive()
    }
}

/// A rank's thread: builds the worker, runs its loop over `link`, and reports a failure before
/// letting go of the communicator and the link (so the coordinator reads the cause before it
/// sees the rank gone). Returns the rank's failure, if any (a rank in its own process exits
/// with it).
pub(crate) fn run_rank(
    rank: usize,
    cfg: Arc<RunConfig>,
    comm: Option<CommPlan>,
    link: &dyn RankLink,
    first: Window,
) -> std::result::Result<(), RankFailure> {
    let wait = cfg.spec.stall_timeout;
    let outcome = catch_unwind(AssertUnwindSafe(|| match Worker::build(rank, cfg, comm) {
        Ok(worker) => {
            let mut lp = RankLoop::new(worker, link, first);
            let r = lp.run();
            (r, Some(lp))
        }
        Err(e) => (Err(e), None),
    }));
    let failure = match &outcome {
        Ok((Ok(()), _)) => return Ok(()),
        Ok((Err(e @ Error::Diverged { rank, step, cause, .. }), _)) => {
            // No fault of the rank: the coordinator stops the run (see `Error::Diverged`).
            let msg = ToCoordinator::Diverged { rank: *rank, step: *step, cause: *cause };
            let _ = link.send(msg, wait);
            return Err(RankFailure::from(e));
        }
        Ok((Err(e), _)) => RankFailure::from(e),
        Err(p) => RankFailure::panicked(panic_message(p.as_ref())),
    };
    let _ = link.send(ToCoordinator::Failed { rank, failure: failure.clone() }, wait);
    drop(outcome);
    Err(failure)
}

impl<'a> RankLoop<'a> {
    /// A loop for `worker` over `link`, starting in the window `first`.
    pub(crate) fn new(worker: Worker, link: &'a dyn RankLink, first: Window) -> Self {
        let cfg = worker.cfg.clone();
        // Rank 0's replica is the initial state, unless a checkpoint is resumed.
        let stage = if worker.rank == 0 && cfg.resume.is_none() {
            Stage::Training
        } else {
            Stage::Starting
        };
        let group = Group::new(cfg.world());
        RankLoop {
            worker,
            cfg,
            link,
            stage,
            queue: VecDeque::new(),
            current: None,
            win: WindowState::new(first, (0, 0.0)),
            works: 0,
            last_sent: Cell::new(Instant::now()),
            global_step: 0,
            group,
            ledger: Ledger::default(),
            due: None,
        }
    }

    fn send(&self, msg: ToCoordinator) -> Result<()> {
        send_on(self.link, &self.last_sent, msg, self.cfg.spec.stall_timeout)
    }

    /// Runs until the coordinator says finish or stop.
    pub(crate) fn run(&mut self) -> Result<()> {
        let rank = self.worker.rank;
        let initial = if rank == 0 { Some(self.worker.snapshot()?) } else { None };
        self.send(ToCoordinator::Ready { rank, shapes: self.worker.shapes(), initial })?;
        self.announce_group()?;
        loop {
            while let Some(msg) =
                self.link.try_recv().map_err(|_| Error::PeerGone(Peer::Coordinator))?
            {
                if self.handle(msg)? == Flow::Exit {
                    return Ok(());
                }
            }
            let training = matches!(self.stage, Stage::Training);
            if training && self.win.steps < self.win.window.limit && self.has_work() {
                self.train_one()?;
                continue;
            }
            if training && !self.has_work() && self.win.reported.is_none() {
                self.report(Readiness::Idle)?;
            }
            let waiting = self.waiting_for();
            let t = Instant::now();
            let msg = self.wait()?;
            self.ledger.charge(waiting, t);
            if self.handle(msg)? == Flow::Exit {
                return Ok(());
            }
        }
    }

    /// What a wait for the coordinator's next message counts as: the checkpoint while paused
    /// for one, the reduce while a host snapshot is out or a broken reduce waits for its
    /// regroup, waiting otherwise.
    fn waiting_for(&self) -> Activity {
        match self.stage {
            Stage::Paused => Activity::Checkpoint,
            Stage::Interrupted(_) => Activity::Reduce,
            _ if self.win.sent.is_some() => Activity::Reduce,
            _ => Activity::Waiting,
        }
    }

    fn has_work(&self) -> bool {
        self.current.is_some() || !self.queue.is_empty()
    }

    /// Waits for the next message, up to the stall timeout, saying it is alive meanwhile.
    fn wait(&self) -> Result<ToWorker> {
        let (beat, stall) = (self.cfg.heartbeat(), self.cfg.spec.stall_timeout);
        wait_on(self.link, self.worker.rank, &self.last_sent, beat, stall)
    }

    /// Tells the coordinator this rank is alive when it has been quiet for a while.
    fn heartbeat(&self) -> Result<()> {
        let (beat, stall) = (self.cfg.heartbeat(), self.cfg.spec.stall_timeout);
        heartbeat_on(self.link, self.worker.rank, &self.last_sent, beat, stall)
    }

    fn report(&mut self, why: Readiness) -> Result<()> {
        self.win.reported = Some(why);
        self.send(ToCoordinator::Progress {
            rank: self.worker.rank,
            round: self.win.window.round,
            steps: self.win.steps,
            wall_ms: self.win.wall_ms,
            why,
            works: self.works,
        })
    }

    fn train_one(&mut self) -> Result<()> {
        if self.current.is_none() {
            let Some(chunk) = self.queue.pop_front() else { return Ok(()) };
            self.current = Some(Current { chunk, done: 0, work: WorkTally::default() });
        }
        let Some(cur) = self.current.as_mut() else { return Ok(()) };
        let bs = self.cfg.spec.batch_size;
        let step = self.global_step + self.win.steps as u64;
        let next = self.queue.front().copied();
        let t = Instant::now();
        let trained = self.worker.train_chunk_batch(cur.chunk, cur.done, next, step)?;
        // The call's time beyond the training step went to the batch's fetch and upload.
        let call_ms = t.elapsed().as_secs_f64() * 1000.0;
        let compute_ms = trained.map_or(0.0, |t| t.ms);
        self.ledger.charge_ms(Activity::Compute, compute_ms);
        self.ledger.charge_ms(Activity::Data, call_ms - compute_ms);
        // The window's pace is the whole call, the batch's fetch and upload with its step: a
        // pace of compute alone gives a rank that fetches on its critical path more batches
        // than it trains in the anchor's time, and the anchor waits for it at every reduce.
        self.win.wall_ms += call_ms;
        let Some(Trained { loss, ms, cache }) = trained else {
            // A prefetched batch not ready yet: the run loop services the link and comes back.
            return self.heartbeat();
        };
        staging::tally(&mut cur.work.cache, cache);
        cur.done += 1;
        cur.work.batches += 1;
        cur.work.samples += bs;
        cur.work.loss_sum += f64::from(loss);
        cur.work.compute_ms += ms;
        if cur.done * bs >= cur.chunk.len
            && let Some(mut cur) = self.current.take()
        {
            cur.work.scalars = drain_scalars();
            cur.work.time = self.ledger.close();
            let rank = self.worker.rank;
            self.send(ToCoordinator::ChunkDone { rank, chunk: cur.chunk, work: cur.work.into() })?;
        }
        self.win.steps += 1;
        if self.win.reported.is_none() && self.win.is_reached() {
            self.report(Readiness::Reached)?;
        }
        self.heartbeat()
    }

    /// Starts the window `next` after a reduce; `carried` steps and ms stay in it.
    fn start_window(&mut self, next: Window, carried: (usize, f64)) -> Result<()> {
        self.win = WindowState::new(next, carried);
        if self.win.is_reached() {
            self.report(Readiness::Reached)?;
        }
        self.follow_due()
    }

    /// The anchor is ready for the reduce of `round` (which may be a window this rank has not
    /// started: the order can overtake the update that starts it in cluster mode, on another
    /// lane).
    fn due(&mut self, round: u64) -> Result<()> {
        self.due = self.due.max(Some(round));
        self.follow_due()
    }

    /// A rank training the window whose anchor is ready, not reported yet, reports where it
    /// stands and trains no more before the reduce than its overshoot.
    fn follow_due(&mut self) -> Result<()> {
        let training = matches!(self.stage, Stage::Training);
        if !training || self.due != Some(self.win.window.round) || self.win.reported.is_some() {
            return Ok(());
        }
        self.win.window = self.win.window.ended_at(self.win.steps);
        self.report(Readiness::Reached)
    }

    fn evaluate_for(&mut self, epoch: Option<usize>) -> Result<()> {
        if let Some(epoch) = epoch {
            let t = Instant::now();
            let eval = self.worker.evaluate();
            self.ledger.charge(Activity::Evaluation, t);
            let eval = eval?;
            self.send(ToCoordinator::Evaluated { rank: self.worker.rank, epoch, eval })?;
        }
        Ok(())
    }

    /// The chunk in training and how many of its batches are done.
    fn position(&self) -> Option<(Chunk, usize)> {
        self.current.as_ref().map(|c| (c.chunk, c.done))
    }

    /// This rank's checkpoint part, when one is asked for; the rank then pauses.
    fn capture(&mut self, request: Option<CaptureRequest>) -> Result<Option<Box<RankCapture>>> {
        let Some(request) = request else { return Ok(None) };
        self.stage = Stage::Paused;
        let t = Instant::now();
        let position = self.position();
        let part = self.worker.capture(request, position);
        self.ledger.charge(Activity::Checkpoint, t);
        Ok(Some(Box::new(part?)))
    }

    fn handle(&mut self, msg: ToWorker) -> Result<Flow> {
        let rank = self.worker.rank;
        match msg {
            ToWorker::Init { state, restore, window, global_step } => {
                self.win = WindowState::new(window, (0, 0.0));
                self.ledger.start();
                self.worker.load(&state)?;
                self.global_step = global_step;
                if let Some(restore) = restore {
                    self.worker.restore(&restore)?;
                    self.global_step = restore.global_step;
                }
                self.stage = Stage::Training;
            }
            ToWorker::Join { window, global_step } => {
                // Nothing to train until the reduce that brings the consensus: its window
                // allows no step, so this rank weighs nothing in that reduce.
                self.win = WindowState::new(window, (0, 0.0));
                self.ledger.start();
                self.global_step = global_step;
                self.stage = Stage::Training;
            }
            ToWorker::Resume => {
                if matches!(self.stage, Stage::Paused) {
                    self.stage = Stage::Training;
                    self.follow_due()?;
                }
            }
            ToWorker::Stage { chunks } => {
                let skip = match (&self.current, chunks.first()) {
                    (Some(cur), Some(first)) if cur.chunk == *first => {
                        cur.done * self.cfg.spec.batch_size
                    }
                    _ => 0,
                };
                self.worker.stage(&chunks, skip);
            }
            ToWorker::Work(chunk) => {
                self.ledger.start();
                self.queue.push_back(chunk);
                self.works += 1;
                if self.win.reported == Some(Readiness::Idle) {
                    self.win.reported = None;
                }
            }
            ToWorker::Reduce { next, eval, global_step, capture } => {
                self.reduce(Interrupted { next, eval, global_step, capture })?;
            }
            ToWorker::Due { round } => self.due(round)?,
            ToWorker::Snapshot { round, attempt, capture } => {
                let t = Instant::now();
                let state = self.worker.snapshot()?;
                let step = self.global_step + self.win.steps as u64;
                check_snapshot(&state, rank, step)?;
                self.ledger.charge(Activity::Reduce, t);
                let capture = self.capture(capture)?;
                // The parameters are kept to carry over what the rank trains while the round
                // runs (`Async` only: under `Sync` and `Cadence` it waits at its window's end).
                let params = (self.win.steps < self.win.window.limit).then(|| state.params.clone());
                self.win.sent =
                    Some(Sent { steps: self.win.steps, wall_ms: self.win.wall_ms, params });
                self.send(ToCoordinator::Snapshot {
                    rank,
                    round,
                    attempt,
                    state,
                    steps: self.win.steps,
                    capture,
                })?;
            }
            ToWorker::Update { state, next, eval, global_step } => {
                self.global_step = global_step;
                if matches!(self.stage, Stage::Paused) {
                    self.stage = Stage::Training;
                }
                let sent = self.win.sent.take();
                let (s, w) = sent
                    .as_ref()
                    .map_or((self.win.steps, self.win.wall_ms), |s| (s.steps, s.wall_ms));
                let carried = (self.win.steps.saturating_sub(s), (self.win.wall_ms - w).max(0.0));
                // Steps trained since the snapshot stay: average + (now − snapshot).
                let params = sent.and_then(|s| s.params).filter(|_| carried.0 > 0);
                let t = Instant::now();
                self.worker.take_average(&state, params.as_deref(), self.cfg.spec.easgd)?;
                self.ledger.charge(Activity::Reduce, t);
                self.start_window(next, carried)?;
                self.evaluate_for(eval)?;
            }
            ToWorker::Evaluate { epoch } => self.evaluate_for(Some(epoch))?,
            ToWorker::Finish { capture } => {
                let state = self.worker.snapshot()?;
                let capture = self.capture(capture.then_some(CaptureRequest { model: false }))?;
                self.send(ToCoordinator::Final { rank, state, capture })?;
                return Ok(Flow::Exit);
            }
            ToWorker::Stop => return Ok(Flow::Exit),
            // The link acts on abort orders itself; one that reaches the loop is stale.
            ToWorker::Ping | ToWorker::AbortGroup { .. } => {}
            ToWorker::Regroup { generation, members, how } => {
                return self.regroup(generation, &members, &how);
            }
            ToWorker::MakeGroupId { generation } => {
                let how = self.worker.make_group_id()?;
                self.send(ToCoordinator::GroupId { rank, generation, how })?;
            }
        }
        Ok(Flow::Continue)
    }

    /// Collective backend: averages with the group, then starts the next window. When the
    /// group breaks (a peer died, the group was aborted or timed out), the parameters and
    /// buffers are as before the reduce; the rank reports it and waits for the coordinator's
    /// new membership, after which the reduce is redone.
    fn reduce(&mut self, what: Interrupted) -> Result<()> {
        let rank = self.worker.rank;
        self.global_step = what.global_step;
        let steps = self.win.steps;
        let round = self.win.window.round;
        self.send(ToCoordinator::Reducing { rank, round })?;
        let t = Instant::now();
        let reduced = self.worker.all_reduce(steps);
        self.ledger.charge(Activity::Reduce, t);
        match reduced {
            Ok(Reduced { sync_ms, divergence, norm }) => {
                let t = Instant::now();
                match norm {
                    Some(norm) => check_norm(norm, rank, what.global_step)?,
                    None => {
                        let (params, stream) =
                            (self.worker.replica.parameters(), &self.worker.stream);
                        check_parameters(params, rank, what.global_step, stream)?;
                    }
                }
                self.ledger.charge(Activity::Reduce, t);
                let capture = self.capture(what.capture)?;
                self.send(ToCoordinator::Reduced {
                    rank,
                    round,
                    steps,
                    sync_ms,
                    divergence,
                    capture,
                })?;
                self.start_window(what.next, (0, 0.0))?;
                self.evaluate_for(what.eval)
            }
            // A rank whose group is formed through the coordinator has no communicator when
            // the last group failed to form: it waits for the next, as after a break.
            Err(e)
                if is_group_fault(&e) || self.relayed() && matches!(e, Error::NoCommunicator) =>
            {
                tracing::warn!(rank, round, error = %e, "collective group broke; waiting to regroup");
                self.stage = Stage::Interrupted(what);
                let generation = self.group.generation;
                let error = e.to_string().into();
                self.send(ToCoordinator::ReduceFailed { rank, round, generation, error })
            }
            Err(e) => Err(e),
        }
    }

    /// Builds the communicator of the group `members` (global ranks) and redoes an
    /// interrupted reduce; exits when this rank is not a member (it was declared dead).
    fn regroup(&mut self, generation: u64, members: &[usize], how: &Regroup) -> Result<Flow> {
        let rank = self.worker.rank;
        if !members.contains(&rank) {
            return Ok(Flow::Exit);
        }
        // A shrunk host group is made of the current one's members; a group named by an id
        // may take members the current one lacks (a rank joining a running run).
        let positions = match how {
            Regroup::Host => Some(self.group.positions(members).ok_or_else(|| {
                Error::protocol(format!(
                    "regroup {members:?} names a rank outside the current group"
                ))
            })?),
            _ => None,
        };
        let me = members.iter().position(|&m| m == rank).unwrap_or(0);
        self.send(ToCoordinator::Joining { rank, generation })?;
        self.group = Group { members: members.to_vec(), generation };
        match self.worker.regroup_comm(positions.as_deref(), members.len(), me, how) {
            Ok(()) => {}
            // A member that never came (it died while the group formed): the coordinator
            // forms the next group once it declares it dead; the reduce stays owed till then.
            Err(e) if self.relayed() && is_group_fault(&e) => {
                tracing::warn!(rank, generation, error = %e, "the group did not form; waiting for the next");
                return Ok(Flow::Continue);
            }
            Err(e) => return Err(e),
        }
        tracing::info!(rank, generation, ?members, "regrouped");
        self.announce_group()?;
        // A rank still starting (the first group forms before its initial state) stays so.
        if matches!(self.stage, Stage::Interrupted(_))
            && let Stage::Interrupted(what) = std::mem::replace(&mut self.stage, Stage::Training)
        {
            self.reduce(what)?;
        }
        Ok(Flow::Continue)
    }

    /// Whether the rank's collective groups are formed through the coordinator (each named by
    /// a relayed id: NCCL across processes, the in-memory engine).
    fn relayed(&self) -> bool {
        let spec = &self.cfg.spec;
        spec.collective_engine().is_some_and(|e| e.relays(spec.placement))
    }

    /// Arms the link to abort the rank's current collective group and tells the coordinator
    /// the rank joined it.
    fn announce_group(&self) -> Result<()> {
        let Some(comm) = self.worker.comm.as_ref() else { return Ok(()) };
        let generation = self.group.generation;
        self.link.arm_abort(generation, comm.abort_handle());
        self.send(ToCoordinator::Joined { rank: self.worker.rank, generation })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::local::link;
    use crate::link::{CoordinatorLink, Inbound};

    const BEAT: Duration = Duration::from_millis(500);
    const STALL: Duration = Duration::from_secs(20);

    /// A rank quiet for a beat that finds the coordinator's ping waiting (as a loaded machine
    /// makes it, waking late) says it is alive before taking the ping; one that spoke within
    /// the beat says nothing.
    #[test]
    fn a_quiet_rank_woken_by_a_ping_says_it_is_alive() -> std::result::Result<(), String> {
        for (quiet, alive) in [(2 * BEAT, true), (BEAT + BEAT / 2, true), (Duration::ZERO, false)] {
            let (inbox_tx, inbox) = flume::bounded::<Inbound<()>>(16);
            let (coord, mut ends) = link(1, 4, &inbox_tx);
            let rank = ends.pop().ok_or("no rank 0")?;
            coord.send(0, ToWorker::Ping, STALL).map_err(|e| e.to_string())?;
            let since = Instant::now().checked_sub(quiet).ok_or("no instant that early")?;
            let last_sent = Cell::new(since);
            let got = wait_on(&rank, 0, &last_sent, BEAT, STALL).map_err(|e| e.to_string())?;
            if got != ToWorker::Ping {
                return Err(format!("quiet {quiet:?}: got {got:?}"));
            }
            let said = match inbox.try_recv() {
                Ok(Inbound::Wire { rank: 0, msg: ToCoordinator::Alive { rank: 0 } }) => true,
                Err(flume::TryRecvError::Empty) => false,
                other => return Err(format!("quiet {quiet:?}: the coordinator got {other:?}")),
            };
            if said != alive {
                return Err(format!("quiet {quiet:?}: said it is alive {said}, expected {alive}"));
            }
            if alive && last_sent.get() <= since {
                return Err(format!("quiet {quiet:?}: the heartbeat was not noted"));
            }
        }
        Ok(())
    }
}

//! The prefetcher: a background thread per rank that fetches, stages and uploads batches ahead.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flodl_tensor::{Device, Event, Stream, Tensor};

use crate::background;
use crate::batch::{Column, HostBatch};
use crate::dataset::Dataset;
use crate::depth::{CPU_DEPTH, Depth, vram_depth};
use crate::error::{Error, Result};
use crate::layout::SampleLayout;
use crate::permutation::{PickKey, PickSpace};
use crate::plan::BatchPicks;
use crate::staging::CacheReport;
use crate::transform::Transform;

/// A batch on the device: one tensor per layout field (`[n, ..]`), ready once [`DeviceBatch::ready`]
/// has completed.
#[derive(Debug)]
pub struct DeviceBatch {
    tensors: Vec<Tensor>,
    ready: Event,
    keys: Vec<PickKey>,
    valid: usize,
    index: usize,
    cache: Option<CacheReport>,
    // CPU batches give their tensors back to the prefetcher when dropped, for reuse.
    recycle: Option<flume::Sender<Vec<Tensor>>>,
}

impl Drop for DeviceBatch {
    fn drop(&mut self) {
        if let Some(tx) = self.recycle.take()
            && !self.tensors.is_empty()
        {
            // Full or disconnected: the tensors are simply freed.
            let _ = tx.try_send(std::mem::take(&mut self.tensors));
        }
    }
}

impl DeviceBatch {
    /// The tensors, in layout field order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The tensors, mutable.
    pub fn tensors_mut(&mut self) -> &mut [Tensor] {
        &mut self.tensors
    }

    /// The tensors, taken out of the batch (wait on the event first).
    pub fn into_tensors(mut self) -> Vec<Tensor> {
        std::mem::take(&mut self.tensors)
    }

    /// The event recorded on the prefetch stream after the upload (and transform).
    pub fn ready(&self) -> &Event {
        &self.ready
    }

    /// Makes `stream` (the consumer's) wait until the batch is on the device.
    ///
    /// # Errors
    /// A driver error.
    pub fn wait(&self, stream: &Stream) -> Result<()> {
        Ok(stream.wait_event(&self.ready)?)
    }

    /// The pick key of every row, padding rows included.
    pub fn keys(&self) -> &[PickKey] {
        &self.keys
    }

    /// Rows in the batch, padding included.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// How many leading rows are real (the rest are padding, see [`crate::TailPolicy::Pad`]).
    pub fn valid(&self) -> usize {
        self.valid
    }

    /// Where its samples came from, when the dataset is a cache.
    pub fn cache(&self) -> Option<CacheReport> {
        self.cache
    }

    /// Position of this batch in its plan.
    pub fn index(&self) -> usize {
        self.index
    }
}

/// How a [`Prefetcher`] runs.
#[derive(Clone)]
pub struct PrefetchConfig {
    /// The pick space the plans' picks live in (maps picks to samples and repeats).
    pub space: PickSpace,
    /// The run's shuffle seed (part of every [`PickKey`]).
    pub seed: u64,
    /// How many uploaded batches may wait for the consumer.
    pub depth: Depth,
    /// Augmentation applied after upload, if any.
    pub transform: Option<Arc<dyn Transform>>,
}

impl std::fmt::Debug for PrefetchConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefetchConfig")
            .field("space", &self.space)
            .field("seed", &self.seed)
            .field("depth", &self.depth)
            .field("transform", &self.transform.is_some())
            .finish()
    }
}

impl PrefetchConfig {
    /// No augmentation over `samples` samples, depth from the VRAM gauge.
    pub fn new(samples: usize, seed: u64) -> Self {
        Self { space: PickSpace::plain(samples), seed, depth: Depth::default(), transform: None }
    }
}

/// One plan's work for the background thread.
struct Job {
    epoch: u64,
    batches: Vec<BatchPicks>,
    out: flume::Sender<Result<DeviceBatch>>,
    // Signalled by the consumer when it finds the queue empty or leaves it below half the
    // depth; disconnects when the feed is dropped.
    hungry: flume::Receiver<()>,
}

/// A rank's prefetcher: a background thread that, for each plan, fetches every batch from the
/// dataset into reusable staging buffers (page-locked on CUDA), uploads it asynchronously on
/// its own stream, applies the transform, records a ready event and queues it on a bounded
/// channel whose capacity is the plan's depth.
///
/// When the queue is full the thread does not block on it: it looks again every so often (a
/// quarter of the consumer's recent pace, backing off while the consumer is idle), so taking a
/// queued batch never has to wake it. A consumer that finds the queue empty, or leaves it below
/// half the depth (the thread is behind), wakes it at once.
///
/// Plans run in the order started. Dropping a [`Feed`] cancels the rest of its plan; dropping
/// the prefetcher stops the thread (abandoning a plan in progress) and joins it.
pub struct Prefetcher {
    dataset: Arc<dyn Dataset>,
    device: Device,
    config: PrefetchConfig,
    jobs: Option<flume::Sender<Job>>,
    // Never sent on: dropping it tells the thread to abandon a plan in progress.
    stop: Option<flume::Sender<()>>,
    // Never sent on: disconnects when the thread ends, however it ends (its sender is dropped
    // while unwinding too).
    alive: flume::Receiver<()>,
    worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Prefetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("device", &self.device)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Prefetcher {
    /// A prefetcher uploading to `device` on a stream of its own.
    ///
    /// # Errors
    /// [`Error::InvalidSharding`] when `config.space` does not cover the dataset's samples; a
    /// tensor error when the stream cannot be created; [`Error::Io`] when the thread cannot
    /// be spawned.
    pub fn new(dataset: Arc<dyn Dataset>, device: Device, config: PrefetchConfig) -> Result<Self> {
        if config.space.samples() > dataset.len() {
            return Err(Error::InvalidSharding {
                reason: format!(
                    "pick space of {} samples over a dataset of {}",
                    config.space.samples(),
                    dataset.len()
                ),
            });
        }
        // A CPU rank copies on its own thread only.
        let stream = match device {
            Device::Cpu => Stream::cpu_with_threads(1),
            Device::Cuda(_) => Stream::new(device)?,
        };
        let (jobs, job_rx) = flume::bounded::<Job>(4);
        let (stop, stop_rx) = flume::bounded::<()>(0);
        let (recycle, recycled) = flume::bounded(4);
        let worker = Worker {
            dataset: Arc::clone(&dataset),
            layout: dataset.layout().clone(),
            space: config.space,
            seed: config.seed,
            transform: config.transform.clone(),
            stream,
            staging: [
                HostBatch::new(dataset.layout(), device),
                HostBatch::new(dataset.layout(), device),
            ],
            recycle,
            recycled,
            pace: Pace::default(),
        };
        let (alive_tx, alive) = flume::bounded::<()>(0);
        let handle = background::spawn("prefetch", move || {
            let _alive = alive_tx;
            worker.run(&job_rx, &stop_rx);
        })?;
        Ok(Self {
            dataset,
            device,
            config,
            jobs: Some(jobs),
            stop: Some(stop),
            alive,
            worker: Some(handle),
        })
    }

    /// The device batches are uploaded to.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The depth a plan of `batches` batches of `batch_size` rows would get now.
    pub fn depth_for(&self, batches: usize, batch_size: usize) -> usize {
        let depth = match (self.config.depth, self.device) {
            (Depth::Fixed(d), _) => d,
            (Depth::Vram(budget), Device::Cpu) => CPU_DEPTH.min(budget.max_depth),
            (Depth::Vram(budget), Device::Cuda(_)) => {
                let batch_bytes = (self.dataset.layout().sample_bytes() * batch_size) as u64;
                let gauge = flodl_tensor::devices().into_iter().find(|d| d.device == self.device);
                match gauge {
                    Some(info) => vram_depth(
                        self.device,
                        info.total_memory,
                        info.free_memory,
                        batch_bytes,
                        &budget,
                    ),
                    // A device the driver does not list: the most conservative pipelined depth.
                    None => 1,
                }
            }
        };
        depth.min(batches)
    }

    /// Starts prefetching the batches of one plan of `epoch`; they come out of the returned
    /// [`Feed`] in order. The depth is evaluated now (see [`Prefetcher::depth_for`]).
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] for a pick outside the pick space; [`Error::WorkerLost`] when
    /// the background thread has died.
    pub fn start(&self, epoch: u64, batches: Vec<BatchPicks>) -> Result<Feed> {
        let len = self.config.space.len();
        if let Some(&index) = batches.iter().flat_map(|b| &b.picks).find(|&&p| p >= len) {
            return Err(Error::IndexOutOfRange { index, len });
        }
        let widest = batches.iter().map(BatchPicks::len).max().unwrap_or(0);
        let depth = self.depth_for(batches.len(), widest);
        tracing::debug!(epoch, batches = batches.len(), depth, "prefetch plan");
        let (out, rx) = flume::bounded(depth);
        let (hungry, hungry_rx) = flume::bounded(1);
        let remaining = batches.len();
        let job = Job { epoch, batches, out, hungry: hungry_rx };
        let jobs = self.jobs.as_ref().ok_or(Error::WorkerLost { role: "prefetch" })?;
        jobs.send(job).map_err(|_| Error::WorkerLost { role: "prefetch" })?;
        Ok(Feed { rx, hungry, alive: self.alive.clone(), remaining, depth })
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        drop(self.jobs.take());
        drop(self.stop.take());
        if let Some(handle) = self.worker.take()
            && handle.join().is_err()
        {
            tracing::warn!("prefetch thread panicked");
        }
    }
}

/// What [`Feed::next_timeout`] found.
#[derive(Debug)]
pub enum Next {
    /// The next batch of the plan.
    Batch(DeviceBatch),
    /// Nothing yet within the timeout.
    Pending,
    /// Every batch of the plan has been delivered.
    Done,
}

/// The consumer's end of one plan: its batches, in order. Dropping it cancels the rest of
/// the plan.
#[derive(Debug)]
pub struct Feed {
    rx: flume::Receiver<Result<DeviceBatch>>,
    // Tells a thread waiting out a poll interval on a queue it saw full that the queue ran dry.
    hungry: flume::Sender<()>,
    // Disconnects when the thread ends. A job the thread never took (queued while it was
    // unwinding from a panic) keeps its sender of `rx` alive as long as the prefetcher, so
    // `rx` alone would never disconnect.
    alive: flume::Receiver<()>,
    remaining: usize,
    depth: usize,
}

impl Feed {
    /// The depth (queue capacity) this plan runs with.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Batches not yet delivered.
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// Batches uploaded and waiting in the queue now.
    pub fn queued(&self) -> usize {
        self.rx.len()
    }

    /// Waits up to `timeout` for the next batch.
    ///
    /// # Errors
    /// The fetch, upload or transform error of the batch (the plan then ends), or
    /// [`Error::WorkerLost`] when the thread ended before delivering every batch.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Next> {
        if self.remaining == 0 {
            return Ok(Next::Done);
        }
        match self.wait(Some(timeout)) {
            Arrival::Item(item) => self.take(item).map(Next::Batch),
            Arrival::Timeout => Ok(Next::Pending),
            Arrival::Lost => self.lost(),
        }
    }

    /// Waits for the next item until the thread ends (or `timeout`, if any, passes).
    fn wait(&self, timeout: Option<Duration>) -> Arrival {
        // Fast path: a batch already queued needs no selector (registering one on both
        // channels costs more than the hand-over itself).
        if let Ok(item) = self.rx.try_recv() {
            // Below half the depth the thread is behind (while it keeps up, a slot is refilled
            // well within one step): if it is waiting out a poll interval, cut it short.
            if self.rx.len() < self.depth / 2 {
                let _ = self.hungry.try_send(());
            }
            return Arrival::Item(item);
        }
        // Empty: the thread may be between two looks at a queue it last saw full. Full or
        // disconnected: it has been told already, or it is gone (`alive` says so below).
        let _ = self.hungry.try_send(());
        let selector = flume::Selector::new()
            .recv(&self.rx, |r| r.map_or(Arrival::Lost, Arrival::Item))
            // Nothing is ever sent on `alive`: this fires once the thread has ended.
            .recv(&self.alive, |_| Arrival::Lost);
        let arrival = match timeout {
            Some(timeout) => selector.wait_timeout(timeout).unwrap_or(Arrival::Timeout),
            None => selector.wait(),
        };
        match arrival {
            // The thread has ended: what it queued before still comes out, in order.
            Arrival::Lost => self.rx.try_recv().map_or(Arrival::Lost, Arrival::Item),
            other => other,
        }
    }

    fn take(&mut self, item: Result<DeviceBatch>) -> Result<DeviceBatch> {
        match item {
            Ok(batch) => {
                self.remaining -= 1;
                Ok(batch)
            }
            Err(e) => {
                self.remaining = 0;
                Err(e)
            }
        }
    }

    fn lost<T>(&mut self) -> Result<T> {
        self.remaining = 0;
        Err(Error::WorkerLost { role: "prefetch" })
    }
}

/// What waiting on a [`Feed`]'s queue found.
enum Arrival {
    Item(Result<DeviceBatch>),
    Timeout,
    Lost,
}

impl Iterator for Feed {
    type Item = Result<DeviceBatch>;

    /// Blocks for the next batch; `None` once the plan is delivered or after an error.
    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        Some(match self.wait(None) {
            Arrival::Item(item) => self.take(item),
            Arrival::Timeout | Arrival::Lost => self.lost(),
        })
    }
}

/// The background thread's state: reused across plans.
struct Worker {
    dataset: Arc<dyn Dataset>,
    layout: SampleLayout,
    space: PickSpace,
    seed: u64,
    transform: Option<Arc<dyn Transform>>,
    stream: Stream,
    // Two staging buffers: one is filled while the other's upload is in flight.
    staging: [HostBatch; 2],
    // CPU batches' tensors come back here when the consumer drops them.
    recycle: flume::Sender<Vec<Tensor>>,
    recycled: flume::Receiver<Vec<Tensor>>,
    pace: Pace,
}

/// Whether to go on after delivering a batch.
enum Delivery {
    Delivered,
    Cancelled,
    Stopped,
}

impl Worker {
    fn run(mut self, jobs: &flume::Receiver<Job>, stop: &flume::Receiver<()>) {
        while let Ok(job) = jobs.recv() {
            self.pace.restart();
            for (index, picks) in job.batches.iter().enumerate() {
                if stop.is_disconnected() {
                    return;
                }
                let item = self.prepare(job.epoch, index, picks);
                let failed = item.is_err();
                match deliver(&job, stop, &mut self.pace, item) {
                    Delivery::Delivered if !failed => {}
                    Delivery::Delivered | Delivery::Cancelled => break,
                    Delivery::Stopped => return,
                }
            }
        }
    }

    fn prepare(&mut self, epoch: u64, index: usize, picks: &BatchPicks) -> Result<DeviceBatch> {
        let keys = picks
            .picks
            .iter()
            .map(|&p| self.space.key(p, epoch, self.seed))
            .collect::<Result<Vec<_>>>()?;
        let samples: Vec<usize> = keys.iter().map(|k| k.sample).collect();
        let staging = &mut self.staging[index % 2];
        if let Ok(tensors) = self.recycled.try_recv() {
            staging.adopt(tensors);
        }
        let cache = self.dataset.fetch_traced(&samples, staging)?;
        if !staging.is_consistent() || staging.len() != samples.len() {
            return Err(Error::LayoutMismatch);
        }
        let mut tensors = match staging.take_tensors() {
            // On the CPU the fetched buffers are the batch: no copy.
            Some(tensors) => tensors,
            None => upload(&self.layout, staging, &self.stream)?,
        };
        if let Some(transform) = &self.transform {
            transform.apply(&keys, &mut tensors, &self.stream)?;
        }
        let ready = Event::new(self.stream.device())?;
        ready.record(&self.stream)?;
        Ok(DeviceBatch {
            tensors,
            ready,
            keys,
            valid: picks.valid,
            index,
            cache,
            recycle: self.stream.device().is_cpu().then(|| self.recycle.clone()),
        })
    }
}

/// Starts the asynchronous upload of a staged batch to the stream's device.
fn upload(layout: &SampleLayout, staging: &HostBatch, stream: &Stream) -> Result<Vec<Tensor>> {
    let n = staging.len();
    let mut tensors = Vec::with_capacity(layout.fields().len());
    for (field, column) in layout.fields().iter().zip(staging.columns()) {
        let shape = field.batch_shape(n);
        let t = match column {
            Column::F32(b) => {
                let mut t = Tensor::zeros(&shape, field.dtype, stream)?;
                t.copy_from_pinned_async(b, stream)?;
                t
            }
            Column::I32(b) => {
                let mut t = Tensor::zeros(&shape, field.dtype, stream)?;
                t.copy_from_pinned_async(b, stream)?;
                t
            }
            Column::Cpu(t) => t.to_device(stream.device(), stream)?,
        };
        tensors.push(t);
    }
    Ok(tensors)
}

/// Shortest wait between two looks at a full queue (about the timer slack of a sleeping thread).
const MIN_POLL: Duration = Duration::from_micros(50);
/// Longest wait between two looks at a full queue (an idle consumer costs 50 wake-ups a second).
const MAX_POLL: Duration = Duration::from_millis(20);
/// Looks at the first interval before backing off: two consumer periods at a quarter each.
const STEADY_POLLS: u32 = 8;

/// The consumer's pace as the thread sees it: the time from a delivery to the next one that had
/// to wait for room (the consumer freed that slot; while the queue stays full, one delivery
/// happens per batch taken). Deliveries into a queue with room measure the thread, not the
/// consumer, and only move the starting point.
#[derive(Debug, Default)]
struct Pace {
    last: Option<Instant>,
    period: Duration,
}

impl Pace {
    /// A new plan: the wait for it is no delivery interval.
    fn restart(&mut self) {
        self.last = None;
    }

    fn delivered(&mut self, waited_for_room: bool) {
        let now = Instant::now();
        if let Some(last) = self.last
            && waited_for_room
        {
            self.period = now - last;
        }
        self.last = Some(now);
    }

    /// The first wait on a full queue: a quarter of the consumer's period, so a slot the
    /// consumer frees is refilled well within its next step.
    fn first_poll(&self) -> Duration {
        (self.period / 4).clamp(MIN_POLL, MAX_POLL)
    }
}

/// What ended a wait on a full queue.
enum Wake {
    /// The poll interval passed.
    Poll,
    /// The consumer found the queue empty.
    Hungry,
    /// The feed was dropped.
    Cancelled,
    /// The prefetcher was dropped.
    Stopped,
}

/// Hands `item` to the consumer, unless the consumer left or the prefetcher is dropped first.
///
/// A queue with room takes the batch at once. A full one is looked at again after a poll
/// interval (or as soon as the consumer finds it empty) instead of blocking on it: a blocked
/// sender is woken by the receive that frees its slot, and that wake-up (a futex wake, often a
/// context switch) would be paid by the consumer on every batch.
fn deliver(
    job: &Job,
    stop: &flume::Receiver<()>,
    pace: &mut Pace,
    item: Result<DeviceBatch>,
) -> Delivery {
    if job.out.capacity() == Some(0) {
        // A rendezvous queue: a batch only leaves with a consumer waiting for it.
        return rendezvous(&job.out, stop, item);
    }
    let mut item = item;
    let mut first = true;
    let mut interval = pace.first_poll();
    let mut polls = 0;
    loop {
        match job.out.try_send(item) {
            Ok(()) => {
                // `first` is still set if the queue had room at once.
                pace.delivered(!first);
                return Delivery::Delivered;
            }
            Err(flume::TrySendError::Disconnected(_)) => return Delivery::Cancelled,
            Err(flume::TrySendError::Full(back)) => item = back,
        }
        if first {
            // A signal from before the queue filled is stale; one sent after this drain finds
            // the queue no longer full at the next look, which comes right after.
            first = false;
            while job.hungry.try_recv().is_ok() {}
            continue;
        }
        let wake = flume::Selector::new()
            .recv(&job.hungry, |r| r.map_or(Wake::Cancelled, |()| Wake::Hungry))
            // Nothing is ever sent on `stop`: this fires once the prefetcher is dropped.
            .recv(stop, |_| Wake::Stopped)
            .wait_timeout(interval)
            .unwrap_or(Wake::Poll);
        match wake {
            Wake::Poll => {
                polls += 1;
                if polls >= STEADY_POLLS {
                    // The consumer is idle (or much slower than its last pace): back off.
                    interval = (interval * 2).min(MAX_POLL);
                }
            }
            Wake::Hungry => {}
            Wake::Cancelled => return Delivery::Cancelled,
            Wake::Stopped => return Delivery::Stopped,
        }
    }
}

/// Hands `item` to a consumer waiting for it (a queue of capacity 0), unless the consumer
/// left or the prefetcher is dropped first.
fn rendezvous(
    out: &flume::Sender<Result<DeviceBatch>>,
    stop: &flume::Receiver<()>,
    item: Result<DeviceBatch>,
) -> Delivery {
    flume::Selector::new()
        .send(out, item, |r| match r {
            Ok(()) => Delivery::Delivered,
            Err(_) => Delivery::Cancelled,
        })
        .recv(stop, |_| Delivery::Stopped)
        .wait()
}

//! The staging cache: a sample-keyed host cache under a byte budget, filled ahead from advisories.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use flodl_tensor::Device;

use crate::background;
use crate::batch::{HostBatch, View, ViewMut, copy_row_view};
use crate::dataset::{Dataset, check_indices};
use crate::error::{Error, Result};
use crate::layout::SampleLayout;
use crate::residency::{Admission, Eviction, Residency};

/// Whether a background thread fills the cache ahead of use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Fill {
    /// A background thread reads ahead along the advised stream, admitting what
    /// [`Eviction::NextUse`] allows (nothing under [`Eviction::Lru`], which ignores advisories).
    #[default]
    Background,
    /// Only read-through: samples enter the cache when a fetch misses them.
    Off,
}

/// How a [`StagingCache`] is sized and run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StagingConfig {
    /// Host bytes the cached samples may take (whole samples: `budget / sample bytes`).
    pub budget_bytes: usize,
    /// What to give up when full.
    pub eviction: Eviction,
    /// Whether to fill ahead in the background.
    pub fill: Fill,
    /// Samples the background thread fetches per bulk call.
    pub fill_chunk: usize,
}

impl StagingConfig {
    /// Next-use eviction with background fill, 256 samples per fill call.
    pub fn new(budget_bytes: usize) -> Self {
        Self { budget_bytes, eviction: Eviction::NextUse, fill: Fill::Background, fill_chunk: 256 }
    }
}

/// Where the samples of one fetch came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CacheReport {
    /// Samples served from the cache.
    pub hits: usize,
    /// Samples read from the dataset.
    pub misses: usize,
}

/// A sample-keyed host cache in front of a dataset, under a byte budget.
///
/// The rank tells the cache its upcoming sample stream with [`StagingCache::advise`] (latest
/// wins); a background thread reads ahead along it. [`StagingCache::fetch`] is read-through:
/// hits are copied from the cache, misses are read from the dataset in one bulk call and then
/// admitted. Under [`Eviction::NextUse`] the sample whose next use in the advised stream is
/// farthest is given up, and a sample needed later never displaces one needed sooner.
///
/// The cache is itself a [`Dataset`] (read-through), so a prefetcher can sit on top of it.
///
/// # Thread safety
/// `Send + Sync`; fetches from several threads are serialised on an internal lock except for
/// the dataset reads of misses. Dropping the cache stops and joins its background thread.
pub struct StagingCache {
    shared: Arc<Shared>,
    // Dropping the sender is the background thread's stop signal.
    wake: Option<flume::Sender<()>>,
    filler: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for StagingCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagingCache")
            .field("layout", &self.shared.layout)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

struct Shared {
    dataset: Arc<dyn Dataset>,
    layout: SampleLayout,
    config: StagingConfig,
    state: Mutex<State>,
    settled: Condvar,
}

#[derive(Debug)]
struct State {
    residency: Residency,
    store: Store,
    // Bumped by every advisory and fetch; the filler marks the last one it has caught up with.
    requested: u64,
    caught_up: u64,
    filler: FillerState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FillerState {
    Running,
    Gone,
}

impl StagingCache {
    /// A cache of `config.budget_bytes` in front of `dataset`.
    ///
    /// # Errors
    /// [`Error::InvalidSharding`] when `config.fill_chunk` is zero under [`Fill::Background`].
    pub fn new(dataset: Arc<dyn Dataset>, config: StagingConfig) -> Result<Self> {
        if config.fill == Fill::Background && config.fill_chunk == 0 {
            return Err(Error::InvalidSharding {
                reason: "staging fill chunk must be at least one sample".into(),
            });
        }
        let layout = dataset.layout().clone();
        let capacity = config.budget_bytes / layout.sample_bytes().max(1);
        let state = State {
            residency: Residency::new(capacity, config.eviction),
            store: Store::new(&layout, capacity),
            requested: 0,
            caught_up: 0,
            filler: FillerState::Gone,
        };
        let shared = Arc::new(Shared {
            dataset,
            layout,
            config,
            state: Mutex::new(state),
            settled: Condvar::new(),
        });
        let (wake, filler) = match config.fill {
            Fill::Off => (None, None),
            Fill::Background => {
                let (tx, rx) = flume::bounded(1);
                shared.lock().filler = FillerState::Running;
                let worker = Arc::clone(&shared);
                let handle = background::spawn("staging", move || fill_loop(&worker, &rx))?;
                (Some(tx), Some(handle))
            }
        };
        Ok(Self { shared, wake, filler })
    }

    /// Capacity in whole samples.
    pub fn capacity(&self) -> usize {
        self.shared.lock().residency.capacity()
    }

    /// Host bytes the cache's value arenas take now (allocated, not only used): never more
    /// than the budget.
    pub fn held_bytes(&self) -> usize {
        self.shared.lock().store.allocated_bytes()
    }

    /// Samples held now.
    pub fn held(&self) -> usize {
        self.shared.lock().residency.held()
    }

    /// Whether `sample` is held now.
    pub fn contains(&self, sample: usize) -> bool {
        self.shared.lock().residency.is_held(sample)
    }

    /// Replaces the advised stream: the samples this rank will fetch next, in order (picks
    /// mapped to samples; repeats allowed). Held samples are re-keyed and the background thread
    /// starts reading ahead.
    pub fn advise(&self, samples: Vec<usize>) {
        {
            let mut st = self.shared.lock();
            st.residency.advise(samples);
            st.requested += 1;
        }
        self.wake();
    }

    /// Blocks until the background thread has filled what it can for the latest advisory and
    /// fetch (returns at once under [`Fill::Off`]).
    ///
    /// # Errors
    /// [`Error::WorkerLost`] when the background thread has died.
    pub fn settle(&self) -> Result<()> {
        let mut st = self.shared.lock();
        loop {
            match st.filler {
                FillerState::Gone if self.filler.is_some() => {
                    return Err(Error::WorkerLost { role: "staging" });
                }
                FillerState::Gone => return Ok(()),
                FillerState::Running if st.caught_up >= st.requested => return Ok(()),
                FillerState::Running => {
                    st = self.shared.settled.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }

    /// Writes samples `indices` into `out` (read-through) and reports hits and misses.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`], [`Error::LayoutMismatch`], or the dataset's error for a miss.
    pub fn fetch_reported(&self, indices: &[usize], out: &mut HostBatch) -> Result<CacheReport> {
        let shared = &*self.shared;
        check_indices(indices, shared.dataset.len())?;
        out.prepare(&shared.layout, indices.len())?;
        let mut missed = Vec::new();
        {
            let mut views = out.views_mut()?;
            let mut st = shared.lock();
            let State { residency, store, .. } = &mut *st;
            for (row, &s) in indices.iter().enumerate() {
                if !(residency.access(s) && store.copy_out(s, &mut views, row)) {
                    missed.push((row, s));
                }
            }
            st.requested += 1;
        }
        let report = CacheReport { hits: indices.len() - missed.len(), misses: missed.len() };
        if !missed.is_empty() {
            let samples: Vec<usize> = missed.iter().map(|&(_, s)| s).collect();
            let mut scratch = HostBatch::new(&shared.layout, Device::Cpu);
            shared.dataset.fetch(&samples, &mut scratch)?;
            for (k, &(row, _)) in missed.iter().enumerate() {
                copy_row(&scratch, k, out, row)?;
            }
            let views = scratch.views()?;
            let mut st = shared.lock();
            for (k, &s) in samples.iter().enumerate() {
                st.admit_from(s, &views, k);
            }
        }
        self.wake();
        Ok(report)
    }

    fn wake(&self) {
        if let Some(tx) = &self.wake {
            // Full means a wake-up is already pending.
            let _ = tx.try_send(());
        }
    }
}

impl Dataset for StagingCache {
    fn len(&self) -> usize {
        self.shared.dataset.len()
    }

    fn layout(&self) -> &SampleLayout {
        &self.shared.layout
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> Result<()> {
        self.fetch_reported(indices, out).map(|_| ())
    }

    fn fetch_traced(&self, indices: &[usize], out: &mut HostBatch) -> Result<Option<CacheReport>> {
        self.fetch_reported(indices, out).map(Some)
    }
}

impl Drop for StagingCache {
    fn drop(&mut self) {
        drop(self.wake.take());
        if let Some(handle) = self.filler.take()
            && handle.join().is_err()
        {
            tracing::warn!("staging thread panicked");
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    /// Admits sample `s` whose values are row `k` of a batch's `views`; true when it was taken.
    fn admit_from(&mut self, s: usize, views: &[View<'_>], k: usize) -> bool {
        match self.residency.admit(s) {
            Admission::Admitted { evicted } => {
                if let Some(v) = evicted {
                    self.store.release(v);
                }
                self.store.copy_in(s, views, k);
                true
            }
            Admission::AlreadyHeld | Admission::Declined => false,
        }
    }
}

/// Marks the filler gone (and wakes `settle`) when the background thread ends, even by panic.
struct GoneOnExit<'a>(&'a Shared);

impl Drop for GoneOnExit<'_> {
    fn drop(&mut self) {
        self.0.lock().filler = FillerState::Gone;
        self.0.settled.notify_all();
    }
}

fn fill_loop(shared: &Shared, wake: &flume::Receiver<()>) {
    let _gone = GoneOnExit(shared);
    let mut scratch = HostBatch::new(&shared.layout, Device::Cpu);
    while wake.recv().is_ok() {
        loop {
            let (candidates, generation) = {
                let st = shared.lock();
                (st.residency.fill_candidates(shared.config.fill_chunk), st.requested)
            };
            if candidates.is_empty() || !fill_round(shared, &candidates, &mut scratch) {
                shared.lock().caught_up = generation;
                shared.settled.notify_all();
                break;
            }
            if wake.is_disconnected() {
                return;
            }
        }
    }
}

/// Reads `candidates` and admits them; false when nothing could be admitted (stop for now).
fn fill_round(shared: &Shared, candidates: &[usize], scratch: &mut HostBatch) -> bool {
    if let Err(e) = shared.dataset.fetch(candidates, scratch) {
        // The consumer's read-through meets the same error, typed.
        tracing::warn!(error = %e, "staging read-ahead failed; waiting for the next advisory");
        return false;
    }
    let views = match scratch.views() {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "staging read-ahead buffer unreadable");
            return false;
        }
    };
    let mut st = shared.lock();
    let mut admitted = false;
    for (k, &s) in candidates.iter().enumerate() {
        admitted |= st.admit_from(s, &views, k);
    }
    admitted
}

/// Copies sample row `from_row` of `from` into row `to_row` of `to` (same layout).
fn copy_row(from: &HostBatch, from_row: usize, to: &mut HostBatch, to_row: usize) -> Result<()> {
    let widths: Vec<usize> = from.layout().fields().iter().map(|f| f.numel()).collect();
    let src = from.views()?;
    let mut dst = to.views_mut()?;
    for ((s, d), &k) in src.iter().zip(dst.iter_mut()).zip(&widths) {
        copy_row_view(s, from_row, d, to_row, k);
    }
    Ok(())
}

/// The cached values: one slot per held sample in two arenas (f32 fields, i32 fields).
#[derive(Debug)]
struct Store {
    // Per field: (offset within the sample's part of its dtype's arena, elements).
    fields: Vec<(usize, usize)>,
    f32_per: usize,
    i32_per: usize,
    f32s: Vec<f32>,
    i32s: Vec<i32>,
    slots: HashMap<usize, usize>,
    free: Vec<usize>,
    next_slot: usize,
    // Slots the budget allows: the arenas never grow past them.
    max_slots: usize,
}

/// Makes `v` `len` long, growing its allocation at most to `limit` elements (doubling below it),
/// so the arena never holds more than the budget allows.
fn grow<T: Clone + Default>(v: &mut Vec<T>, len: usize, limit: usize) {
    if len > v.capacity() {
        let target = (v.capacity() * 2).max(len).min(limit.max(len));
        v.reserve_exact(target - v.len());
    }
    v.resize(len, T::default());
}

impl Store {
    fn new(layout: &SampleLayout, max_slots: usize) -> Self {
        let (mut f32_per, mut i32_per) = (0, 0);
        let fields = layout
            .fields()
            .iter()
            .map(|f| {
                let k = f.numel();
                if f.dtype == flodl_tensor::DType::I32 {
                    i32_per += k;
                    (i32_per - k, k)
                } else {
                    f32_per += k;
                    (f32_per - k, k)
                }
            })
            .collect();
        Self {
            fields,
            f32_per,
            i32_per,
            f32s: Vec::new(),
            i32s: Vec::new(),
            slots: HashMap::new(),
            free: Vec::new(),
            next_slot: 0,
            max_slots,
        }
    }

    fn allocated_bytes(&self) -> usize {
        (self.f32s.capacity() + self.i32s.capacity()) * 4
    }

    fn release(&mut self, sample: usize) {
        if let Some(slot) = self.slots.remove(&sample) {
            self.free.push(slot);
        }
    }

    fn slot_for(&mut self) -> usize {
        match self.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = self.next_slot;
                self.next_slot += 1;
                grow(&mut self.f32s, self.next_slot * self.f32_per, self.max_slots * self.f32_per);
                grow(&mut self.i32s, self.next_slot * self.i32_per, self.max_slots * self.i32_per);
                slot
            }
        }
    }

    /// Stores row `row` of `src` (the batch's views) as `sample`.
    fn copy_in(&mut self, sample: usize, src: &[View<'_>], row: usize) {
        let slot = self.slot_for();
        for (view, &(off, k)) in src.iter().zip(&self.fields) {
            match view {
                View::F32(v) => {
                    let dst = slot * self.f32_per + off;
                    self.f32s[dst..dst + k].copy_from_slice(&v[row * k..(row + 1) * k]);
                }
                View::I32(v) => {
                    let dst = slot * self.i32_per + off;
                    self.i32s[dst..dst + k].copy_from_slice(&v[row * k..(row + 1) * k]);
                }
            }
        }
        self.slots.insert(sample, slot);
    }

    /// Writes `sample` into row `row` of `dst` (a batch's views); false when it is not stored.
    fn copy_out(&self, sample: usize, dst: &mut [ViewMut<'_>], row: usize) -> bool {
        let Some(&slot) = self.slots.get(&sample) else {
            return false;
        };
        for (view, &(off, k)) in dst.iter_mut().zip(&self.fields) {
            match view {
                ViewMut::F32(v) => {
                    let src = slot * self.f32_per + off;
                    v[row * k..(row + 1) * k].copy_from_slice(&self.f32s[src..src + k]);
                }
                ViewMut::I32(v) => {
                    let src = slot * self.i32_per + off;
                    v[row * k..(row + 1) * k].copy_from_slice(&self.i32s[src..src + k]);
                }
            }
        }
        true
    }
}

//! The `Dataset` contract, and `Subset`, a dataset restricted to some of another's samples.

use std::sync::Arc;

use crate::batch::HostBatch;
use crate::error::{Error, Result};
use crate::layout::SampleLayout;
use crate::staging::CacheReport;

/// What one fetch from a dataset costs: whether its samples sit in memory or are read from
/// storage. The runtime stages a dataset in a host cache filled ahead ([`crate::StagingCache`])
/// when it reads from storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FetchCost {
    /// Samples are copied from host memory: nothing to gain from staging.
    #[default]
    Memory,
    /// Samples are read with I/O on each fetch (a file, a network store): slow to fetch.
    Storage,
}

/// A finite, indexable set of samples that can be fetched in bulk.
///
/// `fetch` is pure: the same indices always give the same values (augmentation is applied later,
/// as a [`crate::Transform`] of a [`crate::PickKey`]). Implementations are shared between threads
/// (the prefetcher and the staging cache fetch from background threads).
pub trait Dataset: Send + Sync {
    /// Number of samples.
    fn len(&self) -> usize;

    /// The layout of one sample.
    fn layout(&self) -> &SampleLayout;

    /// Writes samples `indices` (in order, repeats allowed) into `out`, which ends up holding
    /// exactly `indices.len()` samples.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] for an index `>= len()`, [`Error::LayoutMismatch`] when `out`
    /// was made for another layout, or whatever reading the samples fails with.
    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> Result<()>;

    /// Whether the dataset has no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What a fetch costs (a hint for the runtime: [`FetchCost::Storage`] datasets are staged).
    fn fetch_cost(&self) -> FetchCost {
        FetchCost::Memory
    }

    /// As [`Dataset::fetch`], and says where the samples came from when the dataset is a cache
    /// (`None` for a dataset that is not one).
    ///
    /// # Errors
    /// As [`Dataset::fetch`].
    fn fetch_traced(&self, indices: &[usize], out: &mut HostBatch) -> Result<Option<CacheReport>> {
        self.fetch(indices, out).map(|()| None)
    }
}

impl<D: Dataset + ?Sized> Dataset for Arc<D> {
    fn len(&self) -> usize {
        (**self).len()
    }

    fn layout(&self) -> &SampleLayout {
        (**self).layout()
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> Result<()> {
        (**self).fetch(indices, out)
    }

    fn fetch_cost(&self) -> FetchCost {
        (**self).fetch_cost()
    }

    fn fetch_traced(&self, indices: &[usize], out: &mut HostBatch) -> Result<Option<CacheReport>> {
        (**self).fetch_traced(indices, out)
    }
}

impl<D: Dataset + ?Sized> Dataset for Box<D> {
    fn len(&self) -> usize {
        (**self).len()
    }

    fn layout(&self) -> &SampleLayout {
        (**self).layout()
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> Result<()> {
        (**self).fetch(indices, out)
    }

    fn fetch_cost(&self) -> FetchCost {
        (**self).fetch_cost()
    }

    fn fetch_traced(&self, indices: &[usize], out: &mut HostBatch) -> Result<Option<CacheReport>> {
        (**self).fetch_traced(indices, out)
    }
}

/// Checks that every index is below `len`.
///
/// # Errors
/// [`Error::IndexOutOfRange`] naming the first index that is not.
pub(crate) fn check_indices(indices: &[usize], len: usize) -> Result<()> {
    match indices.iter().find(|&&i| i >= len) {
        Some(&index) => Err(Error::IndexOutOfRange { index, len }),
        None => Ok(()),
    }
}

/// The samples of a dataset at chosen indices, renumbered `0..n` in the order given.
#[derive(Debug, Clone)]
pub struct Subset<D> {
    inner: D,
    indices: Vec<usize>,
}

impl<D: Dataset> Subset<D> {
    /// The samples of `inner` at `indices` (repeats allowed), renumbered in order.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] when an index is past the end of `inner`.
    pub fn new(inner: D, indices: Vec<usize>) -> Result<Self> {
        check_indices(&indices, inner.len())?;
        Ok(Self { inner, indices })
    }

    /// The first `n` samples of `inner` (all of them when `n >= inner.len()`).
    pub fn first(inner: D, n: usize) -> Self {
        let indices = (0..n.min(inner.len())).collect();
        Self { inner, indices }
    }

    /// The wrapped dataset.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The index in the wrapped dataset of each sample of the subset.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }
}

impl<D: Dataset> Dataset for Subset<D> {
    fn len(&self) -> usize {
        self.indices.len()
    }

    fn layout(&self) -> &SampleLayout {
        self.inner.layout()
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> Result<()> {
        check_indices(indices, self.indices.len())?;
        let mapped: Vec<usize> = indices.iter().map(|&i| self.indices[i]).collect();
        self.inner.fetch(&mapped, out)
    }

    fn fetch_cost(&self) -> FetchCost {
        self.inner.fetch_cost()
    }

    fn fetch_traced(&self, indices: &[usize], out: &mut HostBatch) -> Result<Option<CacheReport>> {
        check_indices(indices, self.indices.len())?;
        let mapped: Vec<usize> = indices.iter().map(|&i| self.indices[i]).collect();
        self.inner.fetch_traced(&mapped, out)
    }
}

//! The worker threads of a CPU stream and how kernels split work across them.

use std::ops::Range;
use std::sync::OnceLock;

use rayon::prelude::*;

/// Inputs shorter than this run on the calling thread: splitting costs more than it gains.
pub(crate) const PARALLEL_THRESHOLD: usize = 1 << 18;

/// Smallest piece of work handed to one task when splitting.
const MIN_TASK: usize = 1 << 15;

/// The thread budget of a CPU stream, with its thread pool built on first large kernel.
#[derive(Debug)]
pub(crate) struct CpuWorkers {
    threads: usize,
    // Built lazily so a stream that only ever sees small inputs never spawns threads; `None`
    // after a failed build, in which case kernels run on the calling thread.
    pool: OnceLock<Option<rayon::ThreadPool>>,
}

impl CpuWorkers {
    pub(crate) fn new(threads: usize) -> CpuWorkers {
        CpuWorkers { threads: threads.max(1), pool: OnceLock::new() }
    }

    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// The pool to use for `len` elements, or `None` to stay on the calling thread.
    pub(crate) fn pool_for(&self, len: usize) -> Option<&rayon::ThreadPool> {
        if len < PARALLEL_THRESHOLD { None } else { self.pool() }
    }

    /// The stream's pool, or `None` for a 1-thread stream (which never touches rayon).
    pub(crate) fn pool(&self) -> Option<&rayon::ThreadPool> {
        if self.threads == 1 {
            return None;
        }
        self.pool
            .get_or_init(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(self.threads)
                    .thread_name(|i| format!("flodl-cpu-{i}"))
                    .build()
                    .map_err(|e| tracing::warn!("cpu stream pool: {e}; running single-threaded"))
                    .ok()
            })
            .as_ref()
    }

    /// Elements per task when splitting `len` elements: about eight tasks per thread (so a
    /// thread that loses its core to another process is helped by the others) but no fewer than
    /// [`MIN_TASK`] elements, 64-aligned. Depends only on `len` and the thread count, so results
    /// are reproducible for a given stream.
    fn chunk(&self, len: usize) -> usize {
        len.div_ceil(8 * self.threads).max(MIN_TASK).next_multiple_of(64)
    }

    /// Runs `f(offset, chunk)` over `a` split into chunks run by the stream's threads.
    pub(crate) fn split1<A: Send>(&self, a: &mut [A], f: impl Fn(usize, &mut [A]) + Sync) {
        match self.pool_for(a.len()) {
            None => f(0, a),
            Some(pool) => {
                let ch = self.chunk(a.len());
                pool.install(|| {
                    a.par_chunks_mut(ch).enumerate().for_each(|(i, c)| f(i * ch, c));
                });
            }
        }
    }

    /// Like [`split1`](Self::split1) over two equally long mutable slices.
    pub(crate) fn split2<A: Send, B: Send>(
        &self,
        a: &mut [A],
        b: &mut [B],
        f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
    ) {
        match self.pool_for(a.len()) {
            None => f(0, a, b),
            Some(pool) => {
                let ch = self.chunk(a.len());
                pool.install(|| {
                    a.par_chunks_mut(ch)
                        .zip(b.par_chunks_mut(ch))
                        .enumerate()
                        .for_each(|(i, (x, y))| f(i * ch, x, y));
                });
            }
        }
    }

    /// Like [`split1`](Self::split1) over three equally long mutable slices.
    pub(crate) fn split3<A: Send, B: Send, C: Send>(
        &self,
        a: &mut [A],
        b: &mut [B],
        c: &mut [C],
        f: impl Fn(usize, &mut [A], &mut [B], &mut [C]) + Sync,
    ) {
        match self.pool_for(a.len()) {
            None => f(0, a, b, c),
            Some(pool) => {
                let ch = self.chunk(a.len());
                pool.install(|| {
                    a.par_chunks_mut(ch)
                        .zip(b.par_chunks_mut(ch))
                        .zip(c.par_chunks_mut(ch))
                        .enumerate()
                        .for_each(|(i, ((x, y), z))| f(i * ch, x, y, z));
                });
            }
        }
    }

    /// Sums `f(range)` over `0..len` split into ranges run by the stream's threads, adding the
    /// partials in range order (so a given thread count always gives the same result).
    pub(crate) fn sum(&self, len: usize, f: impl Fn(Range<usize>) -> f64 + Sync) -> f64 {
        match self.pool_for(len) {
            None => f(0..len),
            Some(pool) => {
                let ch = self.chunk(len);
                let parts: Vec<f64> = pool.install(|| {
                    (0..len.div_ceil(ch))
                        .into_par_iter()
                        .map(|i| f(i * ch..((i + 1) * ch).min(len)))
                        .collect()
                });
                parts.iter().sum()
            }
        }
    }
}

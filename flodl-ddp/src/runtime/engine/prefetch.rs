//! Rank-side prefetching: whether a rank prepares its batches ahead, and the feeds of its chunks.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flodl_data::{BatchPicks, Dataset, Depth, DeviceBatch, Feed, Next, PrefetchConfig, Prefetcher};
use flodl_tensor::Device;

use crate::link::wire::Chunk;
use crate::{Error, Result};

/// Whether each rank prepares its training batches ahead on a background thread (fetch,
/// staging, upload) while it trains, or fetches and uploads each batch just before training it.
///
/// Prefetching changes when a batch is prepared, never which samples it holds or in what order:
/// a run trains the same batches either way (bitwise the same model under `Sync` on CPU ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prefetch {
    /// On for CUDA ranks, with a depth from the device's memory gauge re-evaluated for every
    /// chunk; off for CPU ranks.
    ///
    /// A CPU rank is a single thread standing for one device, and on a machine with few cores
    /// it shares its core with the other ranks: a prefetch thread competes with the rank for
    /// that core instead of overlapping with it. flodl-data measured a CPU-bound consumer
    /// starving 16–49% of the time with a prefetcher beside it on a 2-core machine. A CUDA
    /// rank's thread mostly waits on its device, so there the host-side fetch and the
    /// asynchronous upload overlap with compute. The throughput example's `--prefetch auto,2`
    /// found the same on 2 CPU ranks of a loaded 2-core machine (MLP, batch 64, rank 1 slowed
    /// 2.5×, 5 repeats): with depth 2 the fast rank waited for its batches 18–41% of its wall
    /// and the slow rank's non-compute share under `Cadence` rose from 6.9% to 10.3%. On a quiet
    /// machine the same comparison (`--modes cadence-collective --prefetch auto,2`, 4 repeats)
    /// went the other way: the fast rank's data share fell from 4.2% to 0.55% and the run
    /// delivered 97.4% of the ranks' compute rates instead of 94.7%. There the slow rank's
    /// emulated slowdown sleeps, leaving part of its core to the prefetch thread, which truly
    /// CPU-bound ranks would not; so CPU ranks stay without one unless asked.
    #[default]
    Auto,
    /// Off on every rank: each batch is fetched and uploaded right before it is trained.
    Off,
    /// On for every rank, CPU ranks included, with at most this many prepared batches waiting
    /// (0: the prefetcher prepares one batch and hands it over when the rank asks).
    Depth(usize),
}

impl Prefetch {
    /// The prefetcher depth a rank on `device` runs with; `None` when it does not prefetch.
    pub fn depth_on(self, device: Device) -> Option<Depth> {
        match self {
            Prefetch::Off => None,
            Prefetch::Auto if device.is_cpu() => None,
            Prefetch::Auto => Some(Depth::default()),
            Prefetch::Depth(n) => Some(Depth::Fixed(n)),
        }
    }
}

impl std::fmt::Display for Prefetch {
    /// `auto`, `off` or the depth.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Prefetch::Auto => f.write_str("auto"),
            Prefetch::Off => f.write_str("off"),
            Prefetch::Depth(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for Prefetch {
    type Err = crate::LogicError;

    /// `auto`, `off` or a depth (a number).
    fn from_str(s: &str) -> crate::LogicResult<Prefetch> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Prefetch::Auto),
            "off" => Ok(Prefetch::Off),
            n => n.parse().map(Prefetch::Depth).map_err(|_| crate::LogicError::Parse {
                what: "prefetch",
                input: s.to_string(),
                expected: "auto, off, or a depth (a number)",
            }),
        }
    }
}

/// Chunks whose batches are prepared at once: the one being trained and the next queued one
/// (so the background thread moves on to the next chunk while the rank finishes this one).
/// Kept below the prefetcher's job queue, so starting a feed never blocks the rank.
const CHUNKS_AHEAD: usize = 2;

/// A rank's prefetcher with the feeds of the chunks it has started, oldest first.
pub(crate) struct ChunkFeeds {
    prefetcher: Prefetcher,
    feeds: VecDeque<(Chunk, Feed)>,
    /// How long the rank has waited for its next batch so far.
    waited: Duration,
    /// How long the rank may wait for one batch.
    deadline: Duration,
}

impl std::fmt::Debug for ChunkFeeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkFeeds")
            .field("prefetcher", &self.prefetcher)
            .field("chunks", &self.feeds.iter().map(|(c, _)| *c).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ChunkFeeds {
    /// A prefetcher for `device` reading `dataset` with `depth`, its epoch keys seeded by `seed`;
    /// a rank waits at most `deadline` for any one batch.
    ///
    /// # Errors
    /// Data errors when the prefetcher's stream or thread cannot be created.
    pub(crate) fn new(
        dataset: Arc<dyn Dataset>,
        device: Device,
        depth: Depth,
        seed: u64,
        deadline: Duration,
    ) -> Result<Self> {
        let mut config = PrefetchConfig::new(dataset.len(), seed);
        config.depth = depth;
        let prefetcher = Prefetcher::new(dataset, device, config)?;
        Ok(ChunkFeeds { prefetcher, feeds: VecDeque::new(), waited: Duration::ZERO, deadline })
    }

    /// Makes sure `wanted` (the current chunk, then the next ones, at most [`CHUNKS_AHEAD`]
    /// used) have feeds, in that order; `picks(chunk)` gives a chunk's batches. Feeds of chunks
    /// no longer wanted there are dropped (their plans cancelled).
    ///
    /// # Errors
    /// The errors of `picks`, or of starting a plan (the prefetch thread is gone).
    pub(crate) fn ensure(
        &mut self,
        wanted: &[Chunk],
        mut picks: impl FnMut(Chunk) -> Result<Vec<BatchPicks>>,
    ) -> Result<()> {
        let wanted = &wanted[..wanted.len().min(CHUNKS_AHEAD)];
        let kept = self.feeds.iter().zip(wanted).take_while(|((have, _), want)| have == *want);
        let kept = kept.count();
        self.feeds.truncate(kept);
        for &chunk in &wanted[kept..] {
            let feed = self.prefetcher.start(chunk.epoch as u64, picks(chunk)?)?;
            tracing::trace!(?chunk, depth = feed.depth(), "chunk feed started");
            self.feeds.push_back((chunk, feed));
        }
        Ok(())
    }

    /// Waits up to `poll` for batch `index` of `chunk` (whose feed [`ensure`](Self::ensure)
    /// started first); `None` when it is not ready yet.
    ///
    /// # Errors
    /// [`Error::Timeout`] once the rank has waited longer than its deadline for this batch; the
    /// batch's fetch or upload error; [`Error::Prefetch`] when the feed is not the chunk's or
    /// delivers another batch than `index`.
    pub(crate) fn next(
        &mut self,
        chunk: Chunk,
        index: usize,
        poll: Duration,
    ) -> Result<Option<DeviceBatch>> {
        let Some((front, feed)) = self.feeds.front_mut() else {
            return Err(Error::Prefetch(format!("no feed for {chunk:?}")));
        };
        if *front != chunk {
            return Err(Error::Prefetch(format!("feed of {front:?} while training {chunk:?}")));
        }
        let t0 = Instant::now();
        match feed.next_timeout(poll.min(self.deadline))? {
            Next::Batch(batch) => {
                self.waited = Duration::ZERO;
                if batch.index() != index {
                    return Err(Error::Prefetch(format!(
                        "batch {} of {chunk:?} delivered, batch {index} expected",
                        batch.index()
                    )));
                }
                Ok(Some(batch))
            }
            Next::Pending => {
                self.waited += t0.elapsed();
                if self.waited >= self.deadline {
                    return Err(Error::Timeout { what: "a prefetched batch", after: self.waited });
                }
                Ok(None)
            }
            Next::Done => {
                Err(Error::Prefetch(format!("{chunk:?} has no batch {index}: its feed is done")))
            }
        }
    }

    /// Drops the feed of `chunk`, every batch of which was trained.
    pub(crate) fn finished(&mut self, chunk: Chunk) {
        if self.feeds.front().is_some_and(|(c, _)| *c == chunk) {
            self.feeds.pop_front();
        }
    }
}

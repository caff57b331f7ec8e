//! Rank-side staging: whether a rank keeps its upcoming samples in a host cache filled ahead
//! from the coordinator's stage advisories (BEHAVIOUR §9.3), and the rank's stager.

use std::sync::Arc;

use flodl_data::{CacheReport, Dataset, Eviction, FetchCost, StagingCache, StagingConfig};
use flodl_tensor::Device;

use crate::link::wire::Chunk;
use crate::{LogicError, LogicResult, Result};

/// Share of the host's available memory that the staging caches of one process may take under
/// [`Staging::Auto`] (§9.2's `ram_max_usage`), split evenly among the process's ranks.
const AUTO_RAM_SHARE: f64 = 0.5;

/// The advised stream a rank keeps, in cache capacities: a sample farther than this is never
/// admitted before the next advisory anyway (everything nearer would be evicted for it first).
const LOOKAHEAD_CAPACITIES: usize = 2;

/// Whether each rank stages its training samples in a host cache, filled ahead on a background
/// thread along the coordinator's advisories, evicting the sample needed farthest ahead.
///
/// Staging changes where a batch's samples are read from, never which samples or in what
/// order: a run trains the same batches either way. It composes with [`crate::Prefetch`]: the
/// prefetcher reads through the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Staging {
    /// On for a dataset that reads from storage ([`FetchCost::Storage`]), with a budget of half
    /// the host's available memory shared by the process's ranks (at most the dataset's
    /// size); off for a dataset in memory.
    #[default]
    Auto,
    /// Off on every rank: each fetch reads the dataset.
    Off,
    /// On for every rank with this host budget in bytes and eviction rule ([`Eviction::Lru`]
    /// ignores the advisories and fills nothing ahead: the baseline to compare with).
    Budget {
        /// Host bytes each rank's cache may take.
        bytes: u64,
        /// What a full cache gives up.
        eviction: Eviction,
    },
}

impl Staging {
    /// A budget of `bytes` per rank with next-use eviction.
    pub fn bytes(bytes: u64) -> Staging {
        Staging::Budget { bytes, eviction: Eviction::NextUse }
    }

    /// Whether the coordinator sends stage advisories (ranks without a cache ignore them).
    pub(crate) fn advises(self) -> bool {
        self != Staging::Off
    }

    /// The cache a rank reading `dataset` runs with, one of `ranks_here` ranks of its process;
    /// `None` when it does not stage.
    pub fn config_for(self, dataset: &dyn Dataset, ranks_here: usize) -> Option<StagingConfig> {
        match self {
            Staging::Off => None,
            Staging::Auto if dataset.fetch_cost() == FetchCost::Memory => None,
            Staging::Auto => {
                let available = flodl_tensor::devices()
                    .into_iter()
                    .find(|d| d.device == Device::Cpu)
                    .map_or(0, |d| d.free_memory);
                let share = available as f64 * AUTO_RAM_SHARE / ranks_here.max(1) as f64;
                let whole = dataset.len().saturating_mul(dataset.layout().sample_bytes());
                Some(StagingConfig::new((share as usize).min(whole)))
            }
            Staging::Budget { bytes, eviction } => {
                let mut config = StagingConfig::new(usize::try_from(bytes).unwrap_or(usize::MAX));
                config.eviction = eviction;
                Some(config)
            }
        }
    }
}

impl std::fmt::Display for Staging {
    /// `auto`, `off`, or the budget in bytes (`:lru` appended for LRU eviction).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Staging::Auto => f.write_str("auto"),
            Staging::Off => f.write_str("off"),
            Staging::Budget { bytes, eviction: Eviction::NextUse } => write!(f, "{bytes}"),
            Staging::Budget { bytes, eviction: Eviction::Lru } => write!(f, "{bytes}:lru"),
        }
    }
}

impl std::str::FromStr for Staging {
    type Err = LogicError;

    /// `auto`, `off`, or a budget — bytes with an optional `K`, `M` or `G` suffix (powers of
    /// 1024) — optionally followed by `:lru` or `:next-use`.
    fn from_str(s: &str) -> LogicResult<Staging> {
        let bad = || LogicError::Parse {
            what: "staging",
            input: s.to_string(),
            expected: "auto, off, or a budget such as 512M (optionally :lru or :next-use)",
        };
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "auto" => return Ok(Staging::Auto),
            "off" => return Ok(Staging::Off),
            _ => {}
        }
        let (size, eviction) = match lower.split_once(':') {
            None => (lower.as_str(), Eviction::NextUse),
            Some((size, "lru")) => (size, Eviction::Lru),
            Some((size, "next-use" | "next_use")) => (size, Eviction::NextUse),
            Some(_) => return Err(bad()),
        };
        let (digits, unit) = match size.as_bytes().last() {
            Some(b'k') => (&size[..size.len() - 1], 1u64 << 10),
            Some(b'm') => (&size[..size.len() - 1], 1 << 20),
            Some(b'g') => (&size[..size.len() - 1], 1 << 30),
            _ => (size, 1),
        };
        let n: u64 = digits.trim().parse().map_err(|_| bad())?;
        let bytes = n.checked_mul(unit).ok_or_else(bad)?;
        Ok(Staging::Budget { bytes, eviction })
    }
}

/// A rank's staging cache in front of its training set, and how far ahead it keeps the
/// advised stream.
#[derive(Debug)]
pub(crate) struct Stager {
    cache: Arc<StagingCache>,
    lookahead: usize,
}

impl Stager {
    /// A cache of `config` in front of `dataset`, with its background fill started.
    ///
    /// # Errors
    /// Data errors when the fill thread cannot start.
    pub(crate) fn new(dataset: Arc<dyn Dataset>, config: StagingConfig) -> Result<Stager> {
        let cache = Arc::new(StagingCache::new(dataset, config)?);
        let lookahead = cache.capacity().saturating_mul(LOOKAHEAD_CAPACITIES).max(1);
        tracing::debug!(budget = config.budget_bytes, capacity = cache.capacity(), "staging on");
        Ok(Stager { cache, lookahead })
    }

    /// The cache, read through as the rank's dataset.
    pub(crate) fn dataset(&self) -> Arc<dyn Dataset> {
        self.cache.clone()
    }

    /// Advises the cache of the samples of `chunks` (positions of their epochs' permutations,
    /// `perm(epoch)`), skipping the first `skip` positions (those the rank has trained of the
    /// chunk it is in), up to the lookahead.
    pub(crate) fn advise<'p>(
        &self,
        chunks: &[Chunk],
        skip: usize,
        mut perm: impl FnMut(usize) -> &'p [usize],
    ) {
        let mut samples = Vec::new();
        let mut skip = skip;
        for c in chunks {
            let left = self.lookahead.saturating_sub(samples.len());
            if left == 0 {
                break;
            }
            let p = perm(c.epoch);
            let start = (c.offset + skip).min(c.end());
            skip = 0;
            let end = c.end().min(p.len()).min(start + left);
            samples.extend_from_slice(p.get(start..end).unwrap_or(&[]));
        }
        self.cache.advise(samples);
    }
}

/// Adds a fetch's report to a tally of a chunk's work.
pub(crate) fn tally(into: &mut Option<crate::CacheTally>, report: Option<CacheReport>) {
    if let Some(r) = report {
        let t = into.get_or_insert_with(crate::CacheTally::default);
        t.hits += r.hits as u64;
        t.misses += r.misses as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_parses_and_prints() -> LogicResult<()> {
        let cases = [
            ("auto", Staging::Auto, "auto"),
            ("OFF", Staging::Off, "off"),
            ("4096", Staging::bytes(4096), "4096"),
            ("512M", Staging::bytes(512 << 20), "536870912"),
            (
                "2g:lru",
                Staging::Budget { bytes: 2 << 30, eviction: Eviction::Lru },
                "2147483648:lru",
            ),
            ("1k:next-use", Staging::bytes(1024), "1024"),
        ];
        for (input, want, shown) in cases {
            let got: Staging = input.parse()?;
            assert_eq!(got, want, "{input}");
            assert_eq!(got.to_string(), shown, "{input}");
            assert_eq!(shown.parse::<Staging>()?, want, "{input}");
        }
        for bad in ["", "x", "12q", "5M:fifo", "99999999999999999999G"] {
            assert!(bad.parse::<Staging>().is_err(), "{bad:?} parsed");
        }
        Ok(())
    }
}

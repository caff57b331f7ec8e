//! When to average (`Policy`), how (`Backend`), and the pure reduce-trigger and throttle rules.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::control::elche::Membership;
use crate::control::logic_error::{LogicError, LogicResult};

/// When the replicas are averaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Policy {
    /// After every step of every rank.
    Sync,
    /// When every rank has finished its ElChe window (ranks are held at the barrier).
    #[default]
    Cadence,
    /// When every rank has reached its ElChe count; ranks keep training up to `count +
    /// max_overshoot` while the reduce is under way.
    Async,
}

impl Policy {
    /// Every policy, in declaration order.
    pub const ALL: [Policy; 3] = [Policy::Sync, Policy::Cadence, Policy::Async];

    /// The lower-case name (`"sync"`, `"cadence"`, `"async"`).
    pub fn name(self) -> &'static str {
        match self {
            Policy::Sync => "sync",
            Policy::Cadence => "cadence",
            Policy::Async => "async",
        }
    }

    /// True when chunks are dispatched progressively (sized by ElChe) rather than as one static
    /// share per rank; `Sync` keeps static shares so its runs are deterministic.
    pub fn is_progressive(self) -> bool {
        !matches!(self, Policy::Sync)
    }

    /// Epochs a rank may work past the oldest unfinished one: 0 (an epoch barrier) for the
    /// barrier-paced `Sync` and `Cadence`, 1 for `Async`.
    pub fn lookahead(self) -> usize {
        match self {
            Policy::Sync | Policy::Cadence => 0,
            Policy::Async => 1,
        }
    }

    /// A rank's window numbered `round`, from its ElChe `count` and the overshoot bound: one
    /// step under `Sync`, `count` under `Cadence`, `count` and up to `overshoot` more under
    /// `Async`.
    pub fn window(self, round: u64, count: usize, overshoot: usize) -> Window {
        let count = count.max(1);
        let (target, limit) = match self {
            Policy::Sync => (1, 1),
            Policy::Cadence => (count, count),
            Policy::Async => (count, count + overshoot),
        };
        Window { round, target, limit }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = LogicError;

    fn from_str(s: &str) -> LogicResult<Policy> {
        let lower = s.trim().to_ascii_lowercase();
        Policy::ALL.into_iter().find(|p| p.name() == lower).ok_or_else(|| LogicError::Parse {
            what: "policy",
            input: s.to_string(),
            expected: "sync, cadence, async",
        })
    }
}

/// How the replicas are averaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Backend {
    /// In-place weighted all-reduce on the devices (NCCL, or the host collective for CPU ranks).
    #[default]
    Collective,
    /// Snapshots averaged on the host and sent back; no device blocks on a barrier.
    Host,
}

impl Backend {
    /// Every backend, in declaration order.
    pub const ALL: [Backend; 2] = [Backend::Collective, Backend::Host];

    /// The lower-case name (`"collective"`, `"host"`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Collective => "collective",
            Backend::Host => "host",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = LogicError;

    fn from_str(s: &str) -> LogicResult<Backend> {
        let lower = s.trim().to_ascii_lowercase();
        Backend::ALL.into_iter().find(|b| b.name() == lower).ok_or_else(|| LogicError::Parse {
            what: "backend",
            input: s.to_string(),
            expected: "collective, host",
        })
    }
}

/// A rank's reduce window: train `target` batches before the reduce (then report ready),
/// never more than `limit` (larger under `Async`; the rank then waits for the reduce).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// The window's number (the reduce that ends it has the same number).
    pub round: u64,
    /// Batches that make the rank ready for the reduce.
    pub target: usize,
    /// Batches after which the rank waits for the reduce.
    pub limit: usize,
}

/// What the cohort has done since the last reduce, per rank.
#[derive(Debug, Clone, Copy)]
pub struct Cohort<'a> {
    /// Steps trained since the last reduce.
    pub steps: &'a [u64],
    /// Compute wall time in ms since the last reduce.
    pub compute_ms: &'a [f64],
    /// ElChe's window counts.
    pub counts: &'a [usize],
    /// Which ranks are alive (retired ranks are ignored).
    pub membership: &'a [Membership],
    /// ElChe's `anchor_wall_ms()` (0 until calibrated).
    pub anchor_wall_ms: f64,
}

/// The reduce trigger's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Reduce now.
    Fire,
    /// The previous round has not finished (host round in progress, or collective acks
    /// pending).
    RoundInFlight,
    /// Every rank is retired.
    NoLiveRank,
    /// This rank (the first found) is not ready yet.
    Waiting {
        /// The rank that holds the reduce back.
        rank: usize,
    },
}

/// Whether to reduce now, as a pure function of the cohort's progress.
///
/// Every live rank must have trained at least one step (a rank still in data setup would
/// deadlock a collective). Then:
/// * `Sync`: fire.
/// * `Async`: every live rank has reached its count (overshoot is intended).
/// * `Cadence`: every live rank is *done*: it reached its count, **or**, once ElChe is
///   calibrated, its compute time reached `anchor_wall_ms`. The [0.5] rule (wall time only) makes
///   a rank that turned out faster than estimated idle at its count until its clock catches up;
///   the [0.6+] rule (count only) makes everyone wait for a rank that turned out slower. The
///   per-rank union fires at the earliest moment every rank has done either its share of work
///   or a window's worth of time.
///
/// # Errors
/// [`LogicError::WorldMismatch`] when the slices differ in length.
pub fn should_reduce(
    policy: Policy,
    cohort: &Cohort<'_>,
    round_in_flight: bool,
) -> LogicResult<Trigger> {
    let w = cohort.membership.len();
    for (what, len) in [
        ("steps", cohort.steps.len()),
        ("compute_ms", cohort.compute_ms.len()),
        ("counts", cohort.counts.len()),
    ] {
        if len != w {
            return Err(LogicError::WorldMismatch { what, expected: w, got: len });
        }
    }
    if round_in_flight {
        return Ok(Trigger::RoundInFlight);
    }
    let mut live = (0..w).filter(|&r| cohort.membership[r] == Membership::Alive).peekable();
    if live.peek().is_none() {
        return Ok(Trigger::NoLiveRank);
    }
    for r in live {
        let steps = cohort.steps[r];
        let count = cohort.counts[r].max(1) as u64;
        let ready = steps >= 1
            && match policy {
                Policy::Sync => true,
                Policy::Async => steps >= count,
                Policy::Cadence => {
                    steps >= count
                        || (cohort.anchor_wall_ms > 0.0
                            && cohort.compute_ms[r] >= cohort.anchor_wall_ms)
                }
            };
        if !ready {
            return Ok(Trigger::Waiting { rank: r });
        }
    }
    Ok(Trigger::Fire)
}

/// The ranks to throttle now (host backend only).
///
/// With `max_batch_diff = Some(d)`, a live rank more than `d` steps ahead of the slowest live
/// rank is throttled once per window (`already[r]` marks ranks throttled since the last reduce;
/// the caller resets it after each reduce). The collective backend never throttles: the
/// collective is its only rendezvous, and a throttled rank would deadlock it.
///
/// # Errors
/// [`LogicError::WorldMismatch`] when the slices differ in length.
pub fn throttle(
    backend: Backend,
    max_batch_diff: Option<usize>,
    steps: &[u64],
    membership: &[Membership],
    already: &[bool],
) -> LogicResult<Vec<usize>> {
    let w = membership.len();
    for (what, len) in [("steps", steps.len()), ("already", already.len())] {
        if len != w {
            return Err(LogicError::WorldMismatch { what, expected: w, got: len });
        }
    }
    let (Backend::Host, Some(d)) = (backend, max_batch_diff) else { return Ok(Vec::new()) };
    let live: Vec<usize> = (0..w).filter(|&r| membership[r] == Membership::Alive).collect();
    let Some(min) = live.iter().map(|&r| steps[r]).min() else { return Ok(Vec::new()) };
    Ok(live.into_iter().filter(|&r| !already[r] && steps[r] > min + d as u64).collect())
}

/// True when every rank should be throttled right after the host round requested snapshots:
/// under `Sync` on the host backend nobody may train on parameters about to be overwritten.
pub fn throttle_all_on_request(policy: Policy, backend: Backend) -> bool {
    policy == Policy::Sync && backend == Backend::Host
}

//! When to average (`Policy`), how (`Backend`), each rank's reduce `Window` and the reduce
//! trigger.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::control::logic_error::{LogicError, LogicResult};

/// When the replicas are averaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// After every step of every rank.
    Sync,
    /// When every rank has finished its ElChe window: its count, or (once ElChe is
    /// calibrated) the anchor rank's window of time, whichever comes first (ranks are held at
    /// the barrier). Once calibrated, the other ranks follow the anchor: they train on past
    /// their count until the anchor is ready (see [`Window::following`]).
    #[default]
    Cadence,
    /// When every rank has reached its ElChe count; ranks keep training up to `count +
    /// max_overshoot` while the reduce is under way. Once calibrated, the other ranks follow
    /// the anchor as under `Cadence` (see [`Window::following`]).
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

    /// A rank's window numbered `round`, from its ElChe `count`, the overshoot bound and
    /// ElChe's `anchor_wall_ms` (0 until calibrated): one step under `Sync`; `count` under
    /// `Cadence`, or less once the rank has computed `anchor_wall_ms`; `count` and up to
    /// `overshoot` more under `Async`.
    ///
    /// The `Cadence` rule is the union of [0.5]'s (ready once the rank's time reaches the
    /// anchor's window wall time) and [0.6+]'s (ready at the count): wall time alone makes a
    /// rank that turned out faster than estimated idle at its count until its clock catches up;
    /// the count alone makes everyone wait for a rank that turned out slower. With both, the
    /// reduce fires at the earliest moment every rank has done its share of work or a window's
    /// worth of time. A rank's clock is its wall time since the window opened (not [0.5]'s
    /// compute time): what it did besides training (an evaluation, a checkpoint part, being
    /// descheduled) then never makes the anchor wait for it. This is the anchor's window; the
    /// coordinator gives the ranks that follow it [`Window::following`].
    pub fn window(self, round: u64, count: usize, overshoot: usize, anchor_wall_ms: f64) -> Window {
        let count = count.max(1);
        let (target, limit) = match self {
            Policy::Sync => (1, 1),
            Policy::Cadence => (count, count),
            Policy::Async => (count, count + overshoot),
        };
        let wall = (self == Policy::Cadence && anchor_wall_ms.is_finite() && anchor_wall_ms > 0.0)
            .then(|| Duration::from_secs_f64(anchor_wall_ms / 1000.0));
        Window { round, target, limit, wall }
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
#[serde(rename_all = "lowercase")]
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

/// A rank's reduce window: train `target` batches (or compute for `wall`) before the reduce,
/// then report ready; never more than `limit` batches (larger under `Async`; the rank then
/// waits for the reduce).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// The window's number (the reduce that ends it has the same number).
    pub round: u64,
    /// Batches that make the rank ready for the reduce.
    pub target: usize,
    /// Batches after which the rank waits for the reduce.
    pub limit: usize,
    /// Wall time since the window opened that makes the rank ready short of `target`
    /// (`Cadence` once ElChe is calibrated: the anchor's window); `None`: the count alone.
    pub wall: Option<Duration>,
}

/// A rank following the anchor may train past its count (and its wall time) by
/// `1 / FOLLOW_SLACK` of it: see [`Window::following`].
pub(crate) const FOLLOW_SLACK: u32 = 4;

/// How far past its count a rank may train in a probe window ([`Window::probing`]).
pub(crate) const PROBE_STRETCH: usize = 32;

/// A probe window trains at most this part of an epoch on one rank (`1 / PROBE_EPOCH_PART`),
/// past its count: in a small epoch, a rank whose peers are slow to take their first steps
/// must not train most of it alone before the first average.
const PROBE_EPOCH_PART: usize = 8;

/// The most batches one rank trains in a probe window of an epoch of `batches_per_epoch`
/// ([`PROBE_EPOCH_PART`]; the `most` of [`Window::probing`]). It does not shrink with the
/// world: a quarter of a rank's even share (an epoch over 4 × world) held the fast rank of 3
/// and 4 ranks at 10× to 78 and 58 batches of MNIST's 937, below the ~100 the slowest's count
/// of 10 takes, and it waited the rest of the window.
pub(crate) fn probe_most(batches_per_epoch: usize) -> usize {
    batches_per_epoch / PROBE_EPOCH_PART
}

impl Window {
    /// This window for a rank that follows the anchor (`Cadence` and `Async`): its count and
    /// wall time stretched by a quarter (`FOLLOW_SLACK`; at least one batch more), its
    /// overshoot kept past that. The coordinator tells the rank when the anchor is ready, and
    /// it reports the steps it has trained by then, short of or past its count
    /// ([`Window::ended_at`]); the stretched window only bounds how long it trains when the
    /// anchor turns out slower than estimated.
    ///
    /// With the count alone (BEHAVIOUR's rule), the anchor waits whenever it finishes before a
    /// follower reaches its count or the anchor's estimated wall time: every window in which
    /// the anchor runs faster than its own average, or a follower slower than its own, costs
    /// the anchor the difference; and under `Async` a follower whose count and overshoot run
    /// out first waits for the anchor. Following leaves the anchor one follower batch and a
    /// message's delivery to wait at most, and a follower nothing until its stretched bound.
    pub fn following(self) -> Window {
        let slack = FOLLOW_SLACK as usize;
        let target = self.target + self.target.div_ceil(slack).max(1);
        Window {
            target,
            limit: target + self.overshoot(),
            wall: self.wall.map(|w| w + w / FOLLOW_SLACK),
            ..self
        }
    }

    /// This window with no overshoot, for the rank the reduce waits for last: the calibrated
    /// anchor (which matters under `Async`; `Cadence` has no overshoot), and before calibration
    /// the one rank not yet ready once all others are. The reduce starts once that rank has
    /// reported, so a batch it began past its count would hold every rank until it ends (on
    /// the collective backend, inside the all-reduce: up to one of its batches per reduce).
    pub fn anchored(self) -> Window {
        Window { limit: self.target, ..self }
    }

    /// This window as a probe: the first window of `Cadence` and `Async` while ElChe has no
    /// timing (and no speed hint). Every rank is handed the same count blind; a rank that
    /// reaches it reports ready (its reading for ElChe: that count in that wall time) and goes
    /// on training, up to 32 (`PROBE_STRETCH`) times the count but never past `most` batches (a
    /// share of an epoch: a rank whose peers are still starting must not train a small epoch
    /// alone before the first average), until the slowest rank is ready too and the reduce
    /// takes in every step trained. With the count alone, the fastest rank of a 10x skew
    /// waited nine tenths of the first window (a tenth of a 1-epoch MNIST run, the slow rank's
    /// cold start included), and a transformer's fast rank nine slow steps.
    pub fn probing(self, most: usize) -> Window {
        let stretched = self.target.saturating_mul(PROBE_STRETCH).min(most);
        Window { limit: self.limit.max(stretched), ..self }
    }

    /// The window ended at `steps`: the rank is ready now, and trains no more before the reduce
    /// than the window's overshoot (none under `Cadence`): a follower told the anchor is ready.
    pub fn ended_at(self, steps: usize) -> Window {
        Window { target: steps, limit: steps + self.overshoot(), ..self }
    }

    /// Batches the rank may train past its target while the reduce is under way (`Async`).
    pub fn overshoot(&self) -> usize {
        self.limit.saturating_sub(self.target)
    }

    /// Whether a rank that trained `steps` batches in this window, open for `clock_ms` of wall
    /// time, is ready for the reduce: it reached `target`, or it trained at least one batch and
    /// its window has lasted `wall`.
    pub fn is_reached(&self, steps: usize, clock_ms: f64) -> bool {
        steps >= self.target
            || (steps >= 1 && self.wall.is_some_and(|w| clock_ms >= w.as_secs_f64() * 1000.0))
    }
}

/// The reduce trigger's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// Reduce now.
    Fire,
    /// The previous reduce has not finished.
    RoundInFlight,
    /// Every rank is retired.
    NoLiveRank,
    /// This rank (the first found) has not said it is ready yet.
    Waiting {
        /// The rank that holds the reduce back.
        rank: usize,
    },
    /// Every live rank is ready and none trained a step since the last reduce: nothing to
    /// average (the run may be over).
    Idle,
}

/// Whether to reduce now, from what the live ranks said since the last reduce: `ready[r]` is
/// the steps rank `r` trained when it reported ready (it reached its [`Window`], see
/// [`Window::is_reached`], or ran out of work), `None` while it has not; `live[r]` is false for
/// a retired rank, which is ignored.
///
/// The reduce fires once every live rank is ready and at least one trained a step. A rank that
/// trained none joins with weight zero: it is ready only when waiting for work, servicing its
/// messages, so it cannot hold a collective up.
///
/// # Errors
/// [`LogicError::WorldMismatch`] when the slices differ in length.
pub(crate) fn should_reduce(
    ready: &[Option<usize>],
    live: &[bool],
    round_in_flight: bool,
) -> LogicResult<Trigger> {
    if ready.len() != live.len() {
        return Err(LogicError::WorldMismatch {
            what: "ready",
            expected: live.len(),
            got: ready.len(),
        });
    }
    if round_in_flight {
        return Ok(Trigger::RoundInFlight);
    }
    let mut stepped = false;
    let mut any = false;
    for (rank, steps) in ready.iter().enumerate().filter(|&(r, _)| live[r]) {
        any = true;
        match steps {
            None => return Ok(Trigger::Waiting { rank }),
            Some(s) => stepped |= *s > 0,
        }
    }
    Ok(match (any, stepped) {
        (false, _) => Trigger::NoLiveRank,
        (true, true) => Trigger::Fire,
        (true, false) => Trigger::Idle,
    })
}

#[cfg(test)]
mod tests {
    //! Policies, backends, windows and the reduce trigger against hand-computed cases.

    use std::time::Duration;

    use crate::LogicError;
    use crate::control::policy::{
        Backend, PROBE_STRETCH, Policy, Trigger, Window, probe_most, should_reduce,
    };

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn names_round_trip() -> TestResult {
        for p in Policy::ALL {
            assert_eq!(p.to_string().parse::<Policy>()?, p);
        }
        for b in Backend::ALL {
            assert_eq!(b.to_string().parse::<Backend>()?, b);
        }
        assert_eq!(" Cadence ".parse::<Policy>()?, Policy::Cadence);
        assert_eq!("HOST".parse::<Backend>()?, Backend::Host);
        assert!(matches!("nccl".parse::<Backend>(), Err(LogicError::Parse { .. })));
        assert!(matches!("often".parse::<Policy>(), Err(LogicError::Parse { .. })));
        assert_eq!((Policy::default(), Backend::default()), (Policy::Cadence, Backend::Collective));
        let json = serde_json::to_string(&(Policy::Async, Backend::Host))?;
        assert_eq!(
            serde_json::from_str::<(Policy, Backend)>(&json)?,
            (Policy::Async, Backend::Host)
        );
        Ok(())
    }

    #[test]
    fn windows_by_policy() {
        let ms = |ms: u64| Some(Duration::from_millis(ms));
        let w = |target, limit, wall| Window { round: 7, target, limit, wall };
        // (policy, count, overshoot, anchor wall ms, window, progressive)
        let cases = [
            (Policy::Sync, 25, 3, 100.0, w(1, 1, None), false),
            (Policy::Cadence, 25, 3, 0.0, w(25, 25, None), true),
            (Policy::Cadence, 25, 3, 100.0, w(25, 25, ms(100)), true),
            (Policy::Cadence, 0, 3, f64::NAN, w(1, 1, None), true),
            (Policy::Async, 25, 3, 100.0, w(25, 28, None), true),
        ];
        for (p, count, overshoot, wall, want, progressive) in cases {
            assert_eq!(p.window(7, count, overshoot, wall), want, "{p} {count} {wall}");
            assert_eq!(p.is_progressive(), progressive);
        }
    }

    /// A follower's window stretches the count and the wall time by a quarter (at least one batch)
    /// and keeps its overshoot; one ended early is reached where the rank stands, overshoot kept.
    #[test]
    fn following_and_cut_short_windows() {
        let ms = |ms: u64| Some(Duration::from_millis(ms));
        let w = |target, limit, wall| Window { round: 3, target, limit, wall };
        // (window, following)
        let cases = [
            (w(40, 40, ms(200)), w(50, 50, ms(250))),
            (w(41, 41, None), w(52, 52, None)),
            (w(1, 1, ms(8)), w(2, 2, ms(10))),
            (w(3, 3, None), w(4, 4, None)),
            // `Async`: the overshoot is kept past the stretched count, and past where it ends.
            (w(8, 20, None), w(10, 22, None)),
            (w(25, 28, None), w(32, 35, None)),
        ];
        for (window, want) in cases {
            assert_eq!(window.following(), want, "{window:?}");
            let over = window.limit - window.target;
            let cut = want.ended_at(7);
            assert_eq!((cut.target, cut.limit, cut.wall, cut.round), (7, 7 + over, want.wall, 3));
            assert!(cut.is_reached(7, 0.0) && !cut.is_reached(6, 0.0));
        }
    }

    #[test]
    fn a_window_is_reached_by_count_or_by_wall_time() {
        let count = Window { round: 1, target: 10, limit: 10, wall: None };
        let timed = Window { wall: Some(Duration::from_millis(100)), ..count };
        // (window, steps, ms since the window opened, reached)
        let cases = [
            (count, 9, 1e9, false),
            (count, 10, 0.0, true),
            (timed, 9, 99.9, false),
            (timed, 3, 100.0, true),
            // Faster than estimated: done by count though its clock is short.
            (timed, 10, 60.0, true),
            // No step: never ready, whatever its clock.
            (timed, 0, 500.0, false),
        ];
        for (i, (w, steps, ms, want)) in cases.into_iter().enumerate() {
            assert_eq!(w.is_reached(steps, ms), want, "case {i}");
        }
    }

    /// A probe is reached at its count like any window, and bounds the training past it at
    /// `PROBE_STRETCH` times the count or `most`, whichever is less (or the policy's own
    /// overshoot, when larger).
    #[test]
    fn a_probe_trains_past_its_count() {
        // (policy, count, overshoot, most, limit)
        let cases = [
            (Policy::Cadence, 10, 0, usize::MAX, 10 * PROBE_STRETCH),
            (Policy::Async, 10, 6, usize::MAX, 10 * PROBE_STRETCH),
            (Policy::Async, 1, 500, usize::MAX, 501),
            (Policy::Cadence, 1, 0, usize::MAX, PROBE_STRETCH),
            // A small epoch's share bounds it, never below the count or the overshoot.
            (Policy::Cadence, 10, 0, 100, 100),
            (Policy::Cadence, 10, 0, 5, 10),
            (Policy::Async, 10, 6, 12, 16),
        ];
        for (policy, count, overshoot, most, limit) in cases {
            let probe = policy.window(4, count, overshoot, 0.0).probing(most);
            assert_eq!((probe.round, probe.target, probe.limit), (4, count, limit), "{policy:?}");
            assert!(probe.is_reached(count, 0.0) && !probe.is_reached(count - 1, 0.0));
            let ended = probe.ended_at(count + 3);
            assert_eq!(ended.overshoot(), limit - count, "{policy:?}");
        }
    }

    /// A probe's bound on an MNIST epoch (937 batches of 64) lets the fastest rank train
    /// through the slowest's blind count at a 10× skew (10 × 10 of its batches) in any world;
    /// a small epoch still bounds it at an eighth.
    #[test]
    fn a_probe_covers_a_ten_times_skew_in_any_world() -> TestResult {
        // (batches per epoch, the most one rank trains)
        for (batches, most) in [(937, 117), (64, 8), (7, 0)] {
            if probe_most(batches) != most {
                return Err(
                    format!("{batches} batches: {}, want {most}", probe_most(batches)).into()
                );
            }
        }
        let probe = Policy::Cadence.window(1, 10, 0, 0.0).probing(probe_most(937));
        if probe.limit < 10 * 10 {
            return Err(format!(
                "a 10× skew's count needs 100 batches, the probe allows {}",
                probe.limit
            )
            .into());
        }
        Ok(())
    }

    #[test]
    fn trigger_cases() -> TestResult {
        let fire = Trigger::Fire;
        let wait = |rank| Trigger::Waiting { rank };
        // (steps at readiness, live, round in flight, expected)
        type Case = ([Option<usize>; 3], [bool; 3], bool, Trigger);
        let cases: [Case; 8] = [
            ([Some(1), Some(1), Some(1)], [true; 3], false, fire),
            ([Some(3), None, Some(1)], [true; 3], false, wait(1)),
            ([None, Some(2), None], [true; 3], false, wait(0)),
            // A retired rank is not waited for.
            ([Some(3), None, Some(1)], [true, false, true], false, fire),
            // An idle rank with no step joins; nobody stepped: nothing to average.
            ([Some(0), Some(4), Some(0)], [true; 3], false, fire),
            ([Some(0), Some(0), Some(0)], [true; 3], false, Trigger::Idle),
            ([Some(3), Some(3), Some(1)], [true; 3], true, Trigger::RoundInFlight),
            ([Some(3), Some(3), Some(1)], [false; 3], false, Trigger::NoLiveRank),
        ];
        for (i, (ready, live, busy, want)) in cases.into_iter().enumerate() {
            assert_eq!(should_reduce(&ready, &live, busy)?, want, "case {i}");
        }
        assert!(matches!(
            should_reduce(&[Some(1)], &[true, true], false),
            Err(LogicError::WorldMismatch { .. })
        ));
        Ok(())
    }
}

//! The hidden attacker mode of the hostile-member test: a rank process whose environment says
//! `FLODL_HOSTILE=R:ATTACK` and which is rank R lies in its messages to the controller the way
//! ATTACK says. It gives a process nothing its own key does not (an insider holding a rank's
//! key can send any frame it likes); it exists so that the controller's checks are tried by a
//! real process of the job, holding its real rank key, over the real link.

use std::cell::RefCell;

use std::time::{Duration, Instant};

use crate::Result;
use crate::control::metrics::EvalMetrics;
use crate::link::wire::{Regroup, ToCoordinator};
use crate::state::HostState;

/// The environment variable that arms the attacker mode.
pub(crate) const HOSTILE: &str = "FLODL_HOSTILE";

/// Control frames a flooding rank sends after each chunk report: past the controller's burst.
const FLOOD: usize = 100_000;
/// How long a rank that ignores its `Stop` sends on, at most, when its connection stays open.
const PERSIST: Duration = Duration::from_secs(60);

/// One attack, one per run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attack {
    /// A starting state, which only rank 0 sends.
    StartState,
    /// 10⁹ steps in every report.
    Steps,
    /// A NaN in every snapshot.
    NanSnapshot,
    /// An infinity in every snapshot.
    InfSnapshot,
    /// A value short in every snapshot.
    MisshapedSnapshot,
    /// An evaluation after the first chunk, not asked for.
    UnsolicitedEval,
    /// A group id after the first chunk, not asked for.
    UnsolicitedGroupId,
    /// The first snapshot sent again before each later one.
    Replay,
    /// A flood of frames after each chunk report.
    Flood,
    /// A pace a hundred times its own in every progress report (to be elected the evaluating
    /// rank, the fastest), and in every evaluation the accuracy of a rank whose test labels
    /// are shifted (0.3%).
    ForgedEval,
    /// A NaN snapshot, then its `Stop` ignored: the same frames sent on until the connection
    /// ends.
    Persist,
    /// Every snapshot without its checkpoint part.
    PartDropped,
    /// A NaN as the exchange's cost in every progress report (what ElChe sizes windows by).
    NanExposure,
}

impl Attack {
    fn parse(name: &str) -> Option<Attack> {
        Some(match name {
            "start-state" => Attack::StartState,
            "steps" => Attack::Steps,
            "nan-snapshot" => Attack::NanSnapshot,
            "inf-snapshot" => Attack::InfSnapshot,
            "misshaped-snapshot" => Attack::MisshapedSnapshot,
            "unsolicited-eval" => Attack::UnsolicitedEval,
            "unsolicited-group-id" => Attack::UnsolicitedGroupId,
            "replay" => Attack::Replay,
            "flood" => Attack::Flood,
            "forged-eval" => Attack::ForgedEval,
            "persist" => Attack::Persist,
            "part-dropped" => Attack::PartDropped,
            "nan-exposure" => Attack::NanExposure,
            _ => return None,
        })
    }
}

/// A rank that attacks: what it forges in place of each message.
#[derive(Debug)]
pub(crate) struct Attacker {
    attack: Attack,
    /// The first snapshot (replayed), and whether the one-off attack was made.
    kept: RefCell<(Option<ToCoordinator>, bool)>,
}

impl Attacker {
    /// The attacker `rank` is when [`HOSTILE`] names it (`None`: an honest rank).
    pub(crate) fn from_env(rank: usize) -> Option<Attacker> {
        let spec = std::env::var(HOSTILE).ok()?;
        let (r, name) = spec.split_once(':')?;
        if r.parse::<usize>().ok()? != rank {
            return None;
        }
        let attack = Attack::parse(name)?;
        tracing::warn!(rank, attack = name, "this rank attacks the controller ({HOSTILE})");
        Some(Attacker { attack, kept: RefCell::new((None, false)) })
    }

    /// What the attacker sends in place of `msg`.
    pub(crate) fn forge(&self, msg: ToCoordinator) -> Vec<ToCoordinator> {
        let mut kept = self.kept.borrow_mut();
        match (self.attack, msg) {
            (Attack::StartState, ToCoordinator::Ready { rank, shapes, holds, .. }) => {
                let params = shapes.iter().map(|s| vec![0.0; s.iter().product()]).collect();
                let initial = Some(HostState { params, buffers: Vec::new() });
                vec![ToCoordinator::Ready { rank, shapes, initial, holds }]
            }
            (
                attack @ (Attack::Steps | Attack::ForgedEval | Attack::NanExposure),
                ToCoordinator::Progress {
                    rank,
                    round,
                    mut steps,
                    mut wall_ms,
                    why,
                    works,
                    mut tail_ms,
                    mut exposed_ms,
                },
            ) => {
                match attack {
                    Attack::Steps => steps = 1_000_000_000,
                    Attack::ForgedEval => {
                        wall_ms /= 100.0;
                        tail_ms = tail_ms.map(|t| t / 100.0);
                    }
                    Attack::NanExposure => exposed_ms = Some(f64::NAN),
                    // Not reached: the arm takes the three above.
                    _ => {}
                }
                vec![ToCoordinator::Progress {
                    rank,
                    round,
                    steps,
                    wall_ms,
                    why,
                    works,
                    tail_ms,
                    exposed_ms,
                }]
            }
            (
                Attack::Steps,
                ToCoordinator::Snapshot {
                    rank,
                    round,
                    attempt,
                    state,
                    capture,
                    exchange,
                    fragment,
                    ..
                },
            ) => {
                let steps = 1_000_000_000;
                vec![ToCoordinator::Snapshot {
                    rank,
                    round,
                    attempt,
                    state,
                    steps,
                    capture,
                    exchange,
                    fragment,
                }]
            }
            (
                Attack::NanSnapshot
                | Attack::InfSnapshot
                | Attack::MisshapedSnapshot
                | Attack::Persist,
                ToCoordinator::Snapshot {
                    rank,
                    round,
                    attempt,
                    mut state,
                    steps,
                    capture,
                    exchange,
                    fragment,
                },
            ) => {
                if let Some(first) = state.params.first_mut() {
                    match self.attack {
                        Attack::NanSnapshot | Attack::Persist => {
                            first.iter_mut().for_each(|x| *x = f32::NAN);
                        }
                        Attack::InfSnapshot => first.iter_mut().for_each(|x| *x = f32::INFINITY),
                        _ => {
                            first.pop();
                        }
                    }
                }
                let forged = ToCoordinator::Snapshot {
                    rank,
                    round,
                    attempt,
                    state,
                    steps,
                    capture,
                    exchange,
                    fragment,
                };
                if self.attack == Attack::Persist {
                    kept.0 = Some(forged.clone());
                }
                vec![forged]
            }
            (Attack::UnsolicitedEval, msg @ ToCoordinator::ChunkDone { .. }) if !kept.1 => {
                kept.1 = true;
                let rank = msg.rank();
                vec![msg, ToCoordinator::Evaluated { rank, epoch: 0, eval: None }]
            }
            (Attack::UnsolicitedGroupId, msg @ ToCoordinator::ChunkDone { .. }) if !kept.1 => {
                kept.1 = true;
                let rank = msg.rank();
                vec![msg, ToCoordinator::GroupId { rank, generation: 1, how: Regroup::Host }]
            }
            (Attack::PartDropped, mut msg @ ToCoordinator::Snapshot { capture: Some(_), .. }) => {
                if let ToCoordinator::Snapshot { capture, .. } = &mut msg {
                    *capture = None;
                }
                vec![msg]
            }
            (Attack::Replay, msg @ ToCoordinator::Snapshot { .. }) => match &kept.0 {
                Some(old) => vec![old.clone(), msg],
                None => {
                    kept.0 = Some(msg.clone());
                    vec![msg]
                }
            },
            (Attack::Flood, msg @ ToCoordinator::ChunkDone { .. }) => {
                let rank = msg.rank();
                std::iter::once(msg)
                    .chain(std::iter::repeat_n(ToCoordinator::Alive { rank }, FLOOD))
                    .collect()
            }
            (Attack::ForgedEval, ToCoordinator::Evaluated { rank, epoch, eval }) => {
                let eval = eval.map(|e| EvalMetrics { accuracy: 0.003, loss: 9.0, ..e });
                vec![ToCoordinator::Evaluated { rank, epoch, eval }]
            }
            (_, msg) => vec![msg],
        }
    }

    /// What the attacker does on the controller's `Stop`: a persisting one sends on through
    /// `send` (its snapshot and a heartbeat, in turn) until a send fails (the controller ended
    /// its connection: that error is returned) or [`PERSIST`] passes; any other obeys.
    ///
    /// # Errors
    /// The send's, once the connection is gone.
    pub(crate) fn on_stop(
        &self,
        rank: usize,
        mut send: impl FnMut(ToCoordinator) -> Result<()>,
    ) -> Result<()> {
        if self.attack != Attack::Persist {
            return Ok(());
        }
        let snapshot = self.kept.borrow().0.clone();
        let started = Instant::now();
        let mut sent = 0u64;
        while started.elapsed() < PERSIST {
            let frames = snapshot.iter().cloned().chain([ToCoordinator::Alive { rank }]);
            for msg in frames {
                if let Err(e) = send(msg) {
                    tracing::warn!(
                        rank,
                        sent,
                        "the evicted rank's connection ended {:?} after its Stop",
                        started.elapsed()
                    );
                    return Err(e);
                }
                sent += 1;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        tracing::warn!(rank, sent, "the evicted rank was still heard {PERSIST:?} after its Stop");
        Ok(())
    }
}

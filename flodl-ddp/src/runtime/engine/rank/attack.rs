//! The hidden attacker mode of the hostile-member test: a rank process whose environment says
//! `FLODL_HOSTILE=R:ATTACK` and which is rank R lies in its messages to the controller the way
//! ATTACK says. It gives a process nothing its own key does not (an insider holding a rank's
//! key can send any frame it likes); it exists so that the controller's checks are tried by a
//! real process of the job, holding its real rank key, over the real link.

use std::cell::RefCell;

use crate::link::wire::{Regroup, ToCoordinator};
use crate::state::HostState;

/// The environment variable that arms the attacker mode.
pub(crate) const HOSTILE: &str = "FLODL_HOSTILE";

/// Control frames a flooding rank sends after each chunk report: past the controller's burst.
const FLOOD: usize = 100_000;

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
            (Attack::StartState, ToCoordinator::Ready { rank, shapes, .. }) => {
                let params = shapes.iter().map(|s| vec![0.0; s.iter().product()]).collect();
                let initial = Some(HostState { params, buffers: Vec::new() });
                vec![ToCoordinator::Ready { rank, shapes, initial }]
            }
            (Attack::Steps, ToCoordinator::Progress { rank, round, wall_ms, why, works, .. }) => {
                let steps = 1_000_000_000;
                vec![ToCoordinator::Progress { rank, round, steps, wall_ms, why, works }]
            }
            (
                Attack::Steps,
                ToCoordinator::Snapshot { rank, round, attempt, state, capture, exchange, .. },
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
                }]
            }
            (
                Attack::NanSnapshot | Attack::InfSnapshot | Attack::MisshapedSnapshot,
                ToCoordinator::Snapshot {
                    rank,
                    round,
                    attempt,
                    mut state,
                    steps,
                    capture,
                    exchange,
                },
            ) => {
                if let Some(first) = state.params.first_mut() {
                    match self.attack {
                        Attack::NanSnapshot => first.iter_mut().for_each(|x| *x = f32::NAN),
                        Attack::InfSnapshot => first.iter_mut().for_each(|x| *x = f32::INFINITY),
                        _ => {
                            first.pop();
                        }
                    }
                }
                vec![ToCoordinator::Snapshot {
                    rank,
                    round,
                    attempt,
                    state,
                    steps,
                    capture,
                    exchange,
                }]
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
            (_, msg) => vec![msg],
        }
    }
}

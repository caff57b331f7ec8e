//! The books that keep a copy of who is in the run, and the one place a roster's change
//! reaches them all. A book that only reads the live set takes it from the roster instead.

use std::time::Instant;

use crate::Result;
use crate::control::change::Change;
use crate::control::dispatch::{Chunk, Dispatcher};
use crate::control::elche::ElChe;
use crate::runtime::engine::host_round::{AverageJob, HostRound};
use crate::runtime::engine::slot::Slots;

/// The coordinator's books that follow membership, borrowed for one change.
#[derive(Debug)]
pub(crate) struct Books<'a> {
    /// Per-rank state: a seat entering or leaving the run starts a fresh slot.
    pub(crate) slots: &'a mut Slots,
    /// Who is handed work, and what a leaving rank held.
    pub(crate) dispatch: &'a mut Dispatcher,
    /// The cadence's per-rank estimates (`Cadence` and `Async` runs).
    pub(crate) elche: Option<&'a mut ElChe>,
    /// Host backend: the averaging round collecting snapshots, if one is.
    pub(crate) host_round: Option<&'a mut HostRound>,
    /// When each rank's last chunk report of its current life arrived.
    pub(crate) reported: &'a mut [Option<Instant>],
}

/// What the books hand back from a change, for the coordinator to act on.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// The parts of a leaving rank's chunks given back to the living.
    pub(crate) requeued: Vec<Chunk>,
    /// Host backend: the round's snapshots, complete once a leaving rank is not waited for.
    pub(crate) average: Option<AverageJob>,
}

impl Books<'_> {
    /// Hands `change` to every book. Adding a book that keeps membership is one line here.
    ///
    /// # Errors
    /// [`crate::Error::Logic`] for a rank outside ElChe's world.
    pub(crate) fn apply(self, change: &Change) -> Result<Applied> {
        self.slots.apply(change);
        let requeued = self.dispatch.apply(change);
        if let Some(elche) = self.elche {
            elche.apply(change)?;
        }
        let average = self.host_round.and_then(|round| round.apply(change));
        if let Some(at) = self.reported.get_mut(change.rank()) {
            // Its reports belong to the life that sent them.
            *at = None;
        }
        Ok(Applied { requeued, average })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::dispatch::Cutting;
    use crate::control::elche::Membership;
    use crate::control::policy::Policy;
    use crate::link::wire::Window;
    use crate::runtime::engine::fault::DeadFlags;
    use crate::runtime::engine::roster::Roster;
    use crate::state::HostState;
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    /// One move of a random run: on a seat, or on the run.
    #[derive(Debug, Clone, Copy)]
    enum Move {
        Die(usize),
        Claim(usize),
        Build(usize),
        Abandon(usize),
        Admit(usize),
        /// Every live rank is handed a chunk.
        Hand,
        /// A host round starts collecting the live ranks' snapshots.
        Round,
        /// `rank` sends its snapshot to the round.
        Snapshot(usize),
    }

    /// Every book a change reaches, owned, and the model of the host round in progress.
    struct Run {
        world: usize,
        flags: DeadFlags,
        roster: Roster,
        slots: Slots,
        dispatch: Dispatcher,
        elche: ElChe,
        round: Option<HostRound>,
        /// The ranks the round in collection waits for or has: live at its start, not left.
        in_round: Vec<bool>,
        sent: Vec<bool>,
        reported: Vec<Option<Instant>>,
    }

    impl Run {
        fn new(world: usize, cutting: Cutting) -> Result<Run> {
            let flags = DeadFlags::new(world);
            let window = Window { round: 1, target: 1, limit: 1, wall: None };
            Ok(Run {
                world,
                roster: Roster::new(world, flags.clone()),
                flags,
                slots: Slots::new(vec![window; world]),
                dispatch: Dispatcher::new(world, 4, 64, 3, cutting),
                elche: ElChe::new(world, 4)?,
                round: None,
                in_round: vec![false; world],
                sent: vec![false; world],
                reported: vec![Some(Instant::now()); world],
            })
        }

        /// The coordinator's fan-out, on these books.
        fn apply(&mut self, change: &Change) -> Result<Applied> {
            let books = Books {
                slots: &mut self.slots,
                dispatch: &mut self.dispatch,
                elche: Some(&mut self.elche),
                host_round: self.round.as_mut(),
                reported: &mut self.reported,
            };
            let applied = books.apply(change)?;
            if !matches!(change, Change::Joined { .. })
                && let Some(flag) = self.in_round.get_mut(change.rank())
            {
                *flag = false;
            }
            if applied.average.is_some() {
                self.round = None;
            }
            Ok(applied)
        }

        /// Plays `step`; returns the change the roster emitted, if any.
        fn play(&mut self, step: Move) -> Result<Option<Change>> {
            let change = match step {
                Move::Die(rank) => self.roster.die(rank, 0),
                Move::Admit(rank) => self.roster.admit(rank),
                Move::Claim(rank) => {
                    self.roster.claim(rank);
                    None
                }
                Move::Build(rank) => {
                    self.roster.built(rank);
                    None
                }
                Move::Abandon(rank) => {
                    self.roster.abandon(rank);
                    None
                }
                Move::Hand => {
                    let counts = self.elche.counts().to_vec();
                    for rank in self.roster.live() {
                        self.dispatch.next_chunk(rank, &counts, false, Instant::now());
                        if let Some(slot) = self.slots.get_mut(rank) {
                            slot.in_flight += 1;
                        }
                    }
                    None
                }
                Move::Round => {
                    if self.round.is_none() {
                        let live = self.roster.live();
                        let (world, now) = (self.world, Instant::now());
                        self.round =
                            Some(HostRound::new(1, world, &live, now, vec![], None, vec![], None));
                        self.in_round = (0..world).map(|r| live.contains(&r)).collect();
                        self.sent = vec![false; world];
                    }
                    None
                }
                Move::Snapshot(rank) => {
                    if let Some(round) = self.round.as_mut() {
                        let state = HostState { params: vec![vec![1.0]], buffers: vec![] };
                        if round.collect(rank, 1, 0, state, 1).is_some() {
                            self.round = None;
                        }
                        if let Some(sent) = self.sent.get_mut(rank) {
                            *sent = true;
                        }
                    }
                    None
                }
            };
            if let Some(change) = change {
                self.apply(&change)?;
            }
            Ok(change)
        }

        /// Every book against the roster: the same live set in the dispatcher and ElChe (a
        /// rank out of the run counts nothing); a rank's dead flag set from its death to its
        /// admission; the host round waits for exactly the ranks live at its start, still in
        /// the run, not yet in; a seat that changed has a fresh slot and no report.
        fn agree(&self, change: Option<Change>, died: &[bool]) -> std::result::Result<(), String> {
            let live = self.roster.live();
            let dispatch = self.ranks(|r| self.dispatch.is_live(r));
            let elche = self.ranks(|r| self.elche.membership()[r] == Membership::Alive);
            let counted = self.ranks(|r| self.elche.counts()[r] > 0);
            if dispatch != live || elche != live || counted != live {
                return Err(format!(
                    "live {live:?}: dispatch {dispatch:?}, ElChe {elche:?}, counted {counted:?}"
                ));
            }
            let flagged = self.ranks(|r| self.flags.is_dead(r));
            if flagged != self.ranks(|r| died[r]) {
                return Err(format!("dead flags {flagged:?}, deaths {died:?}"));
            }
            if let Some(round) = &self.round {
                let waited = self.ranks(|r| self.in_round[r] && !self.sent[r]);
                if round.missing() != waited || waited.iter().any(|r| !live.contains(r)) {
                    return Err(format!("round waits for {:?}, not {waited:?}", round.missing()));
                }
            }
            if let Some(change) = change {
                let rank = change.rank();
                if self.slots.get(rank).is_none_or(|s| s.in_flight != 0)
                    || self.reported.get(rank).is_none_or(Option::is_some)
                {
                    return Err(format!("{change:?}: rank {rank}'s slot or report kept"));
                }
            }
            Ok(())
        }

        /// The ranks `pick` holds, in order.
        fn ranks(&self, pick: impl Fn(usize) -> bool) -> Vec<usize> {
            (0..self.world).filter(|&r| pick(r)).collect()
        }
    }

    /// Random runs: some seats vacant at the start, then deaths, claims, joiners built, gone
    /// and admitted, work handed out, host rounds collecting, in random order. After every
    /// move each book follows the roster's live set (see `Run::agree`), under both cuts.
    #[test]
    fn every_book_follows_the_roster() -> std::result::Result<(), Box<dyn std::error::Error>> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(26);
        let mut changes = [0usize; 3];
        for case in 0..600 {
            let world = rng.random_range(1..7);
            let policy = if case % 2 == 0 { Policy::Sync } else { Policy::Cadence };
            let mut run = Run::new(world, Cutting::for_policy(policy, 1))?;
            // The reference: who died and was not admitted since.
            let mut died = vec![false; world];
            for rank in 0..world {
                let change = if rng.random_bool(0.2) {
                    run.roster.vacate(rank, Instant::now())
                } else {
                    run.roster.started(rank);
                    None
                };
                if let Some(change) = change {
                    run.apply(&change)?;
                    changes[0] += 1;
                }
                run.agree(change, &died).map_err(|e| format!("case {case}, start: {e}"))?;
            }
            for i in 0..60 {
                let rank = rng.random_range(0..world + 1);
                let step = match rng.random_range(0..8) {
                    0 => Move::Die(rank),
                    1 => Move::Claim(rank),
                    2 => Move::Build(rank),
                    3 => Move::Abandon(rank),
                    4 => Move::Admit(rank),
                    5 => Move::Hand,
                    6 => Move::Round,
                    _ => Move::Snapshot(rank),
                };
                let change = run.play(step)?;
                match change {
                    Some(Change::Died { rank, .. }) => {
                        died[rank] = true;
                        changes[1] += 1;
                    }
                    Some(Change::Joined { rank }) => {
                        died[rank] = false;
                        changes[2] += 1;
                    }
                    _ => {}
                }
                run.agree(change, &died)
                    .map_err(|e| format!("case {case}, move {i} {step:?}: {e}"))?;
            }
        }
        // The sequences reach every kind of change, many times.
        if changes.iter().any(|&n| n < 100) {
            return Err(format!("changes of each kind (vacated, died, joined): {changes:?}").into());
        }
        Ok(())
    }
}

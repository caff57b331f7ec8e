//! The roster: who is in the run, one standing per seat, and the only thing that changes it.
//! A seat entering or leaving the live set is one [`Change`] the roster emits and every book
//! that keeps membership applies (`books.rs`); the other books read the live set from here.

use std::time::Instant;

use crate::control::change::Change;
use crate::runtime::engine::fault::DeadFlags;

/// Where a seat stands: `Starting → Alive → Dead`, and from `Dead` (or `Vacant`, a seat no
/// process took at the start, or whose process went away before training started) through
/// `Rejoining → Waiting → Alive` when a new process claims it; a `Rejoining` or `Waiting` seat
/// whose process goes away is `Dead` again. Before training starts a vacant seat is taken
/// straight back to `Starting`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Standing {
    /// Building its replica, not yet reported ready.
    Starting,
    /// Ready and taking part.
    Alive,
    /// Declared dead by the coordinator; later words from it change nothing.
    Dead,
    /// A new process claimed the seat: it builds its replica.
    Rejoining,
    /// Its replica is built: it is admitted at the end of the next reduce, from its consensus.
    Waiting,
    /// No process has taken this seat yet (a cluster run started on a quorum).
    Vacant,
}

impl Standing {
    /// Whether the seat takes part in the run (starting or alive).
    pub(crate) fn is_live(self) -> bool {
        matches!(self, Standing::Starting | Standing::Alive)
    }

    /// Whether a process joining again holds the seat (claimed, not yet admitted).
    pub(crate) fn is_joining(self) -> bool {
        matches!(self, Standing::Rejoining | Standing::Waiting)
    }
}

/// Every seat's standing, and the flags that tell the run's handle which ranks are dead.
#[derive(Debug)]
pub(crate) struct Roster {
    seats: Vec<Standing>,
    /// What the handle reads of the roster from its own thread: kept by the roster alone.
    dead: DeadFlags,
}

impl Roster {
    /// `world` seats, every one starting; deaths are published into `dead`.
    pub(crate) fn new(world: usize, dead: DeadFlags) -> Roster {
        Roster { seats: vec![Standing::Starting; world], dead }
    }

    /// `rank`'s standing (`None` for no seat).
    pub(crate) fn standing(&self, rank: usize) -> Option<Standing> {
        self.seats.get(rank).copied()
    }

    /// Every seat's standing, by rank (what the standby mirrors).
    pub(crate) fn standings(&self) -> Vec<Standing> {
        self.seats.clone()
    }

    /// Whether `rank` takes part (starting or alive).
    pub(crate) fn is_live(&self, rank: usize) -> bool {
        self.standing(rank).is_some_and(Standing::is_live)
    }

    /// Whether a process joining again holds `rank`'s seat.
    pub(crate) fn is_joining(&self, rank: usize) -> bool {
        self.standing(rank).is_some_and(Standing::is_joining)
    }

    /// The ranks taking part, in order: the live set every book follows.
    pub(crate) fn live(&self) -> Vec<usize> {
        self.ranks(Standing::is_live)
    }

    /// The ranks joining again (claimed after their death, not yet admitted).
    pub(crate) fn joining(&self) -> Vec<usize> {
        self.ranks(Standing::is_joining)
    }

    /// The ranks whose process is built and waits to be admitted.
    pub(crate) fn waiting(&self) -> Vec<usize> {
        self.ranks(|s| s == Standing::Waiting)
    }

    /// The lowest live rank (the one that returns the final state).
    pub(crate) fn lowest(&self) -> Option<usize> {
        self.seats.iter().position(|s| s.is_live())
    }

    /// Ranks dead now: declared dead, or held by a process joining again not yet admitted (a
    /// vacant seat is no death until a process claims it).
    pub(crate) fn deaths(&self) -> usize {
        self.seats.iter().filter(|s| matches!(s, Standing::Dead) || s.is_joining()).count()
    }

    /// Whether no seat is still building its first replica.
    pub(crate) fn all_started(&self) -> bool {
        self.seats.iter().all(|&s| s != Standing::Starting)
    }

    /// `rank` reported its replica built at the start: `Starting → Alive`. False for a seat
    /// not live.
    pub(crate) fn started(&mut self, rank: usize) -> bool {
        self.step(rank, Standing::is_live, Standing::Alive)
    }

    /// Leaves `rank`'s seat out of the start (no process joined it, or its process went away
    /// before training started; the coordinator vacates only then): `Starting|Alive → Vacant`.
    pub(crate) fn vacate(&mut self, rank: usize, at: Instant) -> Option<Change> {
        self.step(rank, Standing::is_live, Standing::Vacant).then_some(Change::Vacated { rank, at })
    }

    /// Declares `rank` dead now, the reduce in progress holding `held` of its steps:
    /// `Starting|Alive → Dead`. `None` when it was not live (dead once is enough).
    pub(crate) fn die(&mut self, rank: usize, held: usize) -> Option<Change> {
        let died = self.step(rank, Standing::is_live, Standing::Dead);
        died.then(|| {
            self.dead.mark(rank);
            Change::Died { rank, at: Instant::now(), held }
        })
    }

    /// A new process claimed `rank`'s seat, out of the run: `Dead|Vacant|Rejoining|Waiting →
    /// Rejoining` (a claim again restarts the join). False for a live seat or no seat.
    pub(crate) fn claim(&mut self, rank: usize) -> bool {
        self.step(rank, |s| !s.is_live(), Standing::Rejoining)
    }

    /// The process joining again built its replica: `Rejoining|Waiting → Waiting`.
    pub(crate) fn built(&mut self, rank: usize) -> bool {
        self.step(rank, Standing::is_joining, Standing::Waiting)
    }

    /// The process joining again went away, failed or was turned away: `Rejoining|Waiting →
    /// Dead`.
    pub(crate) fn abandon(&mut self, rank: usize) -> bool {
        self.step(rank, Standing::is_joining, Standing::Dead)
    }

    /// A new process took `rank`'s vacant seat before training started: it starts with the
    /// others, `Vacant → Starting`. `None` unless the seat was vacant.
    pub(crate) fn retake(&mut self, rank: usize) -> Option<Change> {
        self.step(rank, |s| s == Standing::Vacant, Standing::Starting)
            .then_some(Change::Joined { rank })
    }

    /// Admits `rank`, waiting to join: `Waiting → Alive`. `None` unless it was waiting.
    pub(crate) fn admit(&mut self, rank: usize) -> Option<Change> {
        let admitted = self.step(rank, |s| s == Standing::Waiting, Standing::Alive);
        admitted.then(|| {
            self.dead.revive(rank);
            Change::Joined { rank }
        })
    }

    /// The ranks whose standing passes `pick`, in order.
    fn ranks(&self, pick: impl Fn(Standing) -> bool) -> Vec<usize> {
        (0..self.seats.len()).filter(|&r| pick(self.seats[r])).collect()
    }

    /// Moves `rank`'s seat to `to` when its standing passes `from`; false otherwise.
    fn step(&mut self, rank: usize, from: impl Fn(Standing) -> bool, to: Standing) -> bool {
        match self.seats.get_mut(rank) {
            Some(seat) if from(*seat) => {
                *seat = to;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seat's life, step by step, against the standing, live set, joining set, deaths and
    /// dead flag expected after each move: dead once, a claim of a live seat refused, a joiner
    /// that goes away leaves the seat dead, only a waiting seat is admitted (its flag cleared),
    /// a vacant seat is no death until claimed, only a live seat is vacated (its flag untouched),
    /// only a vacant one retaken.
    #[test]
    fn a_seat_dies_and_is_taken_again() -> Result<(), String> {
        #[derive(Debug, Clone, Copy)]
        enum Move {
            Start,
            Die,
            Claim,
            Build,
            Abandon,
            Admit,
            Vacate,
            Retake,
        }
        use Move::*;
        /// A move on `rank`, whether it took, then: live ranks, joining ranks, deaths, the
        /// rank's dead flag.
        type Case = (Move, usize, bool, &'static [usize], &'static [usize], usize, bool);
        let cases: [Case; 21] = [
            (Vacate, 2, true, &[0, 1], &[], 0, false),
            (Vacate, 2, false, &[0, 1], &[], 0, false),
            (Start, 0, true, &[0, 1], &[], 0, false),
            (Admit, 1, false, &[0, 1], &[], 0, false),
            (Claim, 1, false, &[0, 1], &[], 0, false),
            (Die, 1, true, &[0], &[], 1, true),
            (Die, 1, false, &[0], &[], 1, true),
            (Vacate, 1, false, &[0], &[], 1, true),
            (Claim, 1, true, &[0], &[1], 1, true),
            (Abandon, 1, true, &[0], &[], 1, true),
            (Build, 1, false, &[0], &[], 1, true),
            (Claim, 1, true, &[0], &[1], 1, true),
            (Build, 1, true, &[0], &[1], 1, true),
            (Admit, 1, true, &[0, 1], &[], 0, false),
            (Claim, 2, true, &[0, 1], &[2], 1, false),
            (Start, 2, false, &[0, 1], &[2], 1, false),
            (Vacate, 0, true, &[1], &[2], 1, false),
            (Vacate, 2, false, &[1], &[2], 1, false),
            (Retake, 2, false, &[1], &[2], 1, false),
            (Retake, 0, true, &[0, 1], &[2], 1, false),
            (Retake, 0, false, &[0, 1], &[2], 1, false),
        ];
        let flags = DeadFlags::new(3);
        let mut roster = Roster::new(3, flags.clone());
        for (i, (step, rank, took, live, joining, deaths, flagged)) in cases.into_iter().enumerate()
        {
            let did = match step {
                Start => roster.started(rank),
                Die => roster.die(rank, 0).is_some(),
                Claim => roster.claim(rank),
                Build => roster.built(rank),
                Abandon => roster.abandon(rank),
                Admit => roster.admit(rank).is_some(),
                Vacate => roster.vacate(rank, Instant::now()).is_some(),
                Retake => roster.retake(rank).is_some(),
            };
            let got = (did, roster.live(), roster.joining(), roster.deaths(), flags.is_dead(rank));
            if got != (took, live.to_vec(), joining.to_vec(), deaths, flagged) {
                return Err(format!("move {i} ({step:?} {rank}): got {got:?}"));
            }
        }
        Ok(())
    }
}

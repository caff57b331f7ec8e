//! Each rank's conduct as the controller books it — the batches it was handed, the steps its
//! reduces hold, the questions it was asked, its rate of frames — and the checks of what it
//! reports against that book. A check that fails names a [`Misconduct`], which evicts the rank.

use std::time::Instant;

use crate::link::wire::ToWorker;
use crate::runtime::engine::fault::Misconduct;

/// Frames a rank in another process may send in a burst.
const BURST: u32 = 20_000;
/// Frames a rank in another process may send per second past its burst. An honest rank sends a
/// handful per window (its progress, its snapshot or acknowledgement, its chunk reports), and a
/// window is at least a batch and a round trip to the controller: far below this.
const PER_SECOND: u32 = 20_000;
/// Questions (evaluations, group ids) a rank may have outstanding; older ones are forgotten.
const OUTSTANDING: usize = 8;

/// The book of every rank, the ranks found out before training started (evicted once it has),
/// and the ranks evicted (their seats closed for the run).
#[derive(Debug)]
pub(super) struct Conduct {
    ranks: Vec<Book>,
    batch_size: usize,
    condemned: Vec<(usize, Misconduct)>,
    /// The ranks evicted: their seats stay closed for the run.
    barred: Vec<usize>,
}

/// One rank's book.
#[derive(Debug)]
struct Book {
    /// Batches handed to it in all.
    handed: u64,
    /// Its steps that completed reduces hold.
    claimed: u64,
    /// The latest completed reduce that held steps of it: its round and those steps. A rank
    /// that has not taken that reduce's update yet still counts them in its window.
    last: Option<(u64, u64)>,
    /// Epochs it was asked to evaluate and has not answered.
    evals: Vec<usize>,
    /// Group generations whose id it was asked to make and has not sent.
    ids: Vec<u64>,
    /// Its frame budget, when it is in another process (`None`: in this one).
    budget: Option<Budget>,
}

/// A token bucket of frames.
#[derive(Debug)]
struct Budget {
    tokens: f64,
    at: Instant,
}

impl Book {
    fn new(remote: bool) -> Book {
        let budget = remote.then(|| Budget { tokens: f64::from(BURST), at: Instant::now() });
        Book { handed: 0, claimed: 0, last: None, evals: Vec::new(), ids: Vec::new(), budget }
    }
}

impl Conduct {
    /// The books of `world` ranks; those in `remote` are in other processes and rate-limited.
    pub(super) fn new(world: usize, batch_size: usize, remote: impl Fn(usize) -> bool) -> Self {
        let ranks = (0..world).map(|r| Book::new(remote(r))).collect();
        Conduct { ranks, batch_size, condemned: Vec::new(), barred: Vec::new() }
    }

    /// Whether `rank` runs in another process: what it reports is its word alone (its data's
    /// checksum included), where a rank of this process loaded its data here.
    pub(super) fn is_remote(&self, rank: usize) -> bool {
        self.ranks.get(rank).is_some_and(|b| b.budget.is_some())
    }

    /// A new process took `rank`'s seat (in another process): its book starts afresh.
    pub(super) fn reset(&mut self, rank: usize) {
        if let Some(book) = self.ranks.get_mut(rank) {
            *book = Book::new(true);
        }
    }

    /// Books what `msg`, sent to `rank`, hands it or asks of it.
    pub(super) fn sent(&mut self, rank: usize, msg: &ToWorker) {
        let batch_size = self.batch_size;
        let Some(book) = self.ranks.get_mut(rank) else { return };
        match msg {
            ToWorker::Work(chunk) => book.handed += chunk.batches(batch_size) as u64,
            ToWorker::Reduce { eval: Some(epoch), .. }
            | ToWorker::Update { eval: Some(epoch), .. }
            | ToWorker::Evaluate { epoch } => ask(&mut book.evals, *epoch),
            ToWorker::MakeGroupId { generation } => ask(&mut book.ids, *generation),
            _ => {}
        }
    }

    /// One frame came from `rank` at `now`.
    ///
    /// # Errors
    /// [`Misconduct::Flooded`] when it is past its budget.
    pub(super) fn frame(&mut self, rank: usize, now: Instant) -> Result<(), Misconduct> {
        let Some(budget) = self.ranks.get_mut(rank).and_then(|b| b.budget.as_mut()) else {
            return Ok(());
        };
        let refill = now.saturating_duration_since(budget.at).as_secs_f64() * f64::from(PER_SECOND);
        budget.tokens = (budget.tokens + refill).min(f64::from(BURST));
        budget.at = now;
        if budget.tokens < 1.0 {
            return Err(Misconduct::Flooded { burst: BURST, per_second: PER_SECOND });
        }
        budget.tokens -= 1.0;
        Ok(())
    }

    /// `rank` says it trained `steps` in its window of `round` (since the reduce before it).
    ///
    /// A window whose reduce completed here may be reported before the rank took its update
    /// (the report crossed the update on the wire): its steps then include those the reduce
    /// holds, and are weighed against the book before that reduce.
    ///
    /// # Errors
    /// [`Misconduct::StepsBeyondDispatch`] when that is more than it was handed.
    pub(super) fn steps(&self, rank: usize, round: u64, steps: usize) -> Result<(), Misconduct> {
        let Some(book) = self.ranks.get(rank) else { return Ok(()) };
        let before = match book.last {
            Some((reduced, held)) if round <= reduced => book.claimed.saturating_sub(held),
            _ => book.claimed,
        };
        let claimed = before.saturating_add(steps as u64);
        if claimed > book.handed {
            return Err(Misconduct::StepsBeyondDispatch { claimed, handed: book.handed });
        }
        Ok(())
    }

    /// The reduce of `round` completed holding each rank's `steps`.
    pub(super) fn reduced(&mut self, round: u64, steps: &[usize]) {
        for (book, &s) in self.ranks.iter_mut().zip(steps) {
            book.claimed = book.claimed.saturating_add(s as u64);
            if s > 0 {
                book.last = Some((round, s as u64));
            }
        }
    }

    /// `rank` sent its evaluation of `epoch`.
    ///
    /// # Errors
    /// [`Misconduct::Unsolicited`] when it was not asked for it.
    pub(super) fn evaluated(&mut self, rank: usize, epoch: usize) -> Result<(), Misconduct> {
        let what = || Misconduct::Unsolicited { what: format!("an evaluation of epoch {epoch}") };
        let book = self.ranks.get_mut(rank).ok_or_else(what)?;
        let at = book.evals.iter().position(|&e| e == epoch).ok_or_else(what)?;
        book.evals.remove(at);
        Ok(())
    }

    /// `rank` sent the id of group number `generation`.
    ///
    /// # Errors
    /// [`Misconduct::Unsolicited`] when it was not asked for it.
    pub(super) fn group_id(&mut self, rank: usize, generation: u64) -> Result<(), Misconduct> {
        let what = || Misconduct::Unsolicited { what: format!("the id of group {generation}") };
        let book = self.ranks.get_mut(rank).ok_or_else(what)?;
        let at = book.ids.iter().position(|&g| g == generation).ok_or_else(what)?;
        book.ids.remove(at);
        Ok(())
    }

    /// `rank` misbehaved before training started: it is evicted once training has.
    pub(super) fn condemn(&mut self, rank: usize, misconduct: Misconduct) {
        if self.condemned.iter().all(|(r, _)| *r != rank) {
            self.condemned.push((rank, misconduct));
        }
    }

    /// `rank` is evicted: no process takes its seat again in this run.
    pub(super) fn bar(&mut self, rank: usize) {
        if !self.barred.contains(&rank) {
            self.barred.push(rank);
        }
    }

    /// Whether `rank` was evicted.
    pub(super) fn is_barred(&self, rank: usize) -> bool {
        self.barred.contains(&rank)
    }

    /// The ranks condemned before training started.
    pub(super) fn take_condemned(&mut self) -> Vec<(usize, Misconduct)> {
        std::mem::take(&mut self.condemned)
    }
}

/// Books a question asked, forgetting the oldest past [`OUTSTANDING`].
fn ask<T>(asked: &mut Vec<T>, question: T) {
    if asked.len() == OUTSTANDING {
        asked.remove(0);
    }
    asked.push(question);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::link::wire::Chunk;

    /// Steps are bounded by the batches handed, across reduces; a report of a window whose
    /// reduce completed (sent before the rank took its update) is weighed against the book
    /// before that reduce; a new process starts afresh.
    #[test]
    fn steps_are_bounded_by_the_batches_handed() -> Result<(), String> {
        let mut c = Conduct::new(2, 4, |_| true);
        c.sent(1, &ToWorker::Work(Chunk { epoch: 0, offset: 0, len: 12 }));
        for (steps, ok) in [(0, true), (3, true), (4, false), (1_000_000_000, false)] {
            if c.steps(1, 0, steps).is_ok() != ok {
                return Err(format!("{steps} steps of 3 handed: accepted = {}", !ok));
            }
        }
        c.reduced(0, &[0, 2]);
        c.sent(1, &ToWorker::Work(Chunk { epoch: 0, offset: 12, len: 8 }));
        // 5 handed, 2 held by the reduce of round 0: (round, steps, taken).
        let cases = [
            (1, 3, true),
            (1, 4, false),
            // Window 0 reported after its reduce: its steps include the 2 held.
            (0, 5, true),
            (0, 6, false),
        ];
        for (round, steps, ok) in cases {
            if c.steps(1, round, steps).is_ok() != ok {
                return Err(format!("{steps} steps in window {round}: accepted = {}", !ok));
            }
        }
        c.reset(1);
        match c.steps(1, 1, 1) {
            Err(Misconduct::StepsBeyondDispatch { claimed: 1, handed: 0 }) => Ok(()),
            other => Err(format!("a fresh seat: {other:?}")),
        }
    }

    /// Only asked evaluations and group ids are taken, each once.
    #[test]
    fn only_answers_to_questions_asked_are_taken() -> Result<(), String> {
        let mut c = Conduct::new(3, 1, |_| false);
        c.sent(2, &ToWorker::Evaluate { epoch: 4 });
        c.sent(0, &ToWorker::MakeGroupId { generation: 7 });
        let cases: Vec<(&str, Result<(), Misconduct>, bool)> = vec![
            ("rank 1 was not asked", c.evaluated(1, 4), false),
            ("another epoch", c.evaluated(2, 3), false),
            ("the asked one", c.evaluated(2, 4), true),
            ("twice", c.evaluated(2, 4), false),
            ("an id not asked of rank 1", c.group_id(1, 7), false),
            ("another generation", c.group_id(0, 8), false),
            ("the asked id", c.group_id(0, 7), true),
        ];
        for (name, got, ok) in cases {
            if got.is_ok() != ok {
                return Err(format!("{name}: {got:?}"));
            }
        }
        Ok(())
    }

    /// A remote rank past its burst and rate is flooding; one in this process is never limited.
    #[test]
    fn a_flood_of_frames_is_refused_past_the_budget() -> Result<(), String> {
        let mut c = Conduct::new(2, 1, |r| r == 1);
        let t = Instant::now();
        for i in 0..BURST {
            c.frame(1, t).map_err(|m| format!("frame {i} of the burst: {m}"))?;
            c.frame(0, t).map_err(|m| format!("a local rank: {m}"))?;
        }
        if c.frame(1, t).is_ok() {
            return Err("the frame past the burst was taken".into());
        }
        // A second later the rate has refilled.
        let later = t + Duration::from_secs(1);
        for i in 0..PER_SECOND {
            c.frame(1, later).map_err(|m| format!("frame {i} a second later: {m}"))?;
        }
        match c.frame(1, later) {
            Err(Misconduct::Flooded { .. }) => Ok(()),
            other => Err(format!("past the rate: {other:?}")),
        }
    }
}

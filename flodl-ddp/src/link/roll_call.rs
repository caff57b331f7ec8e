//! The controller's wait for the other processes' ranks at a rendezvous, one rule for every
//! transport: enough have joined once `quorum` ranks take part, else the deadline names the
//! missing ones.

use std::time::{Duration, Instant};

use crate::{Error, Result};

/// A controller's wait for `ranks` (the ranks in other processes) of a `world`.
#[derive(Debug)]
pub(crate) struct RollCall<'a> {
    world: usize,
    ranks: &'a [usize],
    quorum: usize,
    wait: Duration,
    deadline: Instant,
}

impl<'a> RollCall<'a> {
    /// The wait starts now and lasts `wait`.
    pub(crate) fn start(world: usize, ranks: &'a [usize], quorum: usize, wait: Duration) -> Self {
        RollCall { world, ranks, quorum, wait, deadline: Instant::now() + wait }
    }

    /// `None` once the ranks for which `joined` holds make the quorum (with every rank not
    /// awaited); otherwise the time left to wait.
    ///
    /// # Errors
    /// [`Error::RanksMissing`] naming the ranks still missing when the deadline has passed.
    pub(crate) fn left(&self, joined: impl Fn(usize) -> bool) -> Result<Option<Duration>> {
        let missing: Vec<usize> = self.ranks.iter().copied().filter(|&r| !joined(r)).collect();
        if self.world - missing.len() >= self.quorum {
            return Ok(None);
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::RanksMissing { missing, after: self.wait });
        }
        Ok(Some(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a roll call answers.
    #[derive(Debug, PartialEq)]
    enum Answer {
        Enough,
        Wait,
        Missing(Vec<usize>),
    }

    #[test]
    fn a_roll_call_waits_for_the_quorum_then_names_the_missing()
    -> std::result::Result<(), Box<dyn std::error::Error>> {
        // (world, awaited ranks, quorum, joined, wait, answer)
        type Case = (usize, &'static [usize], usize, &'static [usize], Duration, Answer);
        let long = Duration::from_secs(60);
        let cases: [Case; 6] = [
            (3, &[1, 2], 3, &[1, 2], Duration::ZERO, Answer::Enough),
            (3, &[1, 2], 3, &[1], long, Answer::Wait),
            (3, &[1, 2], 3, &[1], Duration::ZERO, Answer::Missing(vec![2])),
            (3, &[1, 2], 2, &[2], Duration::ZERO, Answer::Enough),
            (4, &[1, 2, 3], 2, &[], Duration::ZERO, Answer::Missing(vec![1, 2, 3])),
            (4, &[0, 1, 2, 3], 1, &[3], Duration::ZERO, Answer::Enough),
        ];
        for (world, ranks, quorum, joined, wait, want) in cases {
            let roll = RollCall::start(world, ranks, quorum, wait);
            let got = match roll.left(|r| joined.contains(&r)) {
                Ok(None) => Answer::Enough,
                Ok(Some(left)) if left <= wait => Answer::Wait,
                Err(Error::RanksMissing { missing, after }) if after == wait => {
                    Answer::Missing(missing)
                }
                other => return Err(format!("unexpected {other:?}").into()),
            };
            assert_eq!(got, want, "world {world}, awaited {ranks:?}, quorum {quorum}");
        }
        Ok(())
    }
}

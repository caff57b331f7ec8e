//! Which process holds a cluster run's standby controller: a rank's, or none; and the chain of
//! processes that host the controller term after term.

use serde::{Deserialize, Serialize};

/// The rank whose process holds the standby controller of a cluster run (host backend): the
/// controller streams its state to it, and it takes over when the controller's process dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Standby {
    /// This rank's process (not rank 0's, which hosts the first controller) is the first
    /// controller's standby; the ranks after it, round the world, are the later terms'.
    Rank(usize),
    /// No standby: the run ends when the controller's process dies.
    None,
}

impl Default for Standby {
    /// Rank 1's process.
    fn default() -> Standby {
        Standby::Rank(1)
    }
}

impl Standby {
    /// The standby's rank in a world of `world` ranks: none in a world of one (no other
    /// process), none when [`Standby::None`].
    pub fn rank(self, world: usize) -> Option<usize> {
        match self {
            Standby::Rank(rank) if world >= 2 && rank < world => Some(rank),
            _ => None,
        }
    }

    /// The rank whose process hosts the controller of `term` in a world of `world`: rank 0's
    /// for the first (term 0), the standby's for term 1, then the next rank's round the world
    /// (term `t`: `(s + t − 1) mod world` for a standby `s`), so each term's standby is the
    /// next term's host and no host is its own successor. `None` for a term above 0 without a
    /// standby.
    pub fn host(self, term: u64, world: usize) -> Option<usize> {
        if term == 0 {
            return Some(0);
        }
        let first = self.rank(world)?;
        let step = usize::try_from((term - 1) % world as u64).ok()?;
        Some((first + step) % world)
    }
}

impl std::fmt::Display for Standby {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Standby::Rank(rank) => write!(f, "{rank}"),
            Standby::None => f.write_str("none"),
        }
    }
}

impl std::str::FromStr for Standby {
    type Err = crate::LogicError;

    /// A rank (a number) or `none`.
    fn from_str(s: &str) -> crate::LogicResult<Standby> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(Standby::None),
            n => n.parse().map(Standby::Rank).map_err(|_| crate::LogicError::Parse {
                what: "standby",
                input: s.to_string(),
                expected: "a rank (a number) or none",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Standby;

    /// The chain of hosts: term 0 on rank 0, term 1 on the standby, each term's host differs
    /// from the last one's and every rank hosts in turn.
    #[test]
    fn the_hosts_go_round_the_world_from_the_standby() -> Result<(), String> {
        let cases: [(Standby, usize, &[usize]); 4] = [
            (Standby::Rank(1), 4, &[0, 1, 2, 3, 0, 1, 2, 3, 0]),
            (Standby::Rank(2), 3, &[0, 2, 0, 1, 2, 0]),
            (Standby::Rank(1), 2, &[0, 1, 0, 1]),
            (Standby::Rank(3), 4, &[0, 3, 0, 1, 2, 3]),
        ];
        for (standby, world, hosts) in cases {
            let got: Vec<Option<usize>> =
                (0..hosts.len() as u64).map(|t| standby.host(t, world)).collect();
            let want: Vec<Option<usize>> = hosts.iter().map(|&h| Some(h)).collect();
            if got != want {
                return Err(format!("{standby} in a world of {world}: {got:?}, want {want:?}"));
            }
        }
        for term in [0, 1, 7, u64::MAX] {
            let got = Standby::Rank(1).host(term, 5).filter(|_| term > 0);
            let next = Standby::Rank(1).host(term.saturating_add(1), 5);
            if term > 0 && term < u64::MAX && got == next {
                return Err(format!("term {term}'s host {got:?} succeeds itself"));
            }
            if Standby::None.host(term, 5) != (term == 0).then_some(0) {
                return Err(format!("no standby still hosts term {term}"));
            }
        }
        Ok(())
    }

    /// Text round trips and the rank a world gets, by cases.
    #[test]
    fn reads_writes_and_places_the_standby() -> Result<(), String> {
        let cases: [(&str, Option<Standby>, usize, Option<usize>); 6] = [
            ("1", Some(Standby::Rank(1)), 3, Some(1)),
            (" 2 ", Some(Standby::Rank(2)), 3, Some(2)),
            ("NONE", Some(Standby::None), 3, None),
            ("1", Some(Standby::Rank(1)), 1, None),
            ("5", Some(Standby::Rank(5)), 3, None),
            ("one", None, 3, None),
        ];
        for (text, parsed, world, rank) in cases {
            let got = text.parse::<Standby>().ok();
            if got != parsed {
                return Err(format!("{text:?} read as {got:?}, expected {parsed:?}"));
            }
            if let Some(s) = got {
                if s.to_string().parse::<Standby>().ok() != Some(s) {
                    return Err(format!("{s} does not read back"));
                }
                if s.rank(world) != rank {
                    return Err(format!("{s} in a world of {world}: {:?}", s.rank(world)));
                }
            }
        }
        Ok(())
    }
}

//! Which process holds a cluster run's standby controller: a rank's, or none.

use serde::{Deserialize, Serialize};

/// The rank whose process holds the standby controller of a cluster run (host backend): the
/// controller streams its state to it, and it takes over when the controller's process dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Standby {
    /// This rank's process (not rank 0's, which hosts the controller).
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

//! Emulated device failures (`--fail-rank RANK@BATCH`): which rank fails at which training
//! batch, through flodl-ddp's `FailingReplica`, to watch the survivors go on (or the run end
//! with its failure bundle).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where an emulated failure strikes: rank `rank` fails on its `batch`-th training batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FailAt {
    /// The rank that fails.
    pub(crate) rank: usize,
    /// Its training batch that fails, from 1.
    pub(crate) batch: usize,
}

impl FromStr for FailAt {
    type Err = String;

    /// `RANK@BATCH`, e.g. `1@20`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("'{s}': expected RANK@BATCH, e.g. 1@20 (batches count from 1)");
        let (rank, batch) = s.split_once('@').ok_or_else(bad)?;
        let rank = rank.trim().parse().map_err(|_| bad())?;
        let batch = batch.trim().parse().map_err(|_| bad())?;
        if batch == 0 {
            return Err(bad());
        }
        Ok(FailAt { rank, batch })
    }
}

impl fmt::Display for FailAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.rank, self.batch)
    }
}

/// The training batch (from 1) at which `rank` fails under `plan`: its earliest, if any.
pub(crate) fn fail_at(rank: usize, plan: &[FailAt]) -> Option<usize> {
    plan.iter().filter(|f| f.rank == rank).map(|f| f.batch).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_at_parses_rank_at_batch_and_round_trips() {
        for (text, want) in [
            ("1@20", Some(FailAt { rank: 1, batch: 20 })),
            (" 0 @ 1", Some(FailAt { rank: 0, batch: 1 })),
            ("1@0", None),
            ("1", None),
            ("a@2", None),
            ("1@-2", None),
        ] {
            let got = text.parse::<FailAt>().ok();
            assert_eq!(got, want, "{text}");
            if let Some(f) = got {
                assert_eq!(f.to_string().parse::<FailAt>(), Ok(f));
            }
        }
    }

    #[test]
    fn the_earliest_failure_of_the_rank_applies() {
        let plan = [FailAt { rank: 1, batch: 9 }, FailAt { rank: 1, batch: 4 }];
        assert_eq!(fail_at(1, &plan), Some(4));
        assert_eq!(fail_at(0, &plan), None);
    }
}

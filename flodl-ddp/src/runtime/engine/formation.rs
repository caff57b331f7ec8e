//! [`Formation`]: how the coordinator forms a collective group whose ranks live in several
//! processes. The lowest member of each group generation makes the group's id (an NCCL unique
//! id names a bootstrap listener in the maker's process, so it must come from a member), sends
//! it to the coordinator, and the coordinator relays it to every member.

use crate::link::wire::{Regroup, ToWorker};

/// Where the forming of the next collective group stands.
#[derive(Debug, Default)]
pub(crate) enum Formation {
    /// No group is being formed (the current one stands, or the run needs no relay).
    #[default]
    Idle,
    /// Group `generation` of `members` waits for its id from `maker`; `then` are the orders
    /// sent to the members once they were told to form it (the initial states at the start).
    AwaitingId {
        /// The group's number.
        generation: u64,
        /// Its members (global ranks, increasing).
        members: Vec<usize>,
        /// The member asked for the id (the lowest).
        maker: usize,
        /// Orders that follow the group's forming.
        then: Vec<(usize, ToWorker)>,
    },
}

impl Formation {
    /// Starts forming group `generation` of `members`. An earlier one still pending is
    /// dropped (a late id of it is stale), but not its orders: those to ranks still members
    /// follow this group, before `then` (a reduce ordered of a group that never formed is
    /// still owed). Returns the order to send to the maker, the lowest member; `None` (and
    /// nothing pending) when there is no member.
    pub(crate) fn ask(
        &mut self,
        generation: u64,
        members: &[usize],
        then: Vec<(usize, ToWorker)>,
    ) -> Option<(usize, ToWorker)> {
        let mut members = members.to_vec();
        members.sort_unstable();
        members.dedup();
        let mut orders = match std::mem::take(self) {
            Formation::AwaitingId { generation: old, then: owed, .. } => {
                let (kept, dropped): (Vec<_>, Vec<_>) =
                    owed.into_iter().partition(|(r, _)| members.contains(r));
                tracing::debug!(
                    old,
                    generation,
                    dropped = dropped.len(),
                    "a pending group was replaced"
                );
                kept
            }
            Formation::Idle => Vec::new(),
        };
        orders.extend(then);
        let &maker = members.first()?;
        *self = Formation::AwaitingId { generation, members, maker, then: orders };
        Some((maker, ToWorker::MakeGroupId { generation }))
    }

    /// The id of group `generation` arrived from `rank`: the orders that form the group on
    /// every member (a `Regroup` each, in rank order), then the orders that waited for it.
    /// An id that is not the one awaited (another generation, another sender, none pending)
    /// is stale: no orders.
    pub(crate) fn on_id(
        &mut self,
        rank: usize,
        generation: u64,
        how: Regroup,
    ) -> Vec<(usize, ToWorker)> {
        match self {
            Formation::AwaitingId { generation: g, maker, .. }
                if *g == generation && *maker == rank => {}
            _ => {
                tracing::debug!(rank, generation, "stale group id ignored");
                return Vec::new();
            }
        }
        let Formation::AwaitingId { members, then, .. } = std::mem::take(self) else {
            return Vec::new();
        };
        tracing::info!(generation, ?members, maker = rank, "group id relayed to the members");
        let mut orders: Vec<(usize, ToWorker)> = members
            .iter()
            .map(|&m| {
                let msg =
                    ToWorker::Regroup { generation, members: members.clone(), how: how.clone() };
                (m, msg)
            })
            .collect();
        orders.extend(then);
        orders
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::HostState;

    fn init() -> ToWorker {
        let window = crate::link::wire::Window { round: 1, target: 1, limit: 1, wall: None };
        ToWorker::Init { state: HostState::default(), restore: None, window, global_step: 0 }
    }

    /// The message flow through the controller, with `Regroup::Host` standing in for an NCCL
    /// id: the lowest member is asked, its id is relayed to every member before the orders
    /// that waited, a stale id (old generation, wrong sender, nothing pending) is ignored, and
    /// a death during the wait starts the next generation from the next lowest survivor.
    #[test]
    fn ids_are_asked_of_the_lowest_member_and_relayed() -> Result<(), String> {
        let mut f = Formation::default();
        // Generation 0 at the start: the initial states wait for the group.
        let then = vec![(0, init()), (1, init()), (2, init())];
        let asked = f.ask(0, &[2, 0, 1], then);
        if asked != Some((0, ToWorker::MakeGroupId { generation: 0 })) {
            return Err(format!("asked {asked:?}"));
        }
        if matches!(f, Formation::Idle) {
            return Err("nothing pending".into());
        }
        for (rank, generation) in [(1, 0), (0, 1)] {
            if !f.on_id(rank, generation, Regroup::Host).is_empty() {
                return Err(format!("stale id from {rank} for {generation} relayed"));
            }
        }
        let orders = f.on_id(0, 0, Regroup::Host);
        let want: Vec<(usize, ToWorker)> = (0..3)
            .map(|m| {
                let msg =
                    ToWorker::Regroup { generation: 0, members: vec![0, 1, 2], how: Regroup::Host };
                (m, msg)
            })
            .chain((0..3).map(|m| (m, init())))
            .collect();
        if orders != want {
            return Err(format!("orders {orders:?}"));
        }
        if !matches!(f, Formation::Idle) || !f.on_id(0, 0, Regroup::Host).is_empty() {
            return Err("the id was relayed twice".into());
        }
        // Rank 0 dies: generation 1 of the survivors; the maker dies while it is awaited, so
        // generation 2 asks the next lowest, and generation 1's late id is stale.
        let asked = f.ask(1, &[1, 2], Vec::new());
        if asked != Some((1, ToWorker::MakeGroupId { generation: 1 })) {
            return Err(format!("generation 1 asked {asked:?}"));
        }
        let asked = f.ask(2, &[2], Vec::new());
        if asked != Some((2, ToWorker::MakeGroupId { generation: 2 })) {
            return Err(format!("generation 2 asked {asked:?}"));
        }
        if !f.on_id(1, 1, Regroup::Host).is_empty() {
            return Err("a dead maker's late id was relayed".into());
        }
        let orders = f.on_id(2, 2, Regroup::Host);
        let want =
            vec![(2, ToWorker::Regroup { generation: 2, members: vec![2], how: Regroup::Host })];
        if orders != want {
            return Err(format!("generation 2 orders {orders:?}"));
        }
        if f.ask(3, &[], Vec::new()).is_some() || !matches!(f, Formation::Idle) {
            return Err("a group without members was asked for".into());
        }
        Ok(())
    }
    fn reduce(round: u64) -> ToWorker {
        let next = crate::link::wire::Window { round, target: 4, limit: 4, wall: None };
        ToWorker::Reduce { next, eval: None, global_step: 0, capture: None }
    }

    fn join() -> ToWorker {
        let window = crate::link::wire::Window { round: 7, target: 0, limit: 0, wall: None };
        ToWorker::Join { window, global_step: 96 }
    }

    fn regroup(generation: u64, members: &[usize]) -> Vec<(usize, ToWorker)> {
        members
            .iter()
            .map(|&m| {
                let msg =
                    ToWorker::Regroup { generation, members: members.to_vec(), how: Regroup::Host };
                (m, msg)
            })
            .collect()
    }

    /// A joiner's generation, case by case: the orders owed to a group that never formed
    /// follow the next group, but only to its members (a joiner that went away during the
    /// forming gets nothing, the survivors still get the reduce they are owed); late ids of
    /// replaced generations are ignored whenever they come.
    #[test]
    fn a_joiner_generation_forms_or_gives_way() -> Result<(), String> {
        // Rank 1 joins ranks 0 and 2 at the reduce ending window 7: generation 4 with it.
        let owed = || vec![(1, join()), (0, reduce(8)), (1, reduce(8)), (2, reduce(8))];
        struct Case {
            what: &'static str,
            /// Generations asked after generation 4, with their members.
            then: &'static [(u64, &'static [usize])],
            /// Ids that arrive, in order: (sender, generation).
            ids: &'static [(usize, u64)],
            /// The orders the last id gives (its generation, members, and the owed orders
            /// to `to`), none when `None`.
            expect: Option<(u64, &'static [usize], &'static [usize])>,
        }
        let cases = [
            Case {
                what: "formed",
                then: &[],
                ids: &[(0, 3), (1, 4), (0, 4)],
                expect: Some((4, &[0, 1, 2], &[1, 0, 1, 2])),
            },
            Case {
                what: "the joiner went away while it formed",
                then: &[(5, &[0, 2])],
                ids: &[(0, 4), (0, 5)],
                expect: Some((5, &[0, 2], &[0, 2])),
            },
            Case {
                what: "a survivor went away while it formed",
                then: &[(5, &[0, 1])],
                ids: &[(0, 5)],
                expect: Some((5, &[0, 1], &[1, 0, 1])),
            },
            Case {
                what: "the maker went away, then the joiner",
                then: &[(5, &[1, 2]), (6, &[2])],
                ids: &[(1, 5), (0, 4), (2, 6)],
                expect: Some((6, &[2], &[2])),
            },
            Case { what: "nobody left", then: &[(5, &[])], ids: &[(0, 4), (0, 5)], expect: None },
        ];
        for case in cases {
            let mut f = Formation::default();
            let asked = f.ask(4, &[0, 1, 2], owed());
            if asked != Some((0, ToWorker::MakeGroupId { generation: 4 })) {
                return Err(format!("{}: asked {asked:?}", case.what));
            }
            for &(generation, members) in case.then {
                let asked = f.ask(generation, members, Vec::new());
                let want = members.first().map(|&m| (m, ToWorker::MakeGroupId { generation }));
                if asked != want {
                    return Err(format!("{}: generation {generation} asked {asked:?}", case.what));
                }
            }
            let (last, early) = case.ids.split_last().ok_or("no id")?;
            for &(rank, generation) in early {
                if !f.on_id(rank, generation, Regroup::Host).is_empty() {
                    return Err(format!("{}: stale id ({rank}, {generation}) relayed", case.what));
                }
            }
            let orders = f.on_id(last.0, last.1, Regroup::Host);
            let want = match case.expect {
                None => Vec::new(),
                Some((generation, members, to)) => {
                    let mut want = regroup(generation, members);
                    let mut left: Vec<(usize, ToWorker)> =
                        owed().into_iter().filter(|(r, _)| members.contains(r)).collect();
                    let ranks: Vec<usize> = left.iter().map(|(r, _)| *r).collect();
                    if ranks != to {
                        return Err(format!("{}: the case expects {to:?}", case.what));
                    }
                    want.append(&mut left);
                    want
                }
            };
            if orders != want {
                return Err(format!("{}: orders {orders:?}", case.what));
            }
            if !matches!(f, Formation::Idle) {
                return Err(format!("{}: still pending", case.what));
            }
        }
        Ok(())
    }
}

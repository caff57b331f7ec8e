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
    /// Starts forming group `generation` of `members` (any earlier one pending is dropped: a
    /// late id of it is stale). Returns the order to send to the maker, the lowest member;
    /// `None` (and nothing pending) when there is no member.
    pub(crate) fn ask(
        &mut self,
        generation: u64,
        members: &[usize],
        then: Vec<(usize, ToWorker)>,
    ) -> Option<(usize, ToWorker)> {
        let mut members = members.to_vec();
        members.sort_unstable();
        members.dedup();
        let Some(&maker) = members.first() else {
            *self = Formation::Idle;
            return None;
        };
        *self = Formation::AwaitingId { generation, members, maker, then };
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
}

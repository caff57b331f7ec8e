//! The coordinator's end when some ranks share its process and others do not: each rank's
//! messages go through the link that reaches it.

use std::sync::Arc;
use std::time::Duration;

use super::frames::Frames;
use super::link_error::LinkError;
use super::local::LocalCoordinator;
use super::net::NetCoordinator;
use super::wire::ToWorker;

/// Which link reaches a rank, and the rank's number on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// The in-process link, as its rank `index`.
    Local(usize),
    /// The network link (numbered by global rank).
    Remote,
}

/// A coordinator end routing each rank to the in-process or the network link.
#[derive(Debug)]
pub(crate) struct Routed {
    routes: Vec<Route>,
    local: LocalCoordinator,
    remote: NetCoordinator,
}

impl Routed {
    /// Rank `r` goes where `routes[r]` says.
    pub(crate) fn new(routes: Vec<Route>, local: LocalCoordinator, remote: NetCoordinator) -> Self {
        Routed { routes, local, remote }
    }

    /// As [`CoordinatorLink::send`](super::CoordinatorLink::send).
    pub(crate) fn send(&self, rank: usize, msg: ToWorker, wait: Duration) -> Result<(), LinkError> {
        match self.routes.get(rank).ok_or(LinkError::Gone)? {
            Route::Local(index) => self.local.send(*index, msg, wait),
            Route::Remote => self.remote.send(rank, msg, wait),
        }
    }

    /// As [`CoordinatorLink::try_send`](super::CoordinatorLink::try_send).
    pub(crate) fn try_send(&self, rank: usize, msg: ToWorker) -> Result<(), LinkError> {
        match self.routes.get(rank).ok_or(LinkError::Gone)? {
            Route::Local(index) => self.local.try_send(*index, msg),
            Route::Remote => self.remote.try_send(rank, msg),
        }
    }

    /// As [`CoordinatorLink::sever`](super::CoordinatorLink::sever).
    pub(crate) fn sever(&self, rank: usize) {
        if let Some(Route::Remote) = self.routes.get(rank) {
            self.remote.sever(rank);
        }
    }

    /// As [`CoordinatorLink::watch`](super::CoordinatorLink::watch).
    pub(crate) fn watch(&self, rank: usize) {
        if let Some(Route::Remote) = self.routes.get(rank) {
            self.remote.watch(rank);
        }
    }

    /// As [`CoordinatorLink::watched`](super::CoordinatorLink::watched).
    pub(crate) fn watched(&self) -> Option<[u8; 32]> {
        self.remote.watched()
    }

    /// As [`CoordinatorLink::arriving`](super::CoordinatorLink::arriving).
    pub(crate) fn arriving(&self, rank: usize) -> Option<std::time::Instant> {
        match self.routes.get(rank) {
            Some(Route::Remote) => self.remote.arriving(rank),
            _ => None,
        }
    }

    /// As [`CoordinatorLink::attach`](super::CoordinatorLink::attach).
    pub(crate) fn attach(&self, rank: usize, frames: Arc<Frames>) -> bool {
        match self.routes.get(rank) {
            Some(Route::Remote) => self.remote.attach(rank, frames),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::frame::WireFormat;
    use crate::link::frames::pair as mem_pair;
    use crate::link::inbound::Inbound;
    use crate::link::local;
    use crate::link::net::NetRank;

    const WAIT: Duration = Duration::from_secs(5);

    /// Rank 0 in-process and rank 1 over a connection: each order reaches its own rank, and
    /// both ranks' messages reach the one inbox stamped with their rank.
    #[test]
    fn each_rank_is_reached_through_its_own_link() -> Result<(), String> {
        let (inbox_tx, inbox) = flume::bounded::<Inbound>(16);
        let (local, mut ends) = local::link(1, 4, &inbox_tx);
        let (c, r) = mem_pair();
        let remote =
            NetCoordinator::new((2, &[0]), vec![(1, c)], (WireFormat::F32, 1), &inbox_tx, None)
                .map_err(|e| e.to_string())?;
        let link = Routed::new(vec![Route::Local(0), Route::Remote], local, remote);
        let rank0 = ends.pop().ok_or("no local end")?;
        let rank1 = NetRank::new(r, (WireFormat::F32, 1)).map_err(|e| e.to_string())?;
        link.send(0, ToWorker::Evaluate { epoch: 0 }, WAIT).map_err(|e| e.to_string())?;
        link.send(1, ToWorker::Evaluate { epoch: 1 }, WAIT).map_err(|e| e.to_string())?;
        if rank0.recv(WAIT) != Ok(ToWorker::Evaluate { epoch: 0 })
            || rank1.recv(WAIT) != Ok(ToWorker::Evaluate { epoch: 1 })
        {
            return Err("an order went to the wrong rank".into());
        }
        if link.send(2, ToWorker::Ping, WAIT) != Err(LinkError::Gone) {
            return Err("a rank outside the world was reached".into());
        }
        use crate::link::wire::ToCoordinator;
        rank1.send(ToCoordinator::Alive { rank: 1 }, WAIT).map_err(|e| e.to_string())?;
        rank0.send(ToCoordinator::Alive { rank: 0 }, WAIT).map_err(|e| e.to_string())?;
        let mut seen = Vec::new();
        for _ in 0..2 {
            match inbox.recv_timeout(WAIT) {
                Ok(Inbound::Wire { rank, msg: ToCoordinator::Alive { rank: r } }) if rank == r => {
                    seen.push(rank);
                }
                other => return Err(format!("unexpected {other:?}")),
            }
        }
        seen.sort_unstable();
        if seen != [0, 1] {
            return Err(format!("heard from {seen:?}"));
        }
        Ok(())
    }
}

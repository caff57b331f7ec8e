//! The in-process link: bounded flume queues, one towards each rank and one shared inbox
//! towards the coordinator (the in-process flavor of [`CoordinatorLink`](super::CoordinatorLink)
//! and [`RankLink`](super::RankLink)).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use flodl_nccl::AbortHandle;

use super::inbound::Inbound;
use super::link_error::LinkError;
use super::wire::{ToCoordinator, ToWorker};

/// How long a rank's dropped end waits for room to say it is gone (the coordinator's
/// watchdog covers a `Gone` that never fits).
const GONE_WAIT: Duration = Duration::from_secs(1);

/// The abort a rank armed: the group's number and its handle.
#[derive(Debug, Default)]
pub(super) struct Armed(Mutex<Option<(u64, AbortHandle)>>);

impl Armed {
    fn lock(&self) -> MutexGuard<'_, Option<(u64, AbortHandle)>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Arms `handle` for group `generation`.
    pub(super) fn arm(&self, generation: u64, handle: AbortHandle) {
        *self.lock() = Some((generation, handle));
    }

    /// Fires the armed handle when its group is `generation` or older.
    pub(super) fn fire(&self, generation: u64) {
        let armed = self.lock().as_ref().filter(|(g, _)| *g <= generation).map(|(_, h)| h.clone());
        if let Some(handle) = armed {
            handle.abort();
        }
    }
}

/// The coordinator's end of an in-process link.
#[derive(Debug)]
pub(crate) struct LocalCoordinator {
    ranks: Vec<(flume::Sender<ToWorker>, Arc<Armed>)>,
}

/// A rank's end of an in-process link; dropping it tells the coordinator the rank is gone.
#[derive(Debug)]
pub(crate) struct LocalRank {
    rank: usize,
    rx: flume::Receiver<ToWorker>,
    inbox: flume::Sender<Inbound>,
    armed: Arc<Armed>,
}

/// A link between a coordinator whose inbox is `inbox` and `world` ranks, each rank's queue
/// holding `capacity` messages.
#[cfg(test)]
pub(crate) fn link(
    world: usize,
    capacity: usize,
    inbox: &flume::Sender<Inbound>,
) -> (LocalCoordinator, Vec<LocalRank>) {
    link_ranks(&(0..world).collect::<Vec<_>>(), capacity, inbox)
}

/// A link between a coordinator whose inbox is `inbox` and the ranks `ranks` of its process:
/// the coordinator's end numbers them by position in `ranks`, their messages are stamped with
/// their own rank.
pub(crate) fn link_ranks(
    ranks_here: &[usize],
    capacity: usize,
    inbox: &flume::Sender<Inbound>,
) -> (LocalCoordinator, Vec<LocalRank>) {
    let mut ranks = Vec::with_capacity(ranks_here.len());
    let mut ends = Vec::with_capacity(ranks_here.len());
    for &rank in ranks_here {
        let (tx, rx) = flume::bounded(capacity);
        let armed = Arc::new(Armed::default());
        ranks.push((tx, armed.clone()));
        ends.push(LocalRank { rank, rx, inbox: inbox.clone(), armed });
    }
    (LocalCoordinator { ranks }, ends)
}

impl LocalCoordinator {
    fn route(
        &self,
        rank: usize,
        msg: ToWorker,
    ) -> Result<Option<(&flume::Sender<ToWorker>, ToWorker)>, LinkError> {
        let (tx, armed) = self.ranks.get(rank).ok_or(LinkError::Gone)?;
        if let ToWorker::AbortGroup { generation } = msg {
            armed.fire(generation);
            return Ok(None);
        }
        Ok(Some((tx, msg)))
    }
}

impl LocalCoordinator {
    /// As [`CoordinatorLink::send`](super::CoordinatorLink::send), `rank` numbered by its
    /// position among the ranks of the link.
    pub(crate) fn send(&self, rank: usize, msg: ToWorker, wait: Duration) -> Result<(), LinkError> {
        let Some((tx, msg)) = self.route(rank, msg)? else { return Ok(()) };
        tx.send_timeout(msg, wait).map_err(|e| match e {
            flume::SendTimeoutError::Timeout(_) => LinkError::Timeout(wait),
            flume::SendTimeoutError::Disconnected(_) => LinkError::Gone,
        })
    }

    /// As [`CoordinatorLink::try_send`](super::CoordinatorLink::try_send).
    pub(crate) fn try_send(&self, rank: usize, msg: ToWorker) -> Result<(), LinkError> {
        let Some((tx, msg)) = self.route(rank, msg)? else { return Ok(()) };
        tx.try_send(msg).map_err(|e| match e {
            flume::TrySendError::Full(_) => LinkError::Full,
            flume::TrySendError::Disconnected(_) => LinkError::Gone,
        })
    }
}

impl LocalRank {
    /// As [`RankLink::send`](super::RankLink::send).
    pub(crate) fn send(&self, msg: ToCoordinator, wait: Duration) -> Result<(), LinkError> {
        let rank = self.rank;
        self.inbox.send_timeout(Inbound::Wire { rank, msg }, wait).map_err(|e| match e {
            flume::SendTimeoutError::Timeout(_) => LinkError::Timeout(wait),
            flume::SendTimeoutError::Disconnected(_) => LinkError::Gone,
        })
    }

    /// As [`RankLink::recv`](super::RankLink::recv).
    pub(crate) fn recv(&self, wait: Duration) -> Result<ToWorker, LinkError> {
        self.rx.recv_timeout(wait).map_err(|e| match e {
            flume::RecvTimeoutError::Timeout => LinkError::Timeout(wait),
            flume::RecvTimeoutError::Disconnected => LinkError::Gone,
        })
    }

    /// As [`RankLink::try_recv`](super::RankLink::try_recv).
    pub(crate) fn try_recv(&self) -> Result<Option<ToWorker>, LinkError> {
        match self.rx.try_recv() {
            Ok(msg) => Ok(Some(msg)),
            Err(flume::TryRecvError::Empty) => Ok(None),
            Err(flume::TryRecvError::Disconnected) => Err(LinkError::Gone),
        }
    }

    /// As [`RankLink::arm_abort`](super::RankLink::arm_abort).
    pub(crate) fn arm_abort(&self, generation: u64, handle: AbortHandle) {
        self.armed.arm(generation, handle);
    }
}

impl Drop for LocalRank {
    fn drop(&mut self) {
        // Best effort: a coordinator that is gone, or too busy to make room, needs no word.
        let _ = self.inbox.send_timeout(Inbound::Gone { rank: self.rank }, GONE_WAIT);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use flodl_nccl::HostComm;

    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    /// Messages arrive in order stamped with the link's rank; a dropped rank end is a `Gone`
    /// after its last message; a dropped coordinator end is `Gone` to the rank once drained.
    #[test]
    fn messages_keep_order_and_ends_say_gone() -> Result<(), String> {
        let (inbox_tx, inbox) = flume::bounded::<Inbound>(16);
        let (coord, mut ends) = link(2, 4, &inbox_tx);
        let rank1 = ends.pop().ok_or("no rank 1")?;
        let rank0 = ends.pop().ok_or("no rank 0")?;
        rank1.send(ToCoordinator::Alive { rank: 1 }, WAIT).map_err(|e| e.to_string())?;
        drop(rank1);
        match inbox.recv_timeout(WAIT) {
            Ok(Inbound::Wire { rank: 1, msg: ToCoordinator::Alive { rank: 1 } }) => {}
            other => return Err(format!("expected rank 1's message, got {other:?}")),
        }
        match inbox.recv_timeout(WAIT) {
            Ok(Inbound::Gone { rank: 1 }) => {}
            other => return Err(format!("expected rank 1 gone, got {other:?}")),
        }
        if coord.send(1, ToWorker::Ping, WAIT) != Err(LinkError::Gone) {
            return Err("a send to a gone rank went through".into());
        }
        for epoch in 0..4 {
            coord.send(0, ToWorker::Evaluate { epoch }, WAIT).map_err(|e| e.to_string())?;
        }
        if coord.try_send(0, ToWorker::Ping) != Err(LinkError::Full) {
            return Err("a full queue took a message".into());
        }
        drop(coord);
        for epoch in 0..4 {
            match rank0.recv(WAIT) {
                Ok(ToWorker::Evaluate { epoch: e }) if e == epoch => {}
                other => return Err(format!("expected evaluate {epoch}, got {other:?}")),
            }
        }
        if rank0.recv(WAIT) != Err(LinkError::Gone) || rank0.try_recv() != Err(LinkError::Gone) {
            return Err("a drained link to a gone coordinator is not gone".into());
        }
        Ok(())
    }

    /// An abort order fires the handle the rank armed for that group or an older one, at once
    /// and without reaching the rank's queue; an order for an older group leaves it armed.
    #[test]
    fn abort_orders_fire_the_armed_handle() -> Result<(), String> {
        let (inbox_tx, _inbox) = flume::bounded::<Inbound>(16);
        let (coord, ends) = link(1, 1, &inbox_tx);
        let end = ends.first().ok_or("no rank")?;
        let group = HostComm::group(1);
        let comm = group.first().ok_or("no communicator")?;
        end.arm_abort(3, comm.abort_handle());
        coord.send(0, ToWorker::AbortGroup { generation: 2 }, WAIT).map_err(|e| e.to_string())?;
        if comm.abort_handle().is_aborted() {
            return Err("an order for an older group aborted a newer one".into());
        }
        coord.try_send(0, ToWorker::AbortGroup { generation: 3 }).map_err(|e| e.to_string())?;
        if !comm.abort_handle().is_aborted() {
            return Err("the armed group was not aborted".into());
        }
        if end.try_recv() != Ok(None) {
            return Err("an abort order reached the rank's queue".into());
        }
        Ok(())
    }
}

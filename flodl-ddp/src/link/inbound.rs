//! What arrives in the coordinator's inbox, and the inbox: what the links deliver and what the
//! coordinator's own process posts, two bounded queues read as one.

use std::convert::Infallible;
use std::time::Duration;

use super::frames::Attached;
use super::wire::ToCoordinator;

/// What arrives in the coordinator's inbox: a rank's message or the end of its link, stamped
/// with the rank of the link it came through (not the rank the message claims), or an event
/// of the coordinator's own process (`L`; none in what a link delivers).
#[derive(Debug)]
pub(crate) enum Inbound<L = Infallible> {
    /// A message from `rank`.
    Wire {
        /// The rank at the other end of the link.
        rank: usize,
        /// What it sent.
        msg: ToCoordinator,
    },
    /// `rank`'s end of the link is gone; nothing more comes from it.
    Gone {
        /// The rank whose link ended.
        rank: usize,
    },
    /// `rank`, whose link was gone, connected again (a restarted rank process): its new
    /// connection, for [`super::CoordinatorLink::attach`]. What follows from `rank` comes through it.
    Joined {
        /// The rank that joined again.
        rank: usize,
        /// Its new connection.
        frames: Attached,
    },
    /// An event from within the coordinator's process.
    Local(L),
}

impl Inbound {
    /// What a link delivered, as an event of an inbox that also holds the process's own.
    fn widen<L>(self) -> Inbound<L> {
        match self {
            Inbound::Wire { rank, msg } => Inbound::Wire { rank, msg },
            Inbound::Gone { rank } => Inbound::Gone { rank },
            Inbound::Joined { rank, frames } => Inbound::Joined { rank, frames },
            Inbound::Local(never) => match never {},
        }
    }
}

/// The coordinator's inbox: what the links deliver (in order per rank) and the events of its
/// own process (`L`), read as one; the process's own events first when both wait.
#[derive(Debug)]
pub(crate) struct Inbox<L> {
    links: flume::Receiver<Inbound>,
    own: flume::Receiver<L>,
    /// Keeps the links' queue open when every link has ended.
    _open: flume::Sender<Inbound>,
}

/// An inbox holding `capacity` deliveries of the links and `capacity` events of the process,
/// where the links deliver, and where the process posts.
pub(crate) fn inbox<L>(capacity: usize) -> (Inbox<L>, flume::Sender<Inbound>, flume::Sender<L>) {
    let (links_tx, links) = flume::bounded(capacity);
    let (own_tx, own) = flume::bounded(capacity);
    (Inbox { links, own, _open: links_tx.clone() }, links_tx, own_tx)
}

impl<L> Inbox<L> {
    /// The next event if one is waiting.
    ///
    /// # Errors
    /// [`flume::TryRecvError::Empty`] when none is (the inbox stays open while it lives).
    pub(crate) fn try_recv(&self) -> Result<Inbound<L>, flume::TryRecvError> {
        match self.own.try_recv() {
            Ok(event) => Ok(Inbound::Local(event)),
            Err(_) => self.links.try_recv().map(Inbound::widen),
        }
    }

    /// The next event, waiting at most `wait`.
    ///
    /// # Errors
    /// [`flume::RecvTimeoutError::Timeout`] when none came.
    pub(crate) fn recv_timeout(
        &self,
        wait: Duration,
    ) -> Result<Inbound<L>, flume::RecvTimeoutError> {
        if let Ok(event) = self.try_recv() {
            return Ok(event);
        }
        let disconnected = |_| flume::RecvTimeoutError::Disconnected;
        flume::Selector::new()
            .recv(&self.own, |r| r.map(Inbound::Local).map_err(disconnected))
            .recv(&self.links, |r| r.map(Inbound::widen).map_err(disconnected))
            .wait_timeout(wait)
            .unwrap_or(Err(flume::RecvTimeoutError::Timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    /// Both queues reach the reader, the process's own events first; an empty inbox times out
    /// after the wait, even once every link has ended.
    #[test]
    fn both_queues_are_read_as_one() -> Result<(), String> {
        let (inbox, links, own) = inbox::<u32>(4);
        links.send(Inbound::Gone { rank: 1 }).map_err(|e| e.to_string())?;
        own.send(7).map_err(|e| e.to_string())?;
        match inbox.recv_timeout(WAIT) {
            Ok(Inbound::Local(7)) => {}
            other => return Err(format!("expected the own event first, got {other:?}")),
        }
        match inbox.try_recv() {
            Ok(Inbound::Gone { rank: 1 }) => {}
            other => return Err(format!("expected rank 1 gone, got {other:?}")),
        }
        drop(links);
        let waited = std::time::Instant::now();
        let wait = Duration::from_millis(50);
        if !matches!(inbox.recv_timeout(wait), Err(flume::RecvTimeoutError::Timeout))
            || waited.elapsed() < wait
        {
            return Err("an empty inbox did not wait".into());
        }
        let sender = own.clone();
        let posted = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            sender.send(9)
        });
        match inbox.recv_timeout(WAIT) {
            Ok(Inbound::Local(9)) => {}
            other => return Err(format!("expected the later event, got {other:?}")),
        }
        posted.join().map_err(|_| "the poster panicked")?.map_err(|e| e.to_string())?;
        Ok(())
    }
}

//! The network link: the coordinator's end and a rank's end over one connection per rank,
//! each a [`Frames`] carrying opaque frames in order on two lanes (the network flavor of
//! [`CoordinatorLink`](super::CoordinatorLink) and [`RankLink`](super::RankLink)).
//!
//! Wire messages travel as [`frame`](super::frame)s. A reader thread per connection turns
//! arriving frames into what the runtime expects of any link: on the coordinator's side
//! `Inbound::Wire` events stamped with the connection's rank (not the rank a message claims),
//! then `Inbound::Gone` once the connection ends; on a rank's side a bounded queue of orders,
//! with [`ToWorker::AbortGroup`] fired on arrival as the in-process link does. A frame that
//! does not decode is a protocol error: it is logged and ends that connection (the peer is
//! then gone), it never panics.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use flodl_nccl::AbortHandle;

use super::delta::Direction;
use super::frame::{self, Framed, WireFormat};
use super::frames::{Arrivals, Attached, Frames};
use super::held::Held;
use super::inbound::Inbound;
use super::link_error::LinkError;
use super::local::Armed;
use super::views::Views;
use super::wire::{ToCoordinator, ToWorker};
use crate::control::metrics::Exchange;
use crate::state::HostState;
use crate::{Error, Result};

/// How long a reader waits for a frame (or for room) before it looks at its stop flag.
const POLL: Duration = Duration::from_millis(50);
/// Orders a rank's reader may queue ahead of the rank's loop.
const TO_RANK: usize = 256;

/// Hands `item` to `tx`, waiting in steps of [`POLL`] while `stop` is unset; false when it
/// could not (stopped, or nobody listens any more).
fn deliver<T>(tx: &flume::Sender<T>, mut item: T, stop: &AtomicBool) -> bool {
    loop {
        match tx.send_timeout(item, POLL) {
            Ok(()) => return true,
            Err(flume::SendTimeoutError::Disconnected(_)) => return false,
            Err(flume::SendTimeoutError::Timeout(back)) => {
                if stop.load(Ordering::Acquire) {
                    return false;
                }
                item = back;
            }
        }
    }
}

/// This end's views of a connection under a quantized format (none under f32 and bf16).
type Coder = Option<Arc<Mutex<Views>>>;

/// The views of a connection in `format` for a model cut into `fragments`, as the end that
/// sends in `direction` keeps them.
fn coder(format: WireFormat, direction: Direction, fragments: usize) -> Coder {
    format.quantized().map(|q| Arc::new(Mutex::new(Views::new(q, direction, fragments))))
}

/// A starting state this end of a connection knows the receiving end holds ([`Held`]).
type Holding = Mutex<Option<Held>>;

/// Reads frames from `frames` until it ends or `stop` is set, decoding each (through `coder`,
/// and `holding` for a starting state named by digest) and handing it to `deliver`; returns
/// true when the connection ended (rather than a stop or a refusal to take more). `deliver`
/// gets each message with its frame's length.
fn read_frames<M: Framed>(
    frames: &Frames,
    (coder, holding): (&Coder, Option<&Holding>),
    peer: &str,
    stop: &AtomicBool,
    mut deliver: impl FnMut(M, usize) -> bool,
) -> bool {
    while !stop.load(Ordering::Acquire) {
        match frames.recv(POLL) {
            Ok(bytes) => match decode_frame::<M>(&bytes, coder, holding) {
                Ok(msg) => {
                    if !deliver(msg, bytes.len()) {
                        return false;
                    }
                }
                Err(error) if error.is_stale() => {
                    tracing::debug!(peer, %error, "a late snapshot dropped");
                }
                Err(error) => {
                    tracing::error!(peer, %error, "a frame violates the protocol: closing the connection");
                    frames.close();
                    return true;
                }
            },
            Err(LinkError::Timeout(_) | LinkError::Full) => {}
            Err(LinkError::Gone) => return true,
        }
    }
    false
}

/// Decodes one frame through `coder`, and `holding` for a starting state named by digest.
fn decode_frame<M: Framed>(
    bytes: &[u8],
    coder: &Coder,
    holding: Option<&Holding>,
) -> std::result::Result<M, frame::FrameError> {
    let mut coder = coder.as_ref().map(|c| c.lock().unwrap_or_else(|p| p.into_inner()));
    let mut held = holding.map(|h| h.lock().unwrap_or_else(|p| p.into_inner()));
    frame::decode_with(bytes, coder.as_deref_mut(), held.as_mut().and_then(|h| h.as_mut()))
}

/// Sends `msg` as one frame in `format`, through `coder` under a quantized format, naming its
/// starting state when it is the one `held` says the rank holds; returns the frame's length.
fn send_frame<M: Framed>(
    frames: &Frames,
    msg: M,
    (format, coder, held): (WireFormat, &Coder, Option<&Held>),
    wait: Option<Duration>,
) -> std::result::Result<usize, LinkError> {
    let mut coder = coder.as_ref().map(|c| c.lock().unwrap_or_else(|p| p.into_inner()));
    let encoded = frame::encode_with(msg, format, coder.as_deref_mut(), held);
    drop(coder);
    let (lane, bytes) = encoded.map_err(|e| {
        // Plain data always encodes, and a rank checks its snapshot is finite before it sends
        // it: a failure here is a bug, reported as a lost peer.
        tracing::error!(error = %e, "a wire message did not encode");
        LinkError::Gone
    })?;
    let len = bytes.len();
    match wait {
        Some(wait) => frames.send(lane, bytes, wait)?,
        None => frames.try_send(lane, bytes)?,
    }
    Ok(len)
}

/// The length of the last consensus-update frame sent to each rank, by rank: what the rank's
/// next snapshot reports as the bytes it received.
type UpdateBytes = Vec<AtomicU64>;

/// The starting state each rank said it holds, by rank, until its `Init` is sent.
type Holds = Vec<Holding>;

/// A connection per rank, by global rank (`None` for ranks that are not remote).
type Table = std::sync::RwLock<Vec<Option<Arc<Frames>>>>;
/// The reader thread of each rank's current connection.
type Readers = std::sync::Mutex<Vec<Option<JoinHandle<()>>>>;

/// The coordinator's end of the network link: a connection per remote rank, each read by its
/// own thread into the coordinator's inbox, and a thread that takes the connections of ranks
/// joining again.
///
/// Per rank, the inbox holds the old connection's messages, its `Gone`, then
/// [`Inbound::Joined`] with the new connection, then the new connection's messages: the
/// joining thread waits for the old reader to end before it posts the join and starts the new
/// reader. The coordinator sends on the new connection only once it has read the join
/// ([`NetCoordinator::attach`]), so orders meant for the dead process never reach its
/// successor.
pub(crate) struct NetCoordinator {
    ranks: Arc<Table>,
    format: WireFormat,
    /// Each rank's connection's view under a quantized format, by rank.
    coders: Arc<Vec<Coder>>,
    updates: Arc<UpdateBytes>,
    holds: Arc<Holds>,
    /// The rank whose state is watched (the standby's: [`NetCoordinator::watch`]).
    watch: AtomicUsize,
    /// The digest of the whole state the watched rank was last sent, as it reads it.
    watched: Mutex<Option<[u8; 32]>>,
    stop: Arc<AtomicBool>,
    readers: Arc<Readers>,
    joiner: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for NetCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ranks = self.ranks.read().unwrap_or_else(|p| p.into_inner());
        let remote: Vec<usize> =
            ranks.iter().enumerate().filter(|(_, c)| c.is_some()).map(|(r, _)| r).collect();
        f.debug_struct("NetCoordinator").field("remote", &remote).finish_non_exhaustive()
    }
}

/// Starts the thread that reads `frames`, rank `rank`'s connection, into `inbox`.
/// A snapshot's `exchange` is written here from the frames its connection carried, and the
/// starting state a `Ready` says the rank holds is kept in `holds`.
fn spawn_reader(
    rank: usize,
    frames: Arc<Frames>,
    (coder, updates, holds): (Coder, Arc<UpdateBytes>, Arc<Holds>),
    inbox: flume::Sender<Inbound>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("flodl-link-{rank}"))
        .spawn(move || {
            let peer = format!("rank {rank}");
            let to_inbox = |mut msg, len: usize| {
                match &mut msg {
                    ToCoordinator::Snapshot { exchange, .. } => {
                        let received = updates.get(rank).map_or(0, |u| u.load(Ordering::Relaxed));
                        *exchange = Exchange { sent_bytes: len as u64, received_bytes: received };
                    }
                    ToCoordinator::Ready { holds: Some(digest), .. } => {
                        if let Some(slot) = holds.get(rank) {
                            *slot.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(Held::peer(*digest));
                        }
                    }
                    _ => {}
                }
                deliver(&inbox, Inbound::Wire { rank, msg }, &stop)
            };
            let ends = (&coder, None);
            if read_frames::<ToCoordinator>(frames.as_ref(), ends, &peer, &stop, to_inbox) {
                deliver(&inbox, Inbound::Gone { rank }, &stop);
            }
        })
        .map_err(|source| Error::Spawn { what: "a link reader", source })
}

/// How long the joining thread waits for a rejoining rank's old reader to end (its session has
/// ended already: the controller frees a rank's seat only then).
const OLD_READER: Duration = Duration::from_secs(30);

impl NetCoordinator {
    /// The coordinator's end for `world` ranks, of which the ranks in `remote` are reached
    /// through their connection (in `format`, the model cut into `fragments`); what they send
    /// goes to `inbox`. Ranks that join again later come from `arrivals`, except those in
    /// `here` (the controller's own process).
    ///
    /// # Errors
    /// [`Error::Spawn`] when a thread cannot start.
    pub(crate) fn new(
        (world, here): (usize, &[usize]),
        remote: Vec<(usize, Arc<Frames>)>,
        (format, fragments): (WireFormat, usize),
        inbox: &flume::Sender<Inbound>,
        arrivals: Option<Arrivals>,
    ) -> Result<NetCoordinator> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut table: Vec<Option<Arc<Frames>>> = vec![None; world];
        let mut readers: Vec<Option<JoinHandle<()>>> = (0..world).map(|_| None).collect();
        let coders: Arc<Vec<Coder>> =
            Arc::new((0..world).map(|_| coder(format, Direction::Consensus, fragments)).collect());
        let updates: Arc<UpdateBytes> = Arc::new((0..world).map(|_| AtomicU64::new(0)).collect());
        let holds: Arc<Holds> = Arc::new((0..world).map(|_| Mutex::new(None)).collect());
        let mut link = NetCoordinator {
            ranks: Arc::new(Table::default()),
            format,
            coders: coders.clone(),
            updates: updates.clone(),
            holds: holds.clone(),
            watch: AtomicUsize::new(usize::MAX),
            watched: Mutex::new(None),
            stop: stop.clone(),
            readers: Arc::new(Readers::default()),
            joiner: None,
        };
        for (rank, frames) in remote {
            let (Some(slot), Some(reader)) = (table.get_mut(rank), readers.get_mut(rank)) else {
                return Err(Error::protocol(format!(
                    "remote rank {rank} is outside a world of {world}"
                )));
            };
            *slot = Some(frames.clone());
            let ends = (coders.get(rank).cloned().flatten(), updates.clone(), holds.clone());
            *reader = Some(spawn_reader(rank, frames, ends, inbox.clone(), stop.clone())?);
        }
        link.ranks = Arc::new(std::sync::RwLock::new(table));
        link.readers = Arc::new(std::sync::Mutex::new(readers));
        if let Some(arrivals) = arrivals {
            let (readers, inbox) = (link.readers.clone(), inbox.clone());
            let here = here.to_vec();
            let joiner = std::thread::Builder::new()
                .name("flodl-link-joins".into())
                .spawn(move || {
                    let ends = (coders.as_slice(), &updates, &holds);
                    take_joins(&arrivals, (world, &here), &readers, ends, &inbox, &stop)
                })
                .map_err(|source| Error::Spawn { what: "the link's joining thread", source })?;
            link.joiner = Some(joiner);
        }
        Ok(link)
    }

    fn frames(&self, rank: usize) -> std::result::Result<Arc<Frames>, LinkError> {
        let ranks = self.ranks.read().unwrap_or_else(|p| p.into_inner());
        ranks.get(rank).cloned().flatten().ok_or(LinkError::Gone)
    }

    /// Sends `msg` to `rank`; the length of a consensus update's frame is kept for the rank's
    /// next snapshot, and a starting state the rank holds is named, not carried.
    fn send_state(
        &self,
        rank: usize,
        msg: ToWorker,
        wait: Option<Duration>,
    ) -> std::result::Result<(), LinkError> {
        let update = matches!(msg, ToWorker::Update { .. });
        let watched = self.watch.load(Ordering::Relaxed) == rank;
        let whole = watched.then(|| whole_state(&msg, self.format)).flatten();
        // What the rank said it holds serves its one `Init`.
        let held = match msg {
            ToWorker::Init { .. } => self
                .holds
                .get(rank)
                .and_then(|h| h.lock().unwrap_or_else(|p| p.into_inner()).take()),
            _ => None,
        };
        let coder = self.coders.get(rank).cloned().flatten();
        let frames = self.frames(rank)?;
        let len = send_frame(frames.as_ref(), msg, (self.format, &coder, held.as_ref()), wait)?;
        if let Some(whole) = whole {
            let digest = match whole {
                Whole::Digest(digest) => digest,
                Whole::Views { params, buffers } => coder.as_ref().and_then(|c| {
                    let views = c.lock().unwrap_or_else(|p| p.into_inner());
                    views.decoded(&params, &buffers).map(|state| state.digest())
                }),
            };
            *self.watched.lock().unwrap_or_else(|p| p.into_inner()) = digest;
        }
        if update && let Some(u) = self.updates.get(rank) {
            u.store(len as u64, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// What a message sent to the watched rank makes of the whole state it holds.
enum Whole {
    /// It holds this state, or none known (`None`).
    Digest(Option<[u8; 32]>),
    /// It holds the connection's views after the frame, in this layout.
    Views { params: Vec<usize>, buffers: Vec<usize> },
}

/// What `msg` in `format` makes of the whole state its rank holds for a standby's cut to name
/// (the state of its last whole update): `None` when it leaves it as it was.
fn whole_state(msg: &ToWorker, format: WireFormat) -> Option<Whole> {
    match msg {
        ToWorker::Update { state, fragment: None, .. } => Some(match format {
            WireFormat::F32 => Whole::Digest(Some(state.digest())),
            // Rounded on the way: the rank's copy is not known here.
            WireFormat::Bf16 => Whole::Digest(None),
            WireFormat::Int8 | WireFormat::Q4 => Whole::Views {
                params: state.params.iter().map(Vec::len).collect(),
                buffers: state.buffers.iter().map(Vec::len).collect(),
            },
        }),
        // A starting state replaces it; no cut names one.
        ToWorker::Init { .. } => Some(Whole::Digest(None)),
        _ => None,
    }
}

/// The joining thread: each rank admitted again (never one in the controller's own process,
/// `here`) is posted to the inbox once its old reader has ended, then read.
fn take_joins(
    arrivals: &Arrivals,
    (world, here): (usize, &[usize]),
    readers: &Readers,
    (coders, updates, holds): (&[Coder], &Arc<UpdateBytes>, &Arc<Holds>),
    inbox: &flume::Sender<Inbound>,
    stop: &Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Acquire) {
        let Some((rank, frames)) = arrivals.next(POLL) else { continue };
        if rank >= world || here.contains(&rank) {
            tracing::warn!(rank, "a join for a rank that cannot join again was closed");
            frames.close();
            continue;
        }
        let old =
            readers.lock().unwrap_or_else(|p| p.into_inner()).get_mut(rank).and_then(Option::take);
        if let Some(old) = old {
            let deadline = std::time::Instant::now() + OLD_READER;
            while !old.is_finished() && std::time::Instant::now() < deadline {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(POLL);
            }
            if !old.is_finished() {
                tracing::warn!(
                    rank,
                    "rank's old connection still read after {OLD_READER:?}: its new one is closed"
                );
                frames.close();
                if let Some(slot) = readers.lock().unwrap_or_else(|p| p.into_inner()).get_mut(rank)
                {
                    *slot = Some(old);
                }
                continue;
            }
            let _ = old.join();
        }
        tracing::info!(rank, "rank connected again");
        if !deliver(inbox, Inbound::Joined { rank, frames: Attached(frames.clone()) }, stop) {
            frames.close();
            return;
        }
        // The new process starts from its `Init`, which sets both ends' view afresh.
        if let Some(slot) = holds.get(rank) {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        let ends = (coders.get(rank).cloned().flatten(), updates.clone(), holds.clone());
        match spawn_reader(rank, frames.clone(), ends, inbox.clone(), stop.clone()) {
            Ok(reader) => {
                if let Some(slot) = readers.lock().unwrap_or_else(|p| p.into_inner()).get_mut(rank)
                {
                    *slot = Some(reader);
                }
            }
            Err(e) => {
                tracing::error!(rank, error = %e, "no reader for a rank joining again");
                frames.close();
                deliver(inbox, Inbound::Gone { rank }, stop);
            }
        }
    }
}

impl NetCoordinator {
    /// As [`CoordinatorLink::send`](super::CoordinatorLink::send).
    pub(crate) fn send(
        &self,
        rank: usize,
        msg: ToWorker,
        wait: Duration,
    ) -> std::result::Result<(), LinkError> {
        self.send_state(rank, msg, Some(wait))
    }

    /// As [`CoordinatorLink::try_send`](super::CoordinatorLink::try_send).
    pub(crate) fn try_send(
        &self,
        rank: usize,
        msg: ToWorker,
    ) -> std::result::Result<(), LinkError> {
        self.send_state(rank, msg, None)
    }

    /// As [`CoordinatorLink::watch`](super::CoordinatorLink::watch).
    pub(crate) fn watch(&self, rank: usize) {
        self.watch.store(rank, Ordering::Relaxed);
        *self.watched.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// As [`CoordinatorLink::watched`](super::CoordinatorLink::watched).
    pub(crate) fn watched(&self) -> Option<[u8; 32]> {
        *self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// As [`CoordinatorLink::sever`](super::CoordinatorLink::sever).
    pub(crate) fn sever(&self, rank: usize) {
        if let Ok(frames) = self.frames(rank) {
            frames.close();
        }
    }

    /// As [`CoordinatorLink::arriving`](super::CoordinatorLink::arriving).
    pub(crate) fn arriving(&self, rank: usize) -> Option<std::time::Instant> {
        self.frames(rank).ok().and_then(|f| f.arriving())
    }

    /// As [`CoordinatorLink::attach`](super::CoordinatorLink::attach).
    pub(crate) fn attach(&self, rank: usize, frames: Arc<Frames>) -> bool {
        let mut ranks = self.ranks.write().unwrap_or_else(|p| p.into_inner());
        match ranks.get_mut(rank) {
            Some(slot) => {
                if let Some(old) = slot.replace(frames) {
                    old.close();
                }
                true
            }
            None => false,
        }
    }
}

impl Drop for NetCoordinator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(joiner) = self.joiner.take() {
            let _ = joiner.join();
        }
        let readers: Vec<JoinHandle<()>> = self
            .readers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        for reader in readers {
            // A reader catches nothing: a panic there has nothing left to report.
            let _ = reader.join();
        }
    }
}

/// A rank's end of the network link: its connection, read by a thread that fires abort
/// orders on arrival and queues the rest for the rank's loop.
pub(crate) struct NetRank {
    frames: Arc<Frames>,
    format: WireFormat,
    /// The connection's view under a quantized format.
    coder: Coder,
    /// The starting state this rank built and offered, until its `Init` arrives.
    holding: Arc<Holding>,
    rx: flume::Receiver<ToWorker>,
    armed: Arc<Armed>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for NetRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetRank").field("format", &self.format).finish_non_exhaustive()
    }
}

impl NetRank {
    /// As [`RankLink::arriving`](super::RankLink::arriving).
    pub(crate) fn arriving(&self) -> Option<std::time::Instant> {
        self.frames.arriving()
    }

    /// A rank's end over `frames`, in `format` with the model cut into `fragments`.
    ///
    /// # Errors
    /// [`Error::Spawn`] when the reader thread cannot start.
    pub(crate) fn new(
        frames: Arc<Frames>,
        (format, fragments): (WireFormat, usize),
    ) -> Result<NetRank> {
        let (tx, rx) = flume::bounded(TO_RANK);
        let armed = Arc::new(Armed::default());
        let stop = Arc::new(AtomicBool::new(false));
        let coder = coder(format, Direction::Replica, fragments);
        let holding: Arc<Holding> = Arc::new(Mutex::new(None));
        let reader = {
            let (frames, armed, stop) = (frames.clone(), armed.clone(), stop.clone());
            let (coder, holding) = (coder.clone(), holding.clone());
            std::thread::Builder::new()
                .name("flodl-link".into())
                .spawn(move || {
                    let to_loop = |msg: ToWorker, _| match msg {
                        ToWorker::AbortGroup { generation } => {
                            armed.fire(generation);
                            true
                        }
                        msg => {
                            // The offer serves one `Init`, named or not.
                            if matches!(msg, ToWorker::Init { .. }) {
                                *holding.lock().unwrap_or_else(|p| p.into_inner()) = None;
                            }
                            deliver(&tx, msg, &stop)
                        }
                    };
                    let peer = "the coordinator";
                    let ends = (&coder, Some(holding.as_ref()));
                    read_frames::<ToWorker>(frames.as_ref(), ends, peer, &stop, to_loop);
                    // Dropping `tx` tells the loop the coordinator is gone once it has drained.
                })
                .map_err(|source| Error::Spawn { what: "a link reader", source })?
        };
        Ok(NetRank { frames, format, coder, holding, rx, armed, stop, reader: Some(reader) })
    }
}

impl NetRank {
    /// As [`RankLink::send`](super::RankLink::send).
    pub(crate) fn send(
        &self,
        msg: ToCoordinator,
        wait: Duration,
    ) -> std::result::Result<(), LinkError> {
        send_frame(self.frames.as_ref(), msg, (self.format, &self.coder, None), Some(wait))
            .map(|_| ())
    }

    /// As [`RankLink::offer`](super::RankLink::offer): keeps `state` for the `Init` to name.
    pub(crate) fn offer(&self, state: HostState) -> [u8; 32] {
        let held = Held::own(state);
        let digest = held.digest();
        *self.holding.lock().unwrap_or_else(|p| p.into_inner()) = Some(held);
        digest
    }

    /// As [`RankLink::recv`](super::RankLink::recv).
    pub(crate) fn recv(&self, wait: Duration) -> std::result::Result<ToWorker, LinkError> {
        self.rx.recv_timeout(wait).map_err(|e| match e {
            flume::RecvTimeoutError::Timeout => LinkError::Timeout(wait),
            flume::RecvTimeoutError::Disconnected => LinkError::Gone,
        })
    }

    /// As [`RankLink::try_recv`](super::RankLink::try_recv).
    pub(crate) fn try_recv(&self) -> std::result::Result<Option<ToWorker>, LinkError> {
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

impl Drop for NetRank {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use flodl_nccl::HostComm;

    use super::*;
    use crate::link::frame::Lane;
    use crate::link::frames::pair as mem_pair;
    use crate::state::HostState;

    const WAIT: Duration = Duration::from_secs(5);

    fn state() -> HostState {
        HostState { params: vec![vec![0.5, -1.25, 3.0]], buffers: vec![vec![2.0]] }
    }

    /// Messages from two remote ranks arrive in order, stamped with their connection's rank;
    /// a bf16 update reaches the rank; an abort order fires the rank's armed handle without
    /// reaching its queue; a rank's dropped end is a `Gone`, and so is a garbage frame (that
    /// connection is closed, the other goes on).
    #[test]
    fn remote_ranks_talk_through_frames() -> std::result::Result<(), String> {
        let (inbox_tx, inbox) = flume::bounded::<Inbound>(64);
        let (c1, r1) = mem_pair();
        let (c2, r2) = mem_pair();
        let coord = NetCoordinator::new(
            (3, &[0]),
            vec![(1, c1), (2, c2)],
            (WireFormat::Bf16, 1),
            &inbox_tx,
            None,
        )
        .map_err(|e| e.to_string())?;
        let rank1 = NetRank::new(r1, (WireFormat::Bf16, 1)).map_err(|e| e.to_string())?;
        if coord.send(0, ToWorker::Ping, WAIT) != Err(LinkError::Gone) {
            return Err("a send to a rank that is not remote went through".into());
        }
        // Rank 1 claims to be rank 2: the stamp is the connection's.
        rank1.send(ToCoordinator::Alive { rank: 2 }, WAIT).map_err(|e| e.to_string())?;
        rank1
            .send(ToCoordinator::Final { rank: 1, state: Some(state()), capture: None }, WAIT)
            .map_err(|e| e.to_string())?;
        match inbox.recv_timeout(WAIT) {
            Ok(Inbound::Wire { rank: 1, msg: ToCoordinator::Alive { rank: 2 } }) => {}
            other => return Err(format!("expected rank 1's alive, got {other:?}")),
        }
        match inbox.recv_timeout(WAIT) {
            Ok(Inbound::Wire { rank: 1, msg: ToCoordinator::Final { state: Some(s), .. } })
                if s == state() => {}
            other => return Err(format!("expected rank 1's final state, got {other:?}")),
        }
        let group = HostComm::group(1);
        let comm = group.first().ok_or("no communicator")?;
        rank1.arm_abort(0, comm.abort_handle());
        coord.send(1, ToWorker::AbortGroup { generation: 0 }, WAIT).map_err(|e| e.to_string())?;
        let window = crate::link::wire::Window { round: 2, target: 3, limit: 3, wall: None };
        let update = ToWorker::Update {
            state: state(),
            next: window,
            eval: None,
            global_step: 9,
            fragment: None,
        };
        coord.send(1, update.clone(), WAIT).map_err(|e| e.to_string())?;
        match rank1.recv(WAIT) {
            Ok(got) if got == update => {}
            other => return Err(format!("expected the update, got {other:?}")),
        }
        if !comm.abort_handle().is_aborted() {
            return Err("the abort order did not fire the armed handle".into());
        }
        drop(rank1);
        match inbox.recv_timeout(WAIT) {
            Ok(Inbound::Gone { rank: 1 }) => {}
            other => return Err(format!("expected rank 1 gone, got {other:?}")),
        }
        r2.send(Lane::Control, vec![0xff; 9], WAIT).map_err(|e| e.to_string())?;
        match inbox.recv_timeout(WAIT) {
            Ok(Inbound::Gone { rank: 2 }) => {}
            other => return Err(format!("expected rank 2 gone after garbage, got {other:?}")),
        }
        if r2.recv(WAIT) != Err(LinkError::Gone) {
            return Err("the garbage sender's connection stayed open".into());
        }
        Ok(())
    }

    /// A rank that offered the state it built and said so in `Ready` gets an `Init` of that
    /// state as a frame of its digest, and its end puts the state back in; the offer serves one
    /// `Init` (a second travels whole).
    #[test]
    fn an_init_of_the_state_a_rank_built_travels_as_its_digest() -> std::result::Result<(), String>
    {
        let big = HostState { params: vec![vec![0.25; 50_000]], buffers: vec![vec![1.0]] };
        let (inbox_tx, inbox) = flume::bounded::<Inbound>(64);
        let (c1, r1) = mem_pair();
        let coord =
            NetCoordinator::new((2, &[0]), vec![(1, c1)], (WireFormat::F32, 1), &inbox_tx, None)
                .map_err(|e| e.to_string())?;
        // The rank's end, over a pair whose other end relays the coordinator's frames.
        let (relay, r) = mem_pair();
        let rank = NetRank::new(r, (WireFormat::F32, 1)).map_err(|e| e.to_string())?;
        let holds = Some(rank.offer(big.clone()));
        let ready = ToCoordinator::Ready { rank: 1, shapes: vec![], initial: None, holds };
        let (lane, bytes) = frame::encode(ready, WireFormat::F32).map_err(|e| e.to_string())?;
        r1.send(lane, bytes, WAIT).map_err(|e| e.to_string())?;
        match inbox.recv_timeout(WAIT) {
            Ok(Inbound::Wire { rank: 1, msg: ToCoordinator::Ready { .. } }) => {}
            other => return Err(format!("expected rank 1's ready, got {other:?}")),
        }
        let window = crate::link::wire::Window { round: 1, target: 1, limit: 1, wall: None };
        let init = ToWorker::Init { state: big.clone(), restore: None, window, global_step: 0 };
        for (i, most) in [(0, 1000), (1, usize::MAX)] {
            coord.send(1, init.clone(), WAIT).map_err(|e| e.to_string())?;
            let bytes = r1.recv(WAIT).map_err(|e| e.to_string())?;
            let whole = bytes.len() > 200_000;
            if (most == 1000) == whole || bytes.len() > most {
                return Err(format!("init {i}: a frame of {} bytes", bytes.len()));
            }
            relay.send(Lane::Bulk, bytes.to_vec(), WAIT).map_err(|e| e.to_string())?;
            match rank.recv(WAIT) {
                Ok(got) if got == init => {}
                other => return Err(format!("init {i}: the rank got {other:?}")),
            }
        }
        Ok(())
    }

    /// A rank whose coordinator sends garbage, or goes away, sees it gone once drained.
    #[test]
    fn a_rank_sees_a_bad_or_lost_coordinator_gone() -> std::result::Result<(), String> {
        for garbage in [true, false] {
            let (c, r) = mem_pair();
            let rank = NetRank::new(r, (WireFormat::F32, 1)).map_err(|e| e.to_string())?;
            let (_, ping) =
                frame::encode(ToWorker::Ping, WireFormat::F32).map_err(|e| e.to_string())?;
            c.send(Lane::Control, ping, WAIT).map_err(|e| e.to_string())?;
            if garbage {
                c.send(Lane::Control, vec![200; 3], WAIT).map_err(|e| e.to_string())?;
            } else {
                c.close();
            }
            if rank.recv(WAIT) != Ok(ToWorker::Ping) {
                return Err("the order before the end was lost".into());
            }
            if rank.recv(WAIT) != Err(LinkError::Gone) {
                return Err(format!("garbage {garbage}: the coordinator is not gone"));
            }
        }
        Ok(())
    }
}

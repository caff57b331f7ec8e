//! The lane's far end in a cluster run: its frames on their way to the standby rank's process.

use crate::runtime::engine::standby::lane::StandbyLane;

/// The lane's frames forwarded, in order, to the standby rank's process as
/// `ToWorker::Mirror` (never waited for: a frame the link has no room for is held for the
/// controller's next tick, and the lane itself falls back to the whole state when it fills).
#[derive(Debug)]
pub(crate) struct Pump {
    pub(crate) rank: usize,
    pub(crate) rx: flume::Receiver<Vec<u8>>,
    pub(crate) held: Option<Vec<u8>>,
    pub(crate) reach: Reach,
}

impl Pump {
    /// A pump to `rank`'s process and the sending end of the lane it drains.
    pub(crate) fn to(rank: usize) -> (Pump, flume::Sender<Vec<u8>>) {
        let (tx, rx) = StandbyLane::channel();
        (Pump { rank, rx, held: None, reach: Reach::Awaited }, tx)
    }
}

/// Whether the standby's process is reached: one not admitted yet, or whose link went, is sent
/// nothing until a process for its seat is admitted, which is then sent the whole state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// No process for its seat has been admitted yet (the run is starting).
    Awaited,
    /// Its process is admitted and sent every frame.
    Up,
    /// Its link is gone; `down` once its seat was seen not alive (dead, or joining again).
    Lost { down: bool },
}

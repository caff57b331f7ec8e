//! The controller's seats: which ranks are joining (one lane up, waiting for the other) and which
//! are connected.

use std::collections::HashMap;
use std::sync::Mutex;

use super::refusal::Refusal;
use crate::session::Lane;
use crate::wire::LaneHello;

/// One rank's seat; a free seat is absent from the map.
#[derive(Debug)]
enum Seat<C> {
    /// One join's lanes, as they arrive (paired by the join's token).
    Joining { token: u64, lanes: [Option<C>; 2] },
    /// A session runs for this join.
    Connected { token: u64 },
}

/// What became of a lane offered to the registry.
#[derive(Debug)]
pub(crate) enum Offer<C> {
    /// Refused: the connection comes back so the refusal can be written on it.
    Refused(Refusal, C),
    /// Held until the join's other lane arrives.
    Held,
    /// Both lanes of the join are here, control first; the seat is now connected.
    Complete([C; 2]),
}

/// The seats of every rank, behind one lock (held only for map updates, never across an await).
#[derive(Debug)]
pub(crate) struct Registry<C> {
    seats: Mutex<HashMap<usize, Seat<C>>>,
}

impl<C> Registry<C> {
    pub(crate) fn new() -> Registry<C> {
        Registry { seats: Mutex::new(HashMap::new()) }
    }

    /// Takes a lane whose hello passed the static checks.
    pub(crate) fn offer(&self, hello: &LaneHello, conn: C) -> Offer<C> {
        let rank = hello.hello.rank;
        let i = hello.lane.index();
        let mut seats = self.seats.lock().unwrap_or_else(|p| p.into_inner());
        match seats.get_mut(&rank) {
            None => {
                let mut lanes = [None, None];
                lanes[i] = Some(conn);
                seats.insert(rank, Seat::Joining { token: hello.token, lanes });
                Offer::Held
            }
            Some(Seat::Connected { .. }) => Offer::Refused(Refusal::Connected { rank }, conn),
            Some(Seat::Joining { token, .. }) if *token != hello.token => {
                Offer::Refused(Refusal::Joining { rank }, conn)
            }
            Some(Seat::Joining { lanes, .. }) if lanes[i].is_some() => {
                Offer::Refused(Refusal::LaneTwice { rank, lane: hello.lane }, conn)
            }
            Some(Seat::Joining { lanes, .. }) => {
                lanes[i] = Some(conn);
                match lanes {
                    [Some(_), Some(_)] => {
                        let [Some(control), Some(bulk)] =
                            [lanes[Lane::Control.index()].take(), lanes[Lane::Bulk.index()].take()]
                        else {
                            return Offer::Held;
                        };
                        seats.insert(rank, Seat::Connected { token: hello.token });
                        Offer::Complete([control, bulk])
                    }
                    _ => Offer::Held,
                }
            }
        }
    }

    /// Frees a seat still joining with `token` (its other lane never came); its lane is dropped.
    pub(crate) fn expire(&self, rank: usize, token: u64) -> bool {
        let mut seats = self.seats.lock().unwrap_or_else(|p| p.into_inner());
        let expired =
            matches!(seats.get(&rank), Some(Seat::Joining { token: t, .. }) if *t == token);
        if expired {
            seats.remove(&rank);
        }
        expired
    }

    /// Frees a seat whose session with `token` has ended, so the rank may join again.
    pub(crate) fn release(&self, rank: usize, token: u64) {
        let mut seats = self.seats.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(seats.get(&rank), Some(Seat::Connected { token: t }) if *t == token) {
            seats.remove(&rank);
        }
    }
}

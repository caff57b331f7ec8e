//! This process's registry of host all-reduce groups formed through the
//! controller: the in-memory collective engine ([`crate::CollectiveEngine::InMemory`]).
//!
//! An NCCL group of ranks with seats of their own is named by a unique id its lowest member
//! makes and the controller relays; a member joins it with the id alone. The in-memory engine
//! does the same with a [`GroupKey`]: the first member to claim its communicator makes the
//! `HostComm` group, the others take theirs. A key means something only in the process that
//! made it, so the engine serves cluster runs whose ranks are threads of one process
//! (in-memory connections) and never a run across processes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flodl_nccl::HostComm;

use crate::link::wire::GroupKey;
use crate::{Error, Result};

/// A group some of whose members have not taken their communicator yet.
struct Pending {
    /// Each member's communicator, `None` once taken.
    comms: Vec<Option<HostComm>>,
    /// When the members that never came are given up (the group is dropped, which aborts it
    /// for those that came).
    deadline: Instant,
}

/// Groups closed (taken by every member, or given up) remembered, so that a late claim of one
/// is refused rather than making the group anew.
const CLOSED: usize = 1024;

/// This process's groups: those not yet taken by all their members, and the last closed keys.
struct Registry {
    pending: BTreeMap<GroupKey, Pending>,
    closed: VecDeque<GroupKey>,
}

impl Registry {
    fn close(&mut self, key: GroupKey) {
        self.pending.remove(&key);
        if self.closed.len() >= CLOSED {
            self.closed.pop_front();
        }
        self.closed.push_back(key);
    }
}

/// The registry.
static REGISTRY: Mutex<Registry> =
    Mutex::new(Registry { pending: BTreeMap::new(), closed: VecDeque::new() });

/// The last key made in this process.
static LAST: AtomicU64 = AtomicU64::new(0);

/// A key no group of this process has had.
pub(crate) fn fresh_key() -> GroupKey {
    GroupKey(LAST.fetch_add(1, Ordering::Relaxed) + 1)
}

/// Member `position`'s communicator of group `key` of `size` members, each waiting at most
/// `timeout` in an operation; the first member to ask makes the group. A group whose
/// members have not all come within `timeout` of its making is dropped at the next claim
/// (any claim), which aborts it for those that came.
///
/// # Errors
/// [`Error::Protocol`] when the size disagrees with the group's, the position is outside
/// it or was taken already, or the group was given up.
pub(crate) fn claim(
    key: GroupKey,
    position: usize,
    size: usize,
    timeout: Duration,
) -> Result<HostComm> {
    let mut registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    let expired: Vec<GroupKey> =
        registry.pending.iter().filter(|(_, p)| p.deadline <= now).map(|(k, _)| *k).collect();
    for old in expired {
        // Dropping its communicators aborts the group for the members that came.
        tracing::warn!(key = ?old, "a host group whose members did not all come was given up");
        registry.close(old);
    }
    if key.0 == 0 || key.0 > LAST.load(Ordering::Relaxed) {
        return Err(Error::protocol(format!("{key:?} was not made in this process")));
    }
    if registry.closed.contains(&key) {
        return Err(Error::protocol(format!("{key:?} is closed (complete, or given up)")));
    }
    let group = registry.pending.entry(key).or_insert_with(|| Pending {
        comms: HostComm::group(size)
            .into_iter()
            .map(|mut c| {
                c.set_timeout(timeout);
                Some(c)
            })
            .collect(),
        deadline: now + timeout,
    });
    if group.comms.len() != size {
        return Err(Error::protocol(format!(
            "{key:?} has {} members, a member claimed it as one of {size}",
            group.comms.len()
        )));
    }
    let comm = group.comms.get_mut(position).and_then(Option::take).ok_or_else(|| {
        Error::protocol(format!("{key:?}: member {position} of {size} claimed twice"))
    })?;
    if group.comms.iter().all(Option::is_none) {
        registry.close(key);
    }
    Ok(comm)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three members claim their places of one key from their own threads and average through
    /// them; a second claim of a place, another size, or a key never made is refused; a group
    /// a member never comes to is given up after its timeout, which wakes the member waiting in
    /// it with an error instead of leaving it blocked.
    #[test]
    fn members_claim_their_places_of_a_key() -> std::result::Result<(), String> {
        let key = fresh_key();
        let wait = Duration::from_secs(10);
        let threads: Vec<_> = (0..3)
            .map(|p| {
                std::thread::spawn(move || -> std::result::Result<Vec<f32>, String> {
                    let mut comm = claim(key, p, 3, wait).map_err(|e| e.to_string())?;
                    if comm.rank() != p || comm.world_size() != 3 {
                        return Err(format!("member {p} got rank {}", comm.rank()));
                    }
                    let mut x = vec![p as f32; 4];
                    comm.all_reduce_weighted_f32(&mut [&mut x[..]], 1.0 / 3.0)
                        .map_err(|e| e.to_string())?;
                    Ok(x)
                })
            })
            .collect();
        for t in threads {
            let x = t.join().map_err(|_| "a member panicked")??;
            if x.iter().any(|v| (v - 1.0).abs() > 1e-6) {
                return Err(format!("average {x:?}"));
            }
        }
        let other = fresh_key();
        let _first = claim(other, 0, 2, wait).map_err(|e| e.to_string())?;
        for (position, size) in [(0, 2), (1, 3), (2, 2)] {
            if claim(other, position, size, wait).is_ok() {
                return Err(format!("claim ({position}, {size}) accepted"));
            }
        }
        if claim(GroupKey(u64::MAX), 0, 1, wait).is_ok() {
            return Err("a key never made was accepted".into());
        }
        // Member 1 never comes: member 0's operation ends with an error once the group is
        // given up (or its own timeout passes), never later than a few timeouts.
        let lonely = fresh_key();
        let short = Duration::from_millis(200);
        let mut comm = claim(lonely, 0, 2, short).map_err(|e| e.to_string())?;
        let t = Instant::now();
        let mut x = [1.0f32; 4];
        if comm.all_reduce_weighted_f32(&mut [&mut x[..]], 1.0).is_ok() {
            return Err("an average with a member missing succeeded".into());
        }
        if t.elapsed() > Duration::from_secs(5) {
            return Err(format!("the wait took {:?}", t.elapsed()));
        }
        std::thread::sleep(short);
        let _ = claim(fresh_key(), 0, 1, short);
        let closed = REGISTRY.lock().map_err(|_| "poisoned")?.closed.contains(&lonely);
        if !closed || claim(lonely, 1, 2, short).is_ok() {
            return Err("a group given up is still open".into());
        }
        Ok(())
    }
}

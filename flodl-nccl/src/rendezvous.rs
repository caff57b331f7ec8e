//! The shared state of a host group: the published buffers and an abortable rendezvous.
//!
//! An operation has two waits. *Arrive*: a rank publishes its buffers and waits until every rank
//! has published (abortable, bounded by the deadline); the last rank to arrive turns the posts
//! into a [`Plan`]. *Complete*: after taking chunks of the plan until none are left, a rank waits
//! until every chunk is done. Completion is deliberately not abortable: once all ranks have
//! arrived, peers hold raw pointers into this rank's buffers, and returning early would let the
//! caller free or reuse memory another thread is still writing. The chunks are bounded
//! arithmetic, so the completion wait is bounded too. Completion does not wait for the other
//! *ranks*, only for the chunks: a rank that was descheduled finds the work done by the others
//! and returns at once, so on a busy machine an operation needs each rank scheduled only once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::abort::AbortHandle;
use crate::error::{Error, Result};
use crate::plan::{Op, Plan, Post, RawBuf};

/// How long a blocked rank sleeps between checks of its deadline when nobody wakes it.
const WAIT_SLICE: Duration = Duration::from_millis(50);
/// How long a rank polls (yielding) before it sleeps, when every rank can have its own core:
/// peers of an evenly split reduction arrive within microseconds of each other, and a futex
/// wake-up costs tens of microseconds.
const SPIN: Duration = Duration::from_micros(30);

/// Why a group stopped working.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Aborted,
    PeerLost { rank: usize },
}

impl Fault {
    fn error(self) -> Error {
        match self {
            Fault::Aborted => Error::Aborted,
            Fault::PeerLost { rank } => Error::PeerLost { rank },
        }
    }
}

#[derive(Debug)]
struct State {
    /// Completed arrive phases.
    arrivals: u64,
    arrived: usize,
    fault: Option<Fault>,
    posts: Vec<Post>,
    /// The plan of the operation every rank last arrived at.
    plan: Option<Arc<Plan>>,
    /// Which ranks are blocked in the arrive phase right now.
    waiting: Vec<bool>,
    /// Which ranks have been handed out and not yet dropped.
    joined: Vec<bool>,
    /// Groups formed from this one's survivors, keyed by the survivor list.
    successors: Vec<(Vec<usize>, Weak<Group>)>,
}

/// The state all ranks of one host group share.
#[derive(Debug)]
pub(crate) struct Group {
    world: usize,
    state: Mutex<State>,
    wake: Condvar,
    /// Bumped on every change a waiter waits for (arrival, completion, fault), so a spinning rank
    /// can watch it without the lock.
    progress: AtomicU64,
    /// Whether waiting ranks spin briefly before sleeping (only when there is a core per rank).
    spin: bool,
    abort: AbortHandle,
}

impl Group {
    /// A fresh group of `world` ranks, none joined yet.
    pub(crate) fn new(world: usize) -> Arc<Group> {
        Arc::new_cyclic(|weak: &Weak<Group>| {
            let weak = weak.clone();
            Group {
                world,
                state: Mutex::new(State {
                    arrivals: 0,
                    arrived: 0,
                    fault: None,
                    posts: (0..world).map(|_| Post::default()).collect(),
                    plan: None,
                    waiting: vec![false; world],
                    joined: vec![false; world],
                    successors: Vec::new(),
                }),
                wake: Condvar::new(),
                progress: AtomicU64::new(0),
                spin: std::thread::available_parallelism().is_ok_and(|n| world <= n.get()),
                abort: AbortHandle::new(move || {
                    if let Some(group) = weak.upgrade() {
                        group.fail(Fault::Aborted);
                    }
                }),
            }
        })
    }

    /// The number of ranks.
    pub(crate) fn world(&self) -> usize {
        self.world
    }

    /// The group's abort handle.
    pub(crate) fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }

    /// Locks the state; a panic while the lock was held (which none of this module's code can
    /// cause) must not take the group down with it, so poisoning is recovered.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>, slice: Duration) -> MutexGuard<'a, State> {
        match self.wake.wait_timeout(guard, slice) {
            Ok((guard, _)) => guard,
            Err(poisoned) => poisoned.into_inner().0,
        }
    }

    /// Wakes every waiter: bumps `progress` (for spinners) and notifies the condvar (for
    /// sleepers). Called with the state lock held, after the change.
    fn announce(&self) {
        self.progress.fetch_add(1, Ordering::Release);
        self.wake.notify_all();
    }

    /// Polls for at most [`SPIN`] while `progress` still reads `seen` (no lock held).
    fn spin_while(&self, seen: u64) {
        if !self.spin {
            return;
        }
        let start = Instant::now();
        while self.progress.load(Ordering::Acquire) == seen && start.elapsed() < SPIN {
            // Yielding rather than busy-spinning lets a peer that shares this core run (measured:
            // pure spinning made small operations ten times slower on a loaded machine).
            std::thread::yield_now();
        }
    }

    fn fail(&self, fault: Fault) {
        let mut state = self.lock();
        if state.fault.is_none() {
            state.fault = Some(fault);
        }
        self.announce();
    }

    /// Marks `rank` as handed out; fails if it already is.
    pub(crate) fn join(&self, rank: usize) -> Result<()> {
        let mut state = self.lock();
        if state.joined[rank] {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} of the new group has already been claimed"
            )));
        }
        state.joined[rank] = true;
        Ok(())
    }

    /// Records that `rank` left: peers waiting now, or arriving later, get `PeerLost`.
    pub(crate) fn leave(&self, rank: usize) {
        let mut state = self.lock();
        state.joined[rank] = false;
        if state.fault.is_none() {
            state.fault = Some(Fault::PeerLost { rank });
        }
        self.announce();
    }

    /// The ranks currently blocked in the arrive phase (a diagnostic: who is *not* listed is late).
    pub(crate) fn waiting_ranks(&self) -> Vec<usize> {
        let state = self.lock();
        (0..self.world).filter(|&r| state.waiting[r]).collect()
    }

    /// The ranks whose communicators exist and have not been dropped.
    pub(crate) fn live_ranks(&self) -> Vec<usize> {
        let state = self.lock();
        (0..self.world).filter(|&r| state.joined[r]).collect()
    }

    /// The group formed by `survivors` (old ranks, sorted), created on first request.
    pub(crate) fn successor(&self, survivors: &[usize]) -> Arc<Group> {
        let mut state = self.lock();
        state.successors.retain(|(_, weak)| weak.strong_count() > 0);
        if let Some(group) = state
            .successors
            .iter()
            .find(|(list, _)| list == survivors)
            .and_then(|(_, weak)| weak.upgrade())
        {
            return group;
        }
        let group = Group::new(survivors.len());
        state.successors.push((survivors.to_vec(), Arc::downgrade(&group)));
        group
    }

    /// The arrive phase: publishes `rank`'s post and waits until every rank has published;
    /// returns the operation's plan.
    ///
    /// # Errors
    /// The group's fault if it is (or becomes) aborted or a peer left; `TimedOut` once the deadline
    /// passes (`timeout` after the call), which also aborts the group so the peers do not wait for
    /// this rank forever.
    pub(crate) fn arrive(
        &self,
        rank: usize,
        op: Op,
        weight: f32,
        bufs: &[RawBuf],
        timeout: Duration,
    ) -> Result<Arc<Plan>> {
        let started = Instant::now();
        let deadline = started + timeout;
        let mut state = self.lock();
        if let Some(fault) = state.fault {
            return Err(fault.error());
        }
        let post = &mut state.posts[rank];
        post.op = Some(op);
        post.weight = weight;
        post.bufs.clear();
        post.bufs.extend_from_slice(bufs);
        state.arrived += 1;
        let generation = state.arrivals;
        if state.arrived == self.world {
            let plan = Arc::new(Plan::new(&state.posts));
            state.plan = Some(Arc::clone(&plan));
            state.arrived = 0;
            state.arrivals += 1;
            state.waiting.iter_mut().for_each(|w| *w = false);
            self.announce();
            return Ok(plan);
        }
        state.waiting[rank] = true;
        let seen = self.progress.load(Ordering::Acquire);
        drop(state);
        self.spin_while(seen);
        state = self.lock();
        loop {
            if state.arrivals != generation {
                // The next plan needs this rank's next arrival, so this is still our plan.
                if let Some(plan) = &state.plan {
                    return Ok(Arc::clone(plan));
                }
            }
            if let Some(fault) = state.fault {
                state.waiting[rank] = false;
                return Err(fault.error());
            }
            let now = Instant::now();
            if now >= deadline {
                state.fault.get_or_insert(Fault::Aborted);
                state.waiting[rank] = false;
                self.announce();
                drop(state);
                tracing::warn!(rank, op = op.name(), "collective timed out");
                return Err(Error::TimedOut { op: op.name(), after: now - started });
            }
            state = self.wait(state, (deadline - now).min(WAIT_SLICE));
        }
    }

    /// Wakes the ranks waiting in [`complete`](Self::complete); called by the rank that did
    /// the plan's last chunk.
    pub(crate) fn finished(&self) {
        let _state = self.lock();
        self.announce();
    }

    /// The completion wait: returns once every chunk of `plan` is done. Not abortable (see the
    /// module documentation).
    pub(crate) fn complete(&self, plan: &Plan) {
        if plan.is_done() {
            return;
        }
        let seen = self.progress.load(Ordering::Acquire);
        self.spin_while(seen);
        let mut state = self.lock();
        while !plan.is_done() {
            state = self.wait(state, WAIT_SLICE);
        }
    }
}

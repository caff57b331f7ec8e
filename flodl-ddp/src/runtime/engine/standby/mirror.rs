//! The standby's mirror: the controller's state as the lane's frames rebuild it, checked
//! frame by frame (term, order, size), so a forged or stale frame changes nothing.

use crate::runtime::engine::standby::controller_state::{ControllerState, CutConsensus};
use crate::runtime::engine::standby::lane::{MirrorBody, MirrorFrame, config, fold};
use crate::runtime::engine::standby::term::{StaleTerm, Term, TermGate};
use crate::state::HostState;

/// Why the mirror refused a frame (the mirror is unchanged).
#[derive(Debug, thiserror::Error)]
pub(crate) enum MirrorError {
    /// The bytes are not a frame.
    #[error("a mirror frame does not decode: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    /// The frame decoded with bytes left over.
    #[error("a mirror frame has {0} bytes past its change")]
    Trailing(usize),
    /// A frame of an older controller.
    #[error(transparent)]
    Stale(#[from] StaleTerm),
    /// A frame not after the last one of its term (a replay or a reordering).
    #[error("mirror frame {seq} of term {term} after frame {last}")]
    OutOfOrder { term: Term, seq: u64, last: u64 },
    /// A change before the whole state of its term: nothing to fold it into.
    #[error("mirror frame {seq} of term {term} is a change, and the whole state has not come")]
    NoBase { term: Term, seq: u64 },
    /// The frame names another number of seats than the run has.
    #[error("a mirror frame names {got} seats, the run has {world}")]
    Seats { got: usize, world: usize },
    /// The frame's cut names a consensus by digest that is not the state the standby's rank
    /// holds (an update overtook the frame, or none came): the mirror keeps its last cut.
    #[error("mirror frame {seq}'s cut names a consensus this process's rank does not hold")]
    Unresolved { seq: u64 },
}

/// The standby's copy of the controller's state.
#[derive(Debug)]
pub(crate) struct Mirror {
    world: usize,
    gate: TermGate,
    /// The last frame folded in, of the gate's term.
    last: Option<u64>,
    /// Every cut in it carries its consensus ([`CutConsensus::Sent`] is resolved on accept).
    state: Option<ControllerState>,
    /// The state the standby's rank was last sent (its update, or its starting state), which
    /// a cut may name by digest.
    held: Option<HostState>,
}

impl Mirror {
    /// An empty mirror of a run of `world` seats, obeying controllers of `term` and later.
    pub(crate) fn new(world: usize, term: Term) -> Mirror {
        Mirror { world, gate: TermGate::new(term), last: None, state: None, held: None }
    }

    /// Keeps `state`, the state the standby's rank was just sent, for a cut that names it.
    pub(crate) fn hold(&mut self, state: HostState) {
        self.held = Some(state);
    }

    /// The state mirrored so far (`None` before the first whole state).
    pub(crate) fn state(&self) -> Option<&ControllerState> {
        self.state.as_ref()
    }

    /// Decodes and folds in one frame. A cut naming its consensus by digest takes the state
    /// held for the standby's rank ([`Mirror::hold`]), or the consensus the mirror's own cut
    /// already carries, when the digest is theirs.
    ///
    /// A whole state whose cut names a consensus that is nowhere here is taken without that
    /// cut: the mirror keeps its own cut of the same term, if any, until the next one.
    ///
    /// # Errors
    /// [`MirrorError`] for bytes that are not a frame, a frame of an older term, a frame not
    /// after the last of its term, a change before any whole state, a wrong number of seats,
    /// or a change whose cut's consensus is nowhere here; the mirror is then unchanged.
    pub(crate) fn accept(&mut self, bytes: &[u8]) -> Result<(), MirrorError> {
        let (frame, read): (MirrorFrame, usize) =
            bincode::serde::decode_from_slice(bytes, config())?;
        if read != bytes.len() {
            return Err(MirrorError::Trailing(bytes.len() - read));
        }
        let MirrorFrame { term, seq, mut body } = frame;
        let mut gate = self.gate;
        gate.admit(term)?;
        let newer = term > self.gate.current();
        let last = if newer { None } else { self.last };
        if last.is_some_and(|last| seq <= last) {
            return Err(MirrorError::OutOfOrder { term, seq, last: last.unwrap_or(0) });
        }
        let seats = match &body {
            MirrorBody::Seats(seats) => Some(seats.len()),
            MirrorBody::Whole(whole) => Some(whole.seats.len()),
            MirrorBody::Cut(_) => None,
        };
        if let Some(got) = seats.filter(|&n| n != self.world) {
            return Err(MirrorError::Seats { got, world: self.world });
        }
        let whole = matches!(body, MirrorBody::Whole(_));
        if !whole && (self.state.is_none() || newer) {
            return Err(MirrorError::NoBase { term, seq });
        }
        // A whole state whose cut is nowhere here is still the controller's seats and term: it
        // is taken without that cut (keeping the mirror's own of this term), so the next cut
        // completes it rather than every later change being refused for want of a base.
        let unresolved = match self.resolve(&mut body, seq) {
            Err(MirrorError::Unresolved { .. }) if whole => true,
            outcome => outcome.map(|()| false)?,
        };
        let mut state = match (body, self.state.take()) {
            (MirrorBody::Whole(mut whole), own) if unresolved => {
                tracing::warn!(
                    seq,
                    "mirror frame {seq} is the whole state, whose cut names a consensus this \
                     process's rank does not hold: taken without that cut"
                );
                whole.cut = own.filter(|_| !newer).and_then(|own| own.cut);
                whole
            }
            (MirrorBody::Whole(whole), _) => whole,
            (body, Some(mut state)) => {
                fold(&mut state, body);
                state
            }
            (_, None) => return Err(MirrorError::NoBase { term, seq }),
        };
        state.term = term;
        self.state = Some(state);
        self.gate = gate;
        self.last = Some(seq);
        Ok(())
    }

    /// Makes `body`'s cut, if it names its consensus by digest, carry it: the held state or
    /// the mirror's own cut's consensus, whichever has the digest (moved, never copied).
    fn resolve(&mut self, body: &mut MirrorBody, seq: u64) -> Result<(), MirrorError> {
        let cut = match body {
            MirrorBody::Cut(cut) => Some(cut.as_mut()),
            MirrorBody::Whole(whole) => whole.cut.as_deref_mut(),
            MirrorBody::Seats(_) => None,
        };
        let Some(cut) = cut else { return Ok(()) };
        let CutConsensus::Sent { digest } = cut.consensus else { return Ok(()) };
        if self.held.as_ref().is_some_and(|held| held.digest() == digest)
            && let Some(held) = self.held.take()
        {
            cut.consensus = CutConsensus::Carried(held);
            return Ok(());
        }
        // The same cut again (a whole state after a catch-up): the consensus already kept.
        let own = self.state.as_mut().and_then(|s| s.cut.as_deref_mut());
        if let Some(own) =
            own.filter(|own| own.consensus.carried().is_some_and(|c| c.digest() == digest))
        {
            cut.consensus = std::mem::replace(&mut own.consensus, CutConsensus::Sent { digest });
            return Ok(());
        }
        Err(MirrorError::Unresolved { seq })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    use super::*;
    use crate::control::dispatch::{Chunk, Cutting, Dispatcher};
    use crate::control::elche::ElChe;
    use crate::control::guard::Guard;
    use crate::control::metrics::WorkTally;
    use crate::control::policy::Policy;
    use crate::link::wire::Window;
    use crate::runtime::engine::books::Books;
    use crate::runtime::engine::fault::DeadFlags;
    use crate::runtime::engine::roster::Roster;
    use crate::runtime::engine::slot::Slots;
    use crate::runtime::engine::standby::controller_state::{Cut, CutParts};
    use crate::runtime::engine::standby::lane::StandbyLane;
    use crate::state::{HostState, HostTensor};

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    const BATCH: usize = 4;
    const BATCHES: usize = 48;
    const EPOCHS: usize = 3;
    const SEED: u64 = 7;

    /// A controller's books, moved at random: the roster, the dispatcher, ElChe, the chunks
    /// each rank holds, the reduces completed.
    struct Controller {
        roster: Roster,
        slots: Slots,
        dispatch: Dispatcher,
        elche: ElChe,
        reported: Vec<Option<Instant>>,
        held: Vec<Vec<Chunk>>,
        reduces: u64,
        global_step: u64,
    }

    impl Controller {
        fn new(world: usize, policy: Policy) -> crate::Result<Controller> {
            let window = Window { round: 1, target: 1, limit: 1, wall: None };
            let cutting = Cutting::for_policy(policy, 1);
            Ok(Controller {
                roster: Roster::new(world, DeadFlags::new(world)),
                slots: Slots::new(vec![window; world]),
                dispatch: Dispatcher::new(world, BATCH, BATCHES, EPOCHS, cutting),
                elche: ElChe::new(world, 4)?,
                reported: vec![None; world],
                held: vec![Vec::new(); world],
                reduces: 0,
                global_step: 0,
            })
        }

        /// Hands a change to every book, as the coordinator does, then publishes the seats.
        fn apply(&mut self, change: &Change, lane: &mut StandbyLane) -> crate::Result<()> {
            let books = Books {
                slots: &mut self.slots,
                dispatch: &mut self.dispatch,
                elche: Some(&mut self.elche),
                host_round: None,
                reported: &mut self.reported,
            };
            books.apply(change)?;
            if let Change::Died { rank, .. } = change {
                self.held[*rank].clear();
            }
            lane.publish(MirrorBody::Seats(self.roster.standings()));
            Ok(())
        }

        /// A reduce completes: the books' cut, with a consensus and outer state of random
        /// values (bit patterns the encoding must keep).
        fn reduce(&mut self, rng: &mut Xoshiro256PlusPlus) -> crate::Result<Cut> {
            Ok(self.reduce_sent(rng, false)?.0)
        }

        /// A reduce whose cut names its consensus by digest when `sent` (as over an f32
        /// wire, the standby's rank being sent it), with the consensus.
        fn reduce_sent(
            &mut self,
            rng: &mut Xoshiro256PlusPlus,
            sent: bool,
        ) -> crate::Result<(Cut, HostState)> {
            self.reduces += 1;
            self.global_step += rng.random_range(1..20u64);
            let tensor = |rng: &mut Xoshiro256PlusPlus| HostTensor {
                shape: vec![3],
                data: (0..3).map(|_| f32::from_bits(rng.random::<u32>() & 0x7f7f_ffff)).collect(),
            };
            let consensus = HostState {
                params: vec![(0..5).map(|_| rng.random::<f32>()).collect()],
                buffers: vec![],
            };
            let parts = CutParts {
                reduces: self.reduces,
                global_step: self.global_step,
                seed: SEED,
                guard: &Guard::Off,
                outer: Some((vec![tensor(rng)], vec![tensor(rng)])),
                consensus: Some(&consensus),
                sent: sent.then(|| consensus.digest()),
                epochs: Vec::new(),
                shapes: &[vec![5]],
            };
            Ok((Cut::of(&self.dispatch, Some(&self.elche), parts)?, consensus))
        }
    }

    use crate::control::change::Change;

    /// What the test does to the lane besides publishing.
    #[derive(Debug, Clone, Copy)]
    enum Hostile {
        Garbage,
        Replay,
        OldTerm,
    }

    /// Random runs of a controller (deaths, joins, work handed out and completed, reduces)
    /// publishing every change into a lane whose standby drains it at random moments (so the
    /// lane fills and the controller falls back to the whole state) and between drains is fed
    /// garbage, replayed frames and frames of an older term, which it refuses unchanged. After
    /// every drain the mirror equals the controller's state, and every cut it holds reseeds a
    /// fresh dispatcher and ElChe to the same book (what a standby taking over would do).
    #[test]
    fn the_mirror_equals_the_controller_after_random_runs() -> TestResult {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(31);
        let (mut drained, mut refused, mut caught_up) = (0usize, 0usize, 0usize);
        for case in 0..120 {
            let world = rng.random_range(1..6);
            let policy = if case % 2 == 0 { Policy::Sync } else { Policy::Cadence };
            let mut ctl = Controller::new(world, policy)?;
            for rank in 0..world {
                ctl.roster.started(rank);
            }
            let term = Term(rng.random_range(1..4u64));
            // A slow standby reads its lane seldom, and a short one: the lane fills, and the
            // controller falls back to the whole state.
            let slow = rng.random_bool(0.5);
            let (tx, rx) = if slow { flume::bounded(4) } else { StandbyLane::channel() };
            let start = ControllerState::new(term, ctl.roster.standings());
            let mut lane = StandbyLane::new(start, tx);
            let mut mirror = Mirror::new(world, Term(0));
            let mut frames: Vec<Vec<u8>> = Vec::new();
            lane.publish(MirrorBody::Seats(ctl.roster.standings()));
            for i in 0..301 {
                let last = i == 300;
                let rank = rng.random_range(0..world);
                let step = if last { 9 } else { rng.random_range(0..10) };
                match step {
                    0 => {
                        if let Some(change) = ctl.roster.die(rank, 0) {
                            ctl.apply(&change, &mut lane)?;
                        }
                    }
                    1 => {
                        ctl.roster.claim(rank);
                        ctl.roster.built(rank);
                        if let Some(change) = ctl.roster.admit(rank) {
                            ctl.apply(&change, &mut lane)?;
                        }
                    }
                    2..=4 => {
                        let counts = ctl.elche.counts().to_vec();
                        let now = Instant::now();
                        if let Some(chunk) = ctl.dispatch.next_chunk(rank, &counts, false, now) {
                            ctl.held[rank].push(chunk);
                        }
                    }
                    5..=6 => {
                        if let Some(chunk) = ctl.held[rank].pop() {
                            let work =
                                WorkTally { batches: chunk.len / BATCH, ..WorkTally::default() };
                            ctl.dispatch.complete(rank, &chunk, &work, Instant::now());
                        }
                    }
                    7 => {
                        let cut = ctl.reduce(&mut rng)?;
                        lane.publish(MirrorBody::Cut(Box::new(cut)));
                    }
                    _ if slow && !last && rng.random_bool(0.95) => {}
                    _ => {
                        // The standby reads what is queued, after hostile frames at times.
                        let hostile = match rng.random_range(0..4) {
                            0 => Some(Hostile::Garbage),
                            1 => Some(Hostile::Replay),
                            2 => Some(Hostile::OldTerm),
                            _ => None,
                        };
                        let before = mirror.state().cloned();
                        let forged = match hostile {
                            Some(Hostile::Garbage) => {
                                Some((0..rng.random_range(0..64)).map(|_| rng.random()).collect())
                            }
                            Some(Hostile::Replay) => frames.last().cloned(),
                            Some(Hostile::OldTerm) if term.0 > 0 => {
                                let frame = MirrorFrame {
                                    term: Term(term.0 - 1),
                                    seq: u64::MAX,
                                    body: MirrorBody::Seats(vec![Standing::Dead; world]),
                                };
                                Some(bincode::serde::encode_to_vec(&frame, config())?)
                            }
                            _ => None,
                        };
                        if let Some(bytes) = forged {
                            if mirror.accept(&bytes).is_ok() || mirror.state() != before.as_ref() {
                                return Err(
                                    format!("case {case}, move {i}: {hostile:?} heard").into()
                                );
                            }
                            refused += 1;
                        }
                        // The standby drains, the controller's tick flushes, the standby drains.
                        for flush in [false, true] {
                            if flush {
                                lane.flush();
                            }
                            for bytes in rx.try_iter() {
                                if matches!(decode(&bytes)?.body, MirrorBody::Whole(_)) {
                                    caught_up += 1;
                                }
                                mirror
                                    .accept(&bytes)
                                    .map_err(|e| format!("case {case}, move {i}: {e}"))?;
                                frames.push(bytes);
                                drained += 1;
                            }
                        }
                        check(&mirror, &lane, world, policy)
                            .map_err(|e| format!("case {case}, move {i}: {e}"))?;
                    }
                }
            }
        }
        // The runs reach each path many times: frames heard, hostile frames, catch-ups.
        // (Each case's first frame is a whole state: catch-ups are the ones beyond them.)
        if drained < 1000 || refused < 200 || caught_up < 120 + 60 {
            return Err(
                format!("drained {drained}, refused {refused}, caught up {caught_up}").into()
            );
        }
        Ok(())
    }

    /// The standby's process replaced (killed, restarted, admitted again) before the next
    /// reduce: the lane's resync reaches the new process's empty mirror, which takes it whatever
    /// the last cut was (one carrying its consensus comes with it; one naming the old process's
    /// copy by digest is left out, the new process never held it), and equals the controller's
    /// state; the next cut, carried or naming the update the new process was sent, completes it.
    #[test]
    fn a_replaced_standby_is_whole_again_by_the_next_cut() -> TestResult {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
        // Whether the last cut before the replacement names its consensus, and the next one.
        for (before, after) in [(false, false), (false, true), (true, false), (true, true)] {
            let case = format!("named before: {before}, after: {after}");
            let world = 3;
            let mut ctl = Controller::new(world, Policy::Cadence)?;
            for rank in 0..world {
                ctl.roster.started(rank);
            }
            let (tx, rx) = StandbyLane::channel();
            let start = ControllerState::new(Term(1), ctl.roster.standings());
            let mut lane = StandbyLane::new(start, tx);
            lane.flush();
            let (cut, _) = ctl.reduce_sent(&mut rng, before)?;
            lane.publish(MirrorBody::Cut(Box::new(cut)));
            // Frames for the old process, which died: the new one never reads them.
            rx.drain().for_each(drop);
            let mut fresh = Mirror::new(world, Term(1));
            lane.resync();
            for bytes in rx.try_iter() {
                fresh.accept(&bytes).map_err(|e| format!("{case}: the resync refused: {e}"))?;
            }
            let kept = fresh.state().and_then(|s| s.cut.as_ref()).map(|c| c.reduces);
            if fresh.state() != Some(lane.state()) || kept != (!before).then_some(1) {
                return Err(format!(
                    "{case}: after the resync the mirror holds cut {kept:?}, \
                    the controller {:?}",
                    lane.state().cut.as_ref().map(|c| c.reduces)
                )
                .into());
            }
            let (cut, consensus) = ctl.reduce_sent(&mut rng, after)?;
            fresh.hold(consensus.clone());
            lane.publish(MirrorBody::Cut(Box::new(cut)));
            for bytes in rx.try_iter() {
                fresh.accept(&bytes).map_err(|e| format!("{case}: the next cut refused: {e}"))?;
            }
            let state = fresh.state().ok_or("no state")?;
            let cut = state.cut.as_ref().ok_or(format!("{case}: no cut after the next one"))?;
            if cut.reduces != 2
                || cut.consensus.carried() != Some(&consensus)
                || state.seats != lane.state().seats
            {
                return Err(format!("{case}: the mirror holds reduce {}", cut.reduces).into());
            }
        }
        Ok(())
    }

    use crate::runtime::engine::roster::Standing;
    use crate::runtime::engine::standby::lane::config;

    fn decode(bytes: &[u8]) -> std::result::Result<MirrorFrame, bincode::error::DecodeError> {
        Ok(bincode::serde::decode_from_slice(bytes, config())?.0)
    }

    /// What reaches the standby's process in the resolution test: a state its rank is sent,
    /// or one of the lane's frames.
    #[derive(Debug, Clone, Copy)]
    enum Arrives {
        /// The consensus of reduce `k` (1-based) as the rank's update.
        Update(usize),
        /// Another state than any consensus (an update of a later reduce, in effect).
        Stranger,
        /// The frame of reduce `k`'s cut.
        Cut(usize),
        /// The lane's whole state (the controller's as of its last reduce).
        Whole,
    }

    /// A cut naming its consensus by digest is taken with the state the standby's rank holds
    /// when the digests agree, and refused (the mirror keeping its last cut, with its
    /// consensus) when the rank holds another state or none; a whole state naming the
    /// consensus the mirror already carries is taken with it, and one naming a consensus held
    /// nowhere here is taken without its cut.
    #[test]
    fn a_cut_takes_its_consensus_from_the_rank_only_by_digest() -> TestResult {
        use Arrives::{Cut as C, Stranger, Update as U, Whole};
        // Each case: what arrives in order, and after each arrival the reduce whose cut the
        // mirror holds (0: none), or `None` when that arrival must be refused.
        type Steps = Vec<(Arrives, Option<usize>)>;
        let cases: Vec<(&str, Steps)> = vec![
            ("in order", vec![(U(1), Some(0)), (C(1), Some(1)), (U(2), Some(1)), (C(2), Some(2))]),
            ("nothing held", vec![(C(1), None), (U(1), Some(0)), (C(1), Some(1))]),
            (
                "an update overtook the cut",
                vec![
                    (U(1), Some(0)),
                    (C(1), Some(1)),
                    (U(3), Some(1)),
                    (C(2), None),
                    (C(3), Some(3)),
                ],
            ),
            ("another state held", vec![(U(1), Some(0)), (Stranger, Some(0)), (C(1), None)]),
            (
                "a whole state again",
                vec![(U(2), Some(0)), (C(2), Some(2)), (Whole, Some(2)), (Whole, Some(2))],
            ),
            // A whole state naming a consensus held nowhere here (a new process's first, in
            // effect): taken without that cut, the mirror's own kept, the next cut taken.
            (
                "a whole state naming what was never held",
                vec![(Whole, Some(0)), (U(3), Some(0)), (C(3), Some(3))],
            ),
            (
                "a whole state naming what is no longer held",
                vec![
                    (U(1), Some(0)),
                    (C(1), Some(1)),
                    (Whole, Some(1)),
                    (U(3), Some(1)),
                    (C(3), Some(3)),
                ],
            ),
        ];
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
        for (name, steps) in cases {
            let world = 2;
            let mut ctl = Controller::new(world, Policy::Cadence)?;
            let start = ControllerState::new(Term(1), ctl.roster.standings());
            let (tx, rx) = StandbyLane::channel();
            let mut lane = StandbyLane::new(start.clone(), tx);
            let mut mirror = Mirror::new(world, Term(1));
            lane.flush();
            for bytes in rx.try_iter() {
                mirror.accept(&bytes)?;
            }
            // Three reduces, their frames kept to be delivered as the case says.
            let mut cuts = Vec::new();
            for _ in 0..3 {
                let (cut, consensus) = ctl.reduce_sent(&mut rng, true)?;
                lane.publish(MirrorBody::Cut(Box::new(cut.clone())));
                let frame = rx.try_recv()?;
                cuts.push((cut, consensus, frame));
            }
            let whole = bincode::serde::encode_to_vec(
                &MirrorFrame {
                    term: Term(1),
                    seq: 100,
                    body: MirrorBody::Whole(lane.state().clone()),
                },
                config(),
            )?;
            for (i, (arrives, holds)) in steps.into_iter().enumerate() {
                let outcome = match arrives {
                    U(k) => {
                        mirror.hold(cuts[k - 1].1.clone());
                        Ok(())
                    }
                    Stranger => {
                        mirror.hold(HostState { params: vec![vec![0.5; 5]], buffers: vec![] });
                        Ok(())
                    }
                    C(k) => mirror.accept(&cuts[k - 1].2),
                    Whole => {
                        // The whole state of the third reduce's controller, numbered next
                        // after the last frame taken (as a resync's is).
                        let mut frame: MirrorFrame = decode(&whole)?;
                        frame.seq = mirror.last.unwrap_or(0) + 1;
                        if let MirrorBody::Whole(w) = &mut frame.body
                            && let Some(cut) = w.cut.as_deref_mut()
                        {
                            // As of the second reduce, whose consensus the mirror carries.
                            *cut = cuts[1].0.clone();
                        }
                        mirror.accept(&bincode::serde::encode_to_vec(&frame, config())?)
                    }
                };
                let at = format!("{name}, step {i} ({arrives:?})");
                match (holds, outcome) {
                    (None, Err(MirrorError::Unresolved { .. })) => continue,
                    (None, other) => return Err(format!("{at}: {other:?}, not refused").into()),
                    (Some(_), Err(e)) => return Err(format!("{at}: refused: {e}").into()),
                    (Some(_), Ok(())) => {}
                }
                let held = mirror.state().and_then(|s| s.cut.as_deref());
                let want = holds.unwrap_or(0);
                match (held, want) {
                    (None, 0) => {}
                    (Some(cut), k) if k > 0 => {
                        let (reference, consensus, _) = &cuts[k - 1];
                        if cut.reduces != reference.reduces
                            || cut.consensus.carried() != Some(consensus)
                        {
                            return Err(format!(
                                "{at}: the mirror holds reduce {} with {:?}, not reduce {k}",
                                cut.reduces,
                                cut.consensus.carried().map(|c| &c.params)
                            )
                            .into());
                        }
                    }
                    (cut, k) => {
                        return Err(format!(
                            "{at}: the mirror holds {:?}, not reduce {k}",
                            cut.map(|c| c.reduces)
                        )
                        .into());
                    }
                }
            }
        }
        Ok(())
    }

    /// The mirror against the controller: equal states; the cut reseeds a fresh book to the
    /// same coverage and ElChe to the same estimates.
    fn check(
        mirror: &Mirror,
        lane: &StandbyLane,
        world: usize,
        policy: Policy,
    ) -> std::result::Result<(), String> {
        let Some(state) = mirror.state() else { return Err("no state mirrored".into()) };
        if state != lane.state() {
            return Err(format!("mirror {state:?}\ncontroller {:?}", lane.state()));
        }
        let Some(cut) = &state.cut else { return Ok(()) };
        let fresh = Dispatcher::new(world, BATCH, BATCHES, EPOCHS, Cutting::for_policy(policy, 1));
        let resumed = fresh.resume(cut.epoch, &cut.coverage).map_err(|e| e.to_string())?;
        let coverage = resumed.coverage(&[], SEED).map_err(|e| e.to_string())?;
        if coverage != cut.coverage {
            return Err(format!("reseeded coverage {coverage:?}, cut {:?}", cut.coverage));
        }
        if let Some(saved) = &cut.elche {
            let mut elche = ElChe::new(world, 4).map_err(|e| e.to_string())?;
            elche.restore(saved).map_err(|e| e.to_string())?;
            if &elche.state() != saved {
                return Err(format!("reseeded ElChe {:?}, cut {saved:?}", elche.state()));
            }
        }
        Ok(())
    }
}

//! The wire under fuzzing: every layer a network peer's bytes pass through before the training
//! protocol sees them takes arbitrary bytes without a panic and without allocating more than a
//! frame's cap, and answers bad bytes with a typed error (the connection is then closed).
//!
//! Two layers, each fed mutations of valid encodings (bit flips, byte writes, insertions,
//! deletions, truncations, splices, hostile length prefixes) and plain random bytes:
//! - the cluster wire (flodl-cluster): the 4-byte length-delimited framing at a cap, then
//!   [`Message::decode`] of every message kind; data frames go on to the link's decoder;
//! - the link's frames (this crate): bincode decode of every wire message of both directions,
//!   in both wire formats.
//!
//! A counting global allocator watches each case: its largest single allocation must stay
//! within the frame cap. Each test runs [`DEFAULT_CASES`] cases from a fixed seed (a few
//! seconds in release); `FLODL_FUZZ_CASES=N` runs N, `FLODL_FUZZ_SEED=S` another sequence.
//! A failing case prints its seed, index and bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Instant;

use bytes::BytesMut;
use flodl_cluster::Lane;
use flodl_cluster::wire::{
    DATA_HEADER, HANDSHAKE_MAX, Hello, LaneHello, Message, WireError, codec, data_header,
};
use flodl_ddp::fuzz_targets::{self, Direction};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use tokio_util::codec::Decoder;

type TestResult = Result<(), String>;

/// Cases per test unless `FLODL_FUZZ_CASES` says otherwise.
const DEFAULT_CASES: u64 = 1_000_000;
/// The seed unless `FLODL_FUZZ_SEED` says otherwise.
const DEFAULT_SEED: u64 = 0x5eed_f12e;
/// The smallest frame cap a lane has in a cluster run (the control lane's): every frame the
/// link decodes arrived within it.
const CONTROL_CAP: usize = 1 << 20;

// ---------------------------------------------------------------------------------------------
// The counting allocator.

/// The system allocator, noting the largest single allocation a thread asks for while it
/// watches.
struct Counting;

thread_local! {
    /// The largest request seen while watching; `None` when this thread is not watching.
    static LARGEST: Cell<Option<usize>> = const { Cell::new(None) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|largest| {
        if let Some(seen) = largest.get() {
            largest.set(Some(seen.max(size)));
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; noting a size touches only
// a const-initialised thread-local cell, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller's contract for `realloc` is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f`, returning what it returned and the largest single allocation it made.
fn watched<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.with(|l| l.set(Some(0)));
    let out = f();
    let largest = LARGEST.with(|l| l.replace(None)).unwrap_or(0);
    (out, largest)
}

// ---------------------------------------------------------------------------------------------
// Inputs.

/// The run's size and seed, from the environment or the defaults.
fn plan() -> Result<(u64, u64), String> {
    let var = |name: &str, default: u64| match std::env::var(name) {
        Ok(v) => v.parse::<u64>().map_err(|e| format!("{name}={v}: {e}")),
        Err(_) => Ok(default),
    };
    Ok((var("FLODL_FUZZ_CASES", DEFAULT_CASES)?, var("FLODL_FUZZ_SEED", DEFAULT_SEED)?))
}

/// One change to a byte string.
#[derive(Debug, Clone, Copy)]
enum Mutation {
    FlipBit,
    SetByte,
    Insert,
    Delete,
    Truncate,
    Extend,
    /// A copy of a stretch of the input written elsewhere in it.
    Splice,
    /// A length prefix announcing far more than follows: bincode's varint markers (0xfb u16,
    /// 0xfc u32, 0xfd u64) or a 4-byte big-endian frame length.
    HostileLength,
}

const MUTATIONS: [Mutation; 8] = [
    Mutation::FlipBit,
    Mutation::SetByte,
    Mutation::Insert,
    Mutation::Delete,
    Mutation::Truncate,
    Mutation::Extend,
    Mutation::Splice,
    Mutation::HostileLength,
];

fn apply(rng: &mut Xoshiro256PlusPlus, bytes: &mut Vec<u8>, mutation: Mutation) {
    let at = |rng: &mut Xoshiro256PlusPlus, len: usize| rng.random_range(0..=len);
    match mutation {
        Mutation::FlipBit if !bytes.is_empty() => {
            let i = rng.random_range(0..bytes.len());
            bytes[i] ^= 1 << rng.random_range(0..8);
        }
        Mutation::SetByte if !bytes.is_empty() => {
            let i = rng.random_range(0..bytes.len());
            bytes[i] = [0, 0xff, 0x7f, 0x80, rng.random()][rng.random_range(0..5)];
        }
        Mutation::Insert => {
            let i = at(rng, bytes.len());
            bytes.insert(i, rng.random());
        }
        Mutation::Delete if !bytes.is_empty() => {
            let i = rng.random_range(0..bytes.len());
            bytes.remove(i);
        }
        Mutation::Truncate => {
            let keep = at(rng, bytes.len());
            bytes.truncate(keep);
        }
        Mutation::Extend => {
            let n = rng.random_range(1..64);
            bytes.extend((0..n).map(|_| rng.random::<u8>()));
        }
        Mutation::Splice if !bytes.is_empty() => {
            let from = rng.random_range(0..bytes.len());
            let len = rng.random_range(1..=(bytes.len() - from).min(32));
            let piece = bytes[from..from + len].to_vec();
            let to = at(rng, bytes.len());
            bytes.splice(to..to, piece);
        }
        Mutation::HostileLength => {
            let value: u64 = match rng.random_range(0..4) {
                0 => u64::MAX,
                1 => 1 << rng.random_range(20..63),
                2 => u32::MAX as u64,
                _ => rng.random(),
            };
            let prefix: Vec<u8> = match rng.random_range(0..4) {
                0 => [vec![0xfb], (value as u16).to_le_bytes().to_vec()].concat(),
                1 => [vec![0xfc], (value as u32).to_le_bytes().to_vec()].concat(),
                2 => [vec![0xfd], value.to_le_bytes().to_vec()].concat(),
                _ => (value as u32).to_be_bytes().to_vec(),
            };
            let i = at(rng, bytes.len());
            let end = (i + prefix.len()).min(bytes.len());
            bytes.splice(i..end, prefix);
        }
        // A mutation that needs bytes, on none: leave it.
        _ => {}
    }
}

/// A case: a mutated seed (1 to 4 mutations), or now and then plain random bytes.
fn case(rng: &mut Xoshiro256PlusPlus, seeds: &[Vec<u8>]) -> (usize, Vec<u8>) {
    if rng.random_range(0..16) == 0 || seeds.is_empty() {
        let n = rng.random_range(0..512);
        return (usize::MAX, (0..n).map(|_| rng.random::<u8>()).collect());
    }
    let i = rng.random_range(0..seeds.len());
    let mut bytes = seeds[i].clone();
    for _ in 0..rng.random_range(1..=4) {
        let m = MUTATIONS[rng.random_range(0..MUTATIONS.len())];
        apply(rng, &mut bytes, m);
    }
    (i, bytes)
}

/// A failing case, reproducibly.
fn report(what: &str, seed: u64, index: u64, bytes: &[u8], detail: &str) -> String {
    let hex: String = bytes.iter().take(256).map(|b| format!("{b:02x}")).collect();
    format!(
        "{what}: case {index} of seed {seed} ({} bytes: {hex}{}): {detail}",
        bytes.len(),
        if bytes.len() > 256 { "…" } else { "" }
    )
}

/// Runs `check` on `cases` cases made from `seeds`, catching panics; prints the rate and the
/// tally `check` keeps.
fn fuzz<T: std::fmt::Debug>(
    what: &str,
    seeds: &[Vec<u8>],
    tally: &mut T,
    mut check: impl FnMut(&mut Xoshiro256PlusPlus, usize, &[u8], &mut T) -> Result<(), String>,
) -> TestResult {
    let (cases, seed) = plan()?;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let start = Instant::now();
    for index in 0..cases {
        let (from, bytes) = case(&mut rng, seeds);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check(&mut rng, from, &bytes, tally)
        }));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(report(what, seed, index, &bytes, &e)),
            Err(_) => return Err(report(what, seed, index, &bytes, "panicked")),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{what}: {cases} cases (seed {seed}) in {secs:.1} s, {:.0}/s; {tally:?}",
        cases as f64 / secs.max(1e-9)
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The cluster wire.

/// Byte streams as a lane carries them: each message kind framed, alone and in runs.
fn lane_seeds() -> Result<Vec<Vec<u8>>, String> {
    let hello = |lane, rank| {
        Message::Hello(LaneHello {
            hello: Hello::new([3; 32], rank, 4),
            app: flodl_ddp::WIRE_VERSION,
            lane,
            token: 99,
        })
    };
    let framed = |m: &Message| {
        let body = m.encode();
        let mut out = (body.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(&body);
        out
    };
    let data = |seq: u64, frame: &[u8]| -> Result<Vec<u8>, String> {
        let mut out = data_header(seq, frame.len()).ok_or("no data header")?.to_vec();
        out.extend_from_slice(frame);
        Ok(out)
    };
    let link_frames: Vec<Vec<u8>> = fuzz_targets::seeds().into_iter().map(|(_, b)| b).collect();
    let mut seeds = vec![
        framed(&hello(Lane::Control, 1)),
        framed(&hello(Lane::Bulk, 3)),
        framed(&Message::Welcome),
        framed(&Message::Heartbeat),
        framed(&Message::Refused("rank 2 is already connected".into())),
        [framed(&hello(Lane::Control, 0)), framed(&Message::Heartbeat)].concat(),
    ];
    for (i, frame) in link_frames.iter().enumerate() {
        seeds.push(data(i as u64, frame)?);
    }
    seeds.push([framed(&Message::Welcome), data(7, &link_frames[0])?, data(8, &[])?].concat());
    Ok(seeds)
}

/// What the cluster wire made of the cases.
#[derive(Debug, Default)]
struct LaneTally {
    frames: u64,
    messages: u64,
    wire_errors: u64,
    framing_errors: u64,
    link_messages: u64,
    link_errors: u64,
    largest_allocation: usize,
}

/// Any bytes on a lane: the framing at a cap yields frames within the cap or an error (a
/// length above the cap is refused before anything is reserved for it); each frame is a
/// message or a [`WireError`]; a data frame goes on to the link's decoder. No panic, and no
/// allocation beyond the cap plus what the bytes themselves fill.
#[test]
fn any_bytes_on_a_lane_are_frames_within_the_cap_or_errors() -> TestResult {
    let seeds = lane_seeds()?;
    let mut tally = LaneTally::default();
    fuzz("lane", &seeds, &mut tally, |rng, _, bytes, tally| {
        let cap = [HANDSHAKE_MAX, 4096 + DATA_HEADER, 64 * 1024][rng.random_range(0..3)];
        let direction = if rng.random() { Direction::ToRank } else { Direction::ToCoordinator };
        let mut buf = BytesMut::from(bytes);
        let mut data = Vec::new();
        let (outcome, largest) = watched(|| -> Result<(), String> {
            let mut framing = codec(cap);
            loop {
                match framing.decode(&mut buf) {
                    Ok(Some(frame)) => {
                        tally.frames += 1;
                        if frame.len() > cap {
                            return Err(format!("a {} byte frame past the cap {cap}", frame.len()));
                        }
                        match Message::decode(frame) {
                            Ok(Message::Data { frame, .. }) => {
                                tally.messages += 1;
                                data.push(frame);
                            }
                            Ok(_) => tally.messages += 1,
                            Err(WireError::Empty | WireError::UnknownKind(_))
                            | Err(WireError::Length { .. } | WireError::Lane(_))
                            | Err(WireError::Range | WireError::Utf8 | WireError::Protocol(_)) => {
                                tally.wire_errors += 1
                            }
                        }
                    }
                    Ok(None) => return Ok(()),
                    Err(_) => {
                        tally.framing_errors += 1;
                        return Ok(());
                    }
                }
            }
        });
        outcome?;
        tally.largest_allocation = tally.largest_allocation.max(largest);
        // The framing reserves at most the frame it announced (within the cap) on top of the
        // bytes already buffered; its buffer may double once.
        let bound = cap + 2 * bytes.len() + 64;
        if largest > bound {
            return Err(format!("allocated {largest} bytes at a cap of {cap}"));
        }
        // What the link does with the data frames (its own bounds: the next test).
        for frame in data {
            match fuzz_targets::decode(direction, &frame) {
                Ok(()) => tally.link_messages += 1,
                Err(_) => tally.link_errors += 1,
            }
        }
        Ok(())
    })?;
    if tally.framing_errors == 0 || tally.wire_errors == 0 || tally.messages == 0 {
        return Err(format!("the cases missed an outcome: {tally:?}"));
    }
    Ok(())
}

/// Hostile frame lengths are refused at the prefix: nothing near the announced size is
/// allocated, and the error is the framing's.
#[test]
fn hostile_frame_lengths_are_refused_before_allocating() -> TestResult {
    for announced in [HANDSHAKE_MAX as u32 + 1, 1 << 24, u32::MAX] {
        let mut buf = BytesMut::from(&announced.to_be_bytes()[..]);
        buf.extend_from_slice(&[1, 2, 3]);
        let (outcome, largest) = watched(|| codec(HANDSHAKE_MAX).decode(&mut buf));
        match outcome {
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {}
            other => return Err(format!("length {announced}: {other:?}")),
        }
        if largest > HANDSHAKE_MAX {
            return Err(format!("length {announced}: allocated {largest} bytes"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The link's frames.

/// What the link's decoder made of the cases.
#[derive(Debug, Default)]
struct LinkTally {
    messages: u64,
    errors: u64,
    largest_allocation: usize,
}

/// Any bytes as a link frame, either way: a message or the decoder's error; no panic, and no
/// single allocation beyond the smallest lane cap whatever length a prefix inside announces
/// (sequences grow as elements arrive; strings too, see `link/text.rs`).
#[test]
fn any_bytes_as_a_link_frame_are_a_message_or_an_error() -> TestResult {
    let seeds = fuzz_targets::seeds();
    let frames: Vec<Vec<u8>> = seeds.iter().map(|(_, b)| b.clone()).collect();
    for (direction, bytes) in &seeds {
        fuzz_targets::decode(*direction, bytes).map_err(|e| format!("a seed: {e}"))?;
    }
    let mut tally = LinkTally::default();
    fuzz("link frame", &frames, &mut tally, |rng, from, bytes, tally| {
        // Mostly the seed's own direction, sometimes the other.
        let own = seeds.get(from).map_or(Direction::ToRank, |(d, _)| *d);
        let direction = match (rng.random_range(0..4), own) {
            (0, Direction::ToRank) => Direction::ToCoordinator,
            (0, Direction::ToCoordinator) => Direction::ToRank,
            _ => own,
        };
        let (outcome, largest) = watched(|| fuzz_targets::decode(direction, bytes));
        match outcome {
            Ok(()) => tally.messages += 1,
            Err(_) => tally.errors += 1,
        }
        tally.largest_allocation = tally.largest_allocation.max(largest);
        if largest > CONTROL_CAP {
            return Err(format!("decoding allocated {largest} bytes at once"));
        }
        Ok(())
    })?;
    if tally.messages == 0 || tally.errors == 0 {
        return Err(format!("the cases missed an outcome: {tally:?}"));
    }
    Ok(())
}

/// Every text of every wire message is bounded by its type: a frame whose prefix for one of
/// them announces 2^60 bytes decodes to an error, and nothing near that size is allocated.
/// The samples carry five texts (two failure messages, a collective's error, two scalar
/// names); all must be found.
#[test]
fn every_wire_text_refuses_a_hostile_length() -> TestResult {
    let frames = fuzz_targets::hostile_texts();
    let texts: std::collections::BTreeSet<&str> =
        frames.iter().map(|(_, text, _)| text.as_str()).collect();
    for expected in ["boom", "needs", "lost", "grad_norm", "ünïcode loss"] {
        if !texts.contains(expected) {
            return Err(format!("the text {expected:?} was not found in any frame: {texts:?}"));
        }
    }
    for (direction, text, frame) in &frames {
        let (outcome, largest) = watched(|| fuzz_targets::decode(*direction, frame));
        if outcome.is_ok() {
            return Err(format!("{text:?} announcing 2^60 bytes decoded ({direction:?})"));
        }
        if largest > CONTROL_CAP {
            return Err(format!("{text:?} announcing 2^60 bytes allocated {largest} bytes"));
        }
    }
    Ok(())
}

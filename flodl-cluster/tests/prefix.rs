//! A hostile length prefix costs the reader little memory: a peer that announces a frame of the
//! lane's whole cap and then sends a trickle makes the session hold about what has arrived, not
//! the cap. Its own binary, because the counting allocator is process-wide.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use flodl_cluster::wire::{DATA_HEADER, FIRST_ROOM};
use flodl_cluster::{Caps, Liveness, Session};
use tokio::io::AsyncWriteExt;

/// The system allocator, recording the largest single request while armed.
struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn record(size: usize) {
    if ARMED.load(Ordering::Relaxed) {
        LARGEST.fetch_max(size, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds `GlobalAlloc`'s contract;
// the bookkeeping only reads sizes and touches atomics (it never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: the caller's obligations for `alloc` are passed on as they are.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        // SAFETY: `ptr` and `layout` come from this allocator (so from `System`), as the caller
        // guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn a_prefix_announcing_the_cap_reserves_only_what_arrives() -> TestResult {
    const CAP: usize = 256 << 20;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let caps = Caps { control: 1 << 20, bulk: CAP };
    let liveness = Liveness { heartbeat: Duration::from_secs(1), silence: Duration::from_secs(60) };
    // Small pipes: a write completes only once the session's reader has taken all but 4 KiB.
    let (control, mut peer_control) = tokio::io::duplex(4096);
    let (bulk, mut peer_bulk) = tokio::io::duplex(4096);
    let session = {
        let _inside = rt.enter();
        Session::over(0, control, bulk, caps, liveness)?
    };
    // Armed throughout: the reader takes more bytes only after it has decoded (and made room
    // for) the ones before, so a reservation made late in one step is seen by the next one.
    ARMED.store(true, Ordering::Relaxed);
    let mut arrived = 0;
    for sent in [0usize, 64 << 10, 1 << 20] {
        rt.block_on(async {
            // The announced body: the whole cap plus the data header (the largest allowed).
            let body = u32::try_from(CAP + DATA_HEADER)?;
            let mut head = body.to_be_bytes().to_vec();
            head.push(4); // a data message
            head.extend_from_slice(&0u64.to_be_bytes());
            if sent == 0 {
                peer_bulk.write_all(&head).await?;
                // Past the pipe's buffer: the reader has taken the head.
                peer_bulk.write_all(&[0u8; 8192]).await?;
            } else {
                peer_bulk.write_all(&vec![0u8; sent]).await?;
            }
            peer_bulk.flush().await?;
            Ok::<(), Box<dyn std::error::Error>>(())
        })?;
        arrived += if sent == 0 { 13 + 8192 } else { sent };
        let largest = LARGEST.load(Ordering::Relaxed);
        eprintln!("after {arrived} bytes the largest allocation so far was {largest} bytes");
        // Room for what arrived and as much again (or the first room), the buffer's own doubling
        // on top: a few times what arrived, never the announced cap.
        let bound = 4 * (arrived + FIRST_ROOM.max(arrived));
        if largest > bound {
            return Err(format!(
                "a prefix announcing {CAP} bytes made the reader allocate {largest} bytes after {arrived} (bound {bound})"
            )
            .into());
        }
    }
    ARMED.store(false, Ordering::Relaxed);
    // The session is still waiting for the frame; nothing has been delivered.
    if session.try_recv()?.is_some() {
        return Err("a frame was delivered before its bytes arrived".into());
    }
    rt.block_on(async {
        peer_control.shutdown().await?;
        peer_bulk.shutdown().await
    })?;
    drop(session);
    Ok(())
}

//! The plan of one host operation: every rank's published buffers, validated, cut into chunks
//! that whichever ranks are running take from a shared counter.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::Error;
use crate::reduction::{broadcast_range, reduce_range};

/// `f32` elements in a 64-byte cache line; chunk boundaries fall on multiples of it.
const LINE: usize = 16;
/// The smallest chunk worth a trip to the shared counter (128 KiB of `f32`).
const MIN_CHUNK: usize = 32 * 1024;
/// Chunks per rank: enough for a running rank to take over a descheduled rank's work, and small
/// enough that when all ranks run, the last chunk leaves little imbalance (at most 1/8 of a share).
const CHUNKS_PER_RANK: usize = 8;

/// The operation a rank announces when it arrives; all ranks must announce the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Weighted (or plain, with weight 1) all-reduce.
    AllReduce,
    /// Broadcast from a root rank.
    Broadcast {
        /// The rank whose buffers are copied to all others.
        root: usize,
    },
    /// Synchronisation only, no buffers.
    Barrier,
}

impl Op {
    /// The operation's name, as error messages show it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::Broadcast { .. } => "broadcast",
            Op::Barrier => "barrier",
        }
    }
}

/// A raw view of one rank's buffer, published to its peers for the length of one operation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawBuf {
    pub(crate) ptr: *mut f32,
    pub(crate) len: usize,
}

// SAFETY: a `RawBuf` is only dereferenced by `Plan::work`, between the moment every rank has
// arrived and the moment the last chunk is done; during that window its owner is blocked inside
// the operation (it lent the buffer as `&mut [f32]` and waits in `Group::complete` until every
// chunk is done), and chunks are disjoint element ranges, each touched by one thread. Moving or
// sharing the address itself between threads is harmless.
unsafe impl Send for RawBuf {}
// SAFETY: as above; shared access only copies the address.
unsafe impl Sync for RawBuf {}

/// What one rank published for the current operation.
#[derive(Debug, Default, Clone)]
pub(crate) struct Post {
    pub(crate) op: Option<Op>,
    pub(crate) weight: f32,
    pub(crate) bufs: Vec<RawBuf>,
}

/// Why the ranks' posts disagree.
#[derive(Debug)]
struct Mismatch {
    what: &'static str,
    rank: usize,
    expected: String,
    found: String,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Plan {
    op: Option<Op>,
    posts: Vec<Post>,
    mismatch: Option<Mismatch>,
    total: usize,
    chunk: usize,
    chunks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
}

impl Plan {
    /// Validates every rank's post against rank 0's and cuts the joint index space into chunks
    /// (none if the posts disagree or there is nothing to move).
    pub(crate) fn new(posts: &[Post]) -> Plan {
        let mismatch = validate(posts);
        let op = posts[0].op;
        let world = posts.len();
        let total: usize = posts[0].bufs.iter().map(|b| b.len).sum();
        let moves = mismatch.is_none() && !matches!(op, Some(Op::Barrier) | None);
        let chunk = total.div_ceil(CHUNKS_PER_RANK * world).max(MIN_CHUNK).next_multiple_of(LINE);
        let chunks = if moves { total.div_ceil(chunk) } else { 0 };
        Plan {
            op,
            posts: posts.to_vec(),
            mismatch,
            total,
            chunk,
            chunks,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
        }
    }

    /// The error every rank returns for this operation, if the posts disagree.
    pub(crate) fn error(&self) -> Option<Error> {
        self.mismatch.as_ref().map(|m| Error::Mismatch {
            what: m.what,
            rank: m.rank,
            expected: m.expected.clone(),
            found: m.found.clone(),
        })
    }

    /// Whether every chunk has been done (no thread touches the buffers any more).
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire) == self.chunks
    }

    /// Takes and does chunks until none are left; returns whether this call did the last one.
    ///
    /// # Safety
    /// Every rank has arrived at this plan's operation, and every rank is blocked in the
    /// operation until [`is_done`](Self::is_done), so every published buffer is live and touched
    /// only through the plan.
    pub(crate) unsafe fn work(&self, scratch: &mut Vec<*mut f32>) -> bool {
        let mut finished_last = false;
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= self.chunks {
                return finished_last;
            }
            let range = (c * self.chunk, ((c + 1) * self.chunk).min(self.total));
            match self.op {
                // SAFETY: the caller's contract makes every buffer live; the posts were
                // validated (equal counts and lengths); the counter hands chunk `c` to this
                // thread alone, and chunks are disjoint.
                Some(Op::AllReduce) => unsafe { reduce_range(&self.posts, range, scratch) },
                // SAFETY: as above; distinct ranks lent distinct `&mut` buffers.
                Some(Op::Broadcast { root }) => unsafe {
                    broadcast_range(&self.posts, root, range)
                },
                Some(Op::Barrier) | None => {}
            }
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.chunks {
                finished_last = true;
            }
        }
    }
}

/// The first way a rank's post differs from rank 0's, if any.
fn validate(posts: &[Post]) -> Option<Mismatch> {
    let first = &posts[0];
    for (rank, post) in posts.iter().enumerate().skip(1) {
        let mismatch =
            |what, expected: String, found: String| Some(Mismatch { what, rank, expected, found });
        if post.op != first.op {
            return mismatch("operation", format!("{:?}", first.op), format!("{:?}", post.op));
        }
        if post.bufs.len() != first.bufs.len() {
            return mismatch(
                "buffer count",
                first.bufs.len().to_string(),
                post.bufs.len().to_string(),
            );
        }
        for (b, (x, y)) in first.bufs.iter().zip(&post.bufs).enumerate() {
            if x.len != y.len {
                return mismatch(
                    "buffer length",
                    format!("{} (buffer {b})", x.len),
                    format!("{} (buffer {b})", y.len),
                );
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn posts(world: usize, lens: &[usize]) -> Vec<Post> {
        (0..world)
            .map(|_| Post {
                op: Some(Op::AllReduce),
                weight: 1.0,
                bufs: lens.iter().map(|&len| RawBuf { ptr: std::ptr::null_mut(), len }).collect(),
            })
            .collect()
    }

    #[test]
    fn chunks_tile_the_index_space_on_cache_lines() {
        for lens in [&[0usize][..], &[1], &[15, 17], &[1 << 20], &[10 << 20, 3, 4097]] {
            for world in 1..=9 {
                let plan = Plan::new(&posts(world, lens));
                let total: usize = lens.iter().sum();
                assert_eq!(plan.total, total);
                assert_eq!(plan.chunk % LINE, 0);
                assert!(plan.chunk >= MIN_CHUNK);
                assert!(plan.chunks * plan.chunk >= total);
                assert!(plan.chunks == 0 || (plan.chunks - 1) * plan.chunk < total);
                assert!(plan.chunks <= CHUNKS_PER_RANK * world);
            }
        }
    }

    #[test]
    fn disagreeing_posts_make_no_chunks() {
        let mut ps = posts(3, &[100, 200]);
        ps[2].bufs[1].len = 199;
        let plan = Plan::new(&ps);
        assert_eq!(plan.chunks, 0);
        assert!(plan.is_done());
        assert!(matches!(
            plan.error(),
            Some(Error::Mismatch { what: "buffer length", rank: 2, .. })
        ));
        let mut ps = posts(2, &[10]);
        ps[1].op = Some(Op::Barrier);
        assert!(matches!(Plan::new(&ps).error(), Some(Error::Mismatch { what: "operation", .. })));
    }
}

//! The host reduction kernels: each rank's share of the buffers and the weighted sum over ranks.
//!
//! The buffers of one operation form a single index space (buffer 0, then buffer 1, ...). Rank
//! `k` of `W` owns the contiguous range `[k·N/W, (k+1)·N/W)`, rounded down to a cache line, so
//! the shares never split a line between two writers (when the buffers are line-aligned) and
//! each rank streams through memory sequentially.

use crate::rendezvous::{Post, RawBuf};

/// `f32` elements in a 64-byte cache line.
const LINE: usize = 16;
/// Elements reduced per block: the block's accumulator and its slices of every rank's input
/// stay in L1 while the result is written back to every rank.
const BLOCK: usize = 1024;

/// The element range `[start, end)` of the joint index space that `rank` of `world` owns.
pub(crate) fn share(total: usize, rank: usize, world: usize) -> (usize, usize) {
    let bound = |k: usize| {
        if k >= world {
            total
        } else {
            // u128: `total * k` cannot overflow.
            let exact = (total as u128 * k as u128 / world as u128) as usize;
            exact - exact % LINE
        }
    };
    (bound(rank), bound(rank + 1))
}

/// Calls `f(buffer, offset, len)` for every piece of `[start, end)` of the joint index space of
/// buffers with lengths `lens`.
fn for_each_piece(
    lens: impl Iterator<Item = usize>,
    (start, end): (usize, usize),
    mut f: impl FnMut(usize, usize, usize),
) {
    let mut base = 0;
    for (b, len) in lens.enumerate() {
        let (lo, hi) = (start.max(base), end.min(base + len));
        if lo < hi {
            f(b, lo - base, hi - lo);
        }
        base += len;
        if base >= end {
            break;
        }
    }
}

/// Writes `Σ_r weight_r · x_r` (summed in rank order, in `f32`) into every rank's buffers, for
/// the elements of `rank`'s share.
///
/// # Safety
/// `posts` must describe one operation that every rank has arrived at and none has released:
/// every `RawBuf` points to `len` valid, initialised `f32`s whose owner does not access them
/// until the release phase, all ranks have the same number of buffers with equal lengths, and
/// the calling rank is the only thread touching the elements of its share.
pub(crate) unsafe fn reduce_share(posts: &[Post], rank: usize, scratch: &mut Vec<*mut f32>) {
    let world = posts.len();
    let total: usize = posts[0].bufs.iter().map(|b| b.len).sum();
    let weights: Vec<f32> = posts.iter().map(|p| p.weight).collect();
    let lens = posts[0].bufs.iter().map(|b| b.len);
    for_each_piece(lens, share(total, rank, world), |b, offset, len| {
        scratch.clear();
        // SAFETY: `offset + len <= bufs[b].len` by construction of the pieces, so the pointer
        // stays inside the buffer (the contract guarantees equal lengths on every rank).
        scratch.extend(posts.iter().map(|p| unsafe { p.bufs[b].ptr.add(offset) }));
        // SAFETY: forwarded from this function's contract; the piece lies in this rank's share.
        unsafe { reduce_piece(scratch, &weights, len) };
    });
}

/// # Safety
/// Every pointer in `ptrs` is valid for reads and writes of `len` `f32`s that no other thread
/// touches during the call; the ranges do not overlap (one pointer per rank).
unsafe fn reduce_piece(ptrs: &[*mut f32], weights: &[f32], len: usize) {
    if let ([p0, p1], [w0, w1]) = (ptrs, weights) {
        // Two ranks: one fused pass, no accumulator (measured faster than the blocked path).
        // SAFETY: two distinct ranks' buffers never overlap (they were lent as separate
        // `&mut` borrows), each is valid for `len` elements, and only this thread touches them.
        let (x0, x1) = unsafe {
            (std::slice::from_raw_parts_mut(*p0, len), std::slice::from_raw_parts_mut(*p1, len))
        };
        for (a, b) in x0.iter_mut().zip(x1.iter_mut()) {
            let sum = w0 * *a + w1 * *b;
            *a = sum;
            *b = sum;
        }
        return;
    }
    let mut acc = [0.0f32; BLOCK];
    let mut done = 0;
    while done < len {
        let n = BLOCK.min(len - done);
        let acc = &mut acc[..n];
        // SAFETY: `done + n <= len`, so each slice lies inside the valid range; the slices are
        // only read here and the writes below go through the raw pointers after the reads.
        let input = |r: usize| unsafe { std::slice::from_raw_parts(ptrs[r].add(done), n) };
        let w0 = weights[0];
        for (a, &x) in acc.iter_mut().zip(input(0)) {
            *a = w0 * x;
        }
        for (r, &w) in weights.iter().enumerate().skip(1) {
            for (a, &x) in acc.iter_mut().zip(input(r)) {
                *a += w * x;
            }
        }
        for &ptr in ptrs {
            // SAFETY: `acc` is a local array, so it cannot overlap the destination, which is
            // valid for `n` writes (see above).
            unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), ptr.add(done), n) };
        }
        done += n;
    }
}

/// Copies `root`'s buffers into every other rank's buffers, for the elements of `rank`'s share.
///
/// # Safety
/// As for [`reduce_share`]; additionally distinct ranks' buffers do not overlap.
pub(crate) unsafe fn broadcast_share(posts: &[Post], root: usize, rank: usize) {
    let world = posts.len();
    let total: usize = posts[0].bufs.iter().map(|b| b.len).sum();
    let lens = posts[0].bufs.iter().map(|b| b.len);
    for_each_piece(lens, share(total, rank, world), |b, offset, len| {
        let src: RawBuf = posts[root].bufs[b];
        for (r, post) in posts.iter().enumerate() {
            if r != root {
                // SAFETY: both ranges lie inside their buffers (equal lengths, piece in range),
                // belong to different ranks so they do not overlap, and only this rank touches
                // this share of them during the operation.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.ptr.add(offset),
                        post.bufs[b].ptr.add(offset),
                        len,
                    )
                };
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_tile_the_index_space() {
        for total in [0usize, 1, 15, 16, 17, 1000, 4097, 1 << 20] {
            for world in 1..=9 {
                let mut next = 0;
                for rank in 0..world {
                    let (start, end) = share(total, rank, world);
                    assert_eq!(start, next, "total {total} world {world} rank {rank}");
                    assert!(end >= start);
                    assert!(start % LINE == 0 || start == total);
                    next = end;
                }
                assert_eq!(next, total);
            }
        }
    }

    #[test]
    fn pieces_cover_a_range_across_buffers() {
        let lens = [5usize, 0, 7, 3];
        for start in 0..15 {
            for end in start..=15 {
                let mut covered = Vec::new();
                for_each_piece(lens.iter().copied(), (start, end), |b, off, len| {
                    let base: usize = lens[..b].iter().sum();
                    covered.extend(base + off..base + off + len);
                });
                assert_eq!(covered, (start..end).collect::<Vec<_>>());
            }
        }
    }
}

//! A model's state on the host: what crosses between ranks, the coordinator and bundles.

use serde::{Deserialize, Serialize};

/// A tensor on the host: shape and row-major f32 values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostTensor {
    /// The shape.
    pub shape: Vec<usize>,
    /// The values, `shape.iter().product()` of them.
    pub data: Vec<f32>,
}

/// A replica's parameters then buffers, each flattened, in the replica's order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct HostState {
    /// Parameter values, in the replica's order.
    pub(crate) params: Vec<Vec<f32>>,
    /// Buffer values, in the replica's order.
    pub(crate) buffers: Vec<Vec<f32>>,
}

/// Values scanned per block by [`first_where`].
const SCAN_BLOCK: usize = 4096;

/// The index of the first of `values` that is `bad`: each block of [`SCAN_BLOCK`] values is
/// scanned without an early exit (a branch-free pass that vectorises, several times faster
/// than stopping at each value), and only a block that holds one is searched value by value.
pub(crate) fn first_where(values: &[f32], bad: impl Fn(f32) -> bool + Copy) -> Option<usize> {
    values.chunks(SCAN_BLOCK).enumerate().find_map(|(b, block)| {
        if !block.iter().fold(false, |any, &x| any | bad(x)) {
            return None;
        }
        block.iter().position(|&x| bad(x)).map(|i| b * SCAN_BLOCK + i)
    })
}

/// Values per block of a state's digest (1 MiB of f32): the blocks are hashed in parallel.
const DIGEST_BLOCK: usize = 1 << 18;

impl HostState {
    /// A SHA-256 digest of the values and their layout: each vector's blocks of
    /// [`DIGEST_BLOCK`] values hashed on rayon's pool, then the counts, each vector's length
    /// and its blocks' digests in order. Two states have the same digest exactly when they hold
    /// the same bits in the same vectors (up to SHA-256's collisions).
    pub(crate) fn digest(&self) -> [u8; 32] {
        use rayon::prelude::*;
        use sha2::{Digest, Sha256};
        // A block's little-endian bytes: on a little-endian target, its memory as it is.
        let block = |values: &[f32]| -> [u8; 32] {
            if cfg!(target_endian = "little") {
                Sha256::digest(bytemuck::cast_slice::<f32, u8>(values)).into()
            } else {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                Sha256::digest(&bytes).into()
            }
        };
        let mut top = Sha256::new();
        top.update(b"flodl host state v1");
        for vectors in [&self.params, &self.buffers] {
            top.update((vectors.len() as u64).to_le_bytes());
            for values in vectors {
                top.update((values.len() as u64).to_le_bytes());
                let blocks: Vec<[u8; 32]> = values.par_chunks(DIGEST_BLOCK).map(block).collect();
                for b in &blocks {
                    top.update(b);
                }
            }
        }
        top.finalize().into()
    }
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;
    use sha2::{Digest, Sha256};

    use super::*;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    /// The digest's definition, one value at a time on one thread.
    fn reference(state: &HostState) -> [u8; 32] {
        let mut top = Sha256::new();
        top.update(b"flodl host state v1");
        for vectors in [&state.params, &state.buffers] {
            top.update((vectors.len() as u64).to_le_bytes());
            for values in vectors {
                top.update((values.len() as u64).to_le_bytes());
                for block in values.chunks(DIGEST_BLOCK) {
                    let mut h = Sha256::new();
                    for v in block {
                        h.update(v.to_bits().to_le_bytes());
                    }
                    top.update(h.finalize());
                }
            }
        }
        top.finalize().into()
    }

    /// Random values with a few NaN and infinities at random places (at block edges among
    /// them): the first found is the first by a plain search, for both checks.
    #[test]
    fn first_where_is_the_first_by_a_plain_search() -> TestResult {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(9);
        let checks: [fn(f32) -> bool; 2] = [|x| !x.is_finite(), f32::is_nan];
        for case in 0..200 {
            let len = rng.random_range(0..3 * SCAN_BLOCK + 3);
            let mut values: Vec<f32> = (0..len).map(|_| rng.random_range(-1e30..1e30)).collect();
            for _ in 0..rng.random_range(0..4) {
                if len == 0 {
                    break;
                }
                let at = match rng.random_range(0..3) {
                    0 => (SCAN_BLOCK * rng.random_range(0..3) + rng.random_range(0..2)) % len,
                    1 => len - 1,
                    _ => rng.random_range(0..len),
                };
                values[at] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][rng.random_range(0..3)];
            }
            for bad in checks {
                let expected = values.iter().position(|&x| bad(x));
                if first_where(&values, bad) != expected {
                    return Err(format!("case {case}: not the first by a plain search").into());
                }
            }
        }
        Ok(())
    }

    fn random_state(rng: &mut Xoshiro256PlusPlus) -> HostState {
        let (p, b) = (rng.random_range(0..4), rng.random_range(0..3));
        let mut vectors = |n: usize| -> Vec<Vec<f32>> {
            (0..n)
                .map(|_| {
                    // Lengths around the block size, so vectors of one, several and a partial
                    // last block all come up.
                    let len = match rng.random_range(0..3) {
                        0 => rng.random_range(0..64),
                        1 => rng.random_range(DIGEST_BLOCK - 2..DIGEST_BLOCK + 2),
                        _ => rng.random_range(0..3 * DIGEST_BLOCK),
                    };
                    (0..len).map(|_| f32::from_bits(rng.random())).collect()
                })
                .collect()
        };
        HostState { params: vectors(p), buffers: vectors(b) }
    }

    /// Random states (NaN payloads and all) against the one-value-at-a-time definition; any
    /// one bit flipped, and the same values split differently between vectors or between
    /// parameters and buffers, change the digest.
    #[test]
    fn the_digest_is_its_definition_and_tells_states_apart() -> TestResult {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
        for case in 0..24 {
            let state = random_state(&mut rng);
            let digest = state.digest();
            if digest != reference(&state) {
                return Err(
                    format!("case {case}: the parallel digest is not the definition").into()
                );
            }
            let mut flipped = state.clone();
            let lens: Vec<usize> = flipped.params.iter().map(Vec::len).collect();
            if let Some(v) = lens.iter().position(|&n| n > 0) {
                let i = rng.random_range(0..lens[v]);
                let bit = 1u32 << rng.random_range(0..32);
                let x = &mut flipped.params[v][i];
                *x = f32::from_bits(x.to_bits() ^ bit);
                if flipped.digest() == digest {
                    return Err(format!("case {case}: a flipped bit kept the digest").into());
                }
            }
            let mut moved = state.clone();
            moved.params.push(Vec::new());
            if moved.digest() == digest {
                return Err(format!("case {case}: an empty vector more kept the digest").into());
            }
            let mut swapped = state.clone();
            std::mem::swap(&mut swapped.params, &mut swapped.buffers);
            if swapped.params != swapped.buffers && swapped.digest() == digest {
                return Err(
                    format!("case {case}: buffers taken for parameters kept the digest").into()
                );
            }
        }
        let split = HostState { params: vec![vec![1.0, 2.0], vec![3.0]], buffers: vec![] };
        let other = HostState { params: vec![vec![1.0], vec![2.0, 3.0]], buffers: vec![] };
        if split.digest() == other.digest() {
            return Err("the same values split otherwise kept the digest".into());
        }
        Ok(())
    }
}

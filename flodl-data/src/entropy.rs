//! The unigram entropy of a byte text: the loss floor of a model that ignores context.

/// An entropy (or a cross-entropy) per byte, in nats; [`Entropy::bits`] converts.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Entropy {
    /// Nats per byte.
    pub nats: f64,
}

impl Entropy {
    /// Bits per byte (`nats / ln 2`).
    pub fn bits(self) -> f64 {
        self.nats / std::f64::consts::LN_2
    }
}

impl std::fmt::Display for Entropy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.4} nats/byte ({:.4} bits/byte)", self.nats, self.bits())
    }
}

/// The entropy of the byte frequencies of `bytes`, `-Σ p ln p` over byte values (0 for an empty
/// text).
///
/// It bounds from below the cross-entropy on `bytes` of any model that predicts the same
/// distribution at every position (byte frequencies alone, whatever they were estimated from):
/// a language model whose loss on `bytes` goes below it has learnt to use context.
pub fn unigram_entropy(bytes: &[u8]) -> Entropy {
    let mut counts = [0u64; 256];
    for &b in bytes {
        counts[usize::from(b)] += 1;
    }
    // Counts up to 2^53 are exact in f64; a text is far shorter.
    let n = bytes.len() as f64;
    let nats = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.ln()
        })
        .sum();
    Entropy { nats }
}

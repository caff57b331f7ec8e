//! The Shakespeare corpus, its token windows and the unigram bound, on the vendored files and on
//! corrupted copies of them.

use std::path::Path;

use flodl_data::{
    ByteWindows, Dataset, Error, HostBatch, Result, Shakespeare, TextSplit, Verify, unigram_entropy,
};
use flodl_tensor::Device;
use rand::{RngExt, SeedableRng};
use sha2::{Digest, Sha256};

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_owned(), source }
}

#[test]
fn vendored_splits_load_with_checksums_and_known_contents() -> Result<()> {
    // Lengths and digests of the decompressed text, as data/shakespeare/README.md records them.
    let cases = [
        (
            TextSplit::Train,
            5_025_998,
            "47ea508dbd019cf6645362a7cce872c094b381b17cd2c2e2a06b108d0b1dda13",
            "# A Midsummer Night's Dream",
        ),
        (
            TextSplit::Valid,
            292_860,
            "b630e082303c3940ba7d50c3c749287753aca52a2c97d94704bf765b48af8a12",
            "# The Tempest",
        ),
    ];
    for (split, len, digest, head) in cases {
        let text = Shakespeare::vendored(split)?;
        assert_eq!(text.split(), split);
        assert_eq!(text.bytes().len(), len, "{split:?}");
        assert_eq!(sha256_hex(text.bytes()), digest, "{split:?}");
        assert!(text.bytes().starts_with(head.as_bytes()), "{split:?}");
    }
    Ok(())
}

#[test]
fn corrupt_or_unlisted_files_are_refused_with_their_name() -> Result<()> {
    let dir = tempfile::tempdir().map_err(io(Path::new("tempdir")))?;
    let from = Shakespeare::vendored_dir();
    for name in ["valid.txt.gz", "SHA256SUMS"] {
        std::fs::copy(from.join(name), dir.path().join(name)).map_err(io(&from))?;
    }
    let gz = dir.path().join("valid.txt.gz");
    let good = std::fs::read(&gz).map_err(io(&gz))?;

    // One flipped byte inside the stream: the checksum refuses it; unchecked, gzip's CRC does.
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x40;
    std::fs::write(&gz, &bad).map_err(io(&gz))?;
    let err = Shakespeare::load(dir.path(), TextSplit::Valid, Verify::Sha256).err();
    assert!(matches!(&err, Some(Error::Checksum { path, .. }) if path == &gz), "{err:?}");
    let err = Shakespeare::load(dir.path(), TextSplit::Valid, Verify::Skip).err();
    assert!(matches!(&err, Some(Error::Decompress { path, .. }) if path == &gz), "{err:?}");

    // A file the listing does not name.
    std::fs::write(&gz, &good).map_err(io(&gz))?;
    let sums = dir.path().join("SHA256SUMS");
    std::fs::write(&sums, "").map_err(io(&sums))?;
    let err = Shakespeare::load(dir.path(), TextSplit::Valid, Verify::Sha256).err();
    assert!(matches!(err, Some(Error::MissingChecksum { .. })), "{err:?}");

    // A missing split.
    let err = Shakespeare::load(dir.path(), TextSplit::Train, Verify::Skip).err();
    assert!(matches!(err, Some(Error::Io { .. })), "{err:?}");
    Ok(())
}

#[test]
fn windows_predict_every_byte_once_per_epoch() -> Result<()> {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
    for _ in 0..50 {
        let n = rng.random_range(2..400usize);
        let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        let context = rng.random_range(1..n);
        let w = ByteWindows::new(bytes.clone(), context)?;
        assert_eq!(w.len(), (n - 1) / context);
        assert_eq!(w.layout().fields()[ByteWindows::TOKENS].shape, vec![context + 1]);
        let all: Vec<usize> = (0..w.len()).rev().collect();
        let mut batch = HostBatch::new(w.layout(), Device::Cpu);
        w.fetch(&all, &mut batch)?;
        let tokens = batch.i32(ByteWindows::TOKENS)?;
        // The targets (tokens 1..=context) of all windows, in text order, are the text from byte
        // 1 on, each byte once.
        let mut targets = Vec::new();
        for row in tokens.chunks_exact(context + 1).rev() {
            assert_eq!(row[0], i32::from(bytes[targets.len()]));
            targets.extend(row[1..].iter().map(|&t| t as u8));
        }
        assert_eq!(targets, bytes[1..=w.len() * context]);
        assert!(matches!(w.fetch(&[w.len()], &mut batch), Err(Error::IndexOutOfRange { .. })));
    }
    assert!(matches!(ByteWindows::new(vec![1u8, 2], 0), Err(Error::InvalidLayout { .. })));
    assert!(matches!(
        ByteWindows::new(vec![1u8, 2], 2),
        Err(Error::TextTooShort { bytes: 2, window: 3 })
    ));
    Ok(())
}

/// `ln n - (1/n) Σ c ln c`, summed in sorted order with compensation: another formula, summed
/// more carefully than the library's.
fn reference_entropy(bytes: &[u8]) -> f64 {
    let mut counts = [0u64; 256];
    for &b in bytes {
        counts[usize::from(b)] += 1;
    }
    let mut terms: Vec<f64> =
        counts.iter().filter(|&&c| c > 0).map(|&c| c as f64 * (c as f64).ln()).collect();
    terms.sort_by(f64::total_cmp);
    let (mut sum, mut carry) = (0.0f64, 0.0f64);
    for t in terms {
        let y = t - carry;
        let s = sum + y;
        carry = (s - sum) - y;
        sum = s;
    }
    let n = bytes.len() as f64;
    n.ln() - sum / n
}

#[test]
fn unigram_entropy_matches_a_reference_and_known_cases() -> Result<()> {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(11);
    for _ in 0..50 {
        let n = rng.random_range(1..20_000usize);
        let alphabet = rng.random_range(1..=256u32);
        let bytes: Vec<u8> = (0..n).map(|_| (rng.random_range(0..alphabet)) as u8).collect();
        let got = unigram_entropy(&bytes).nats;
        let want = reference_entropy(&bytes);
        assert!((got - want).abs() < 1e-10, "n {n}: {got} vs {want}");
    }
    // Uniform over 2^k values: exactly k bits.
    for k in 0..=8u32 {
        let bytes: Vec<u8> = (0..(1usize << k) * 3).map(|i| (i % (1 << k)) as u8).collect();
        assert!((unigram_entropy(&bytes).bits() - f64::from(k)).abs() < 1e-12);
    }
    assert_eq!(unigram_entropy(&[]).nats, 0.0);
    // The vendored validation plays: the figure data/shakespeare/README.md states.
    let valid = unigram_entropy(Shakespeare::vendored(TextSplit::Valid)?.bytes());
    assert!((valid.nats - 3.3080).abs() < 5e-5, "{valid}");
    assert!((valid.bits() - 4.7725).abs() < 5e-5, "{valid}");
    Ok(())
}

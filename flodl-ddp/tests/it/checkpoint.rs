//! Checkpoint bundles: round trips, corruption, mismatches, atomic saves and coverage.

use std::collections::BTreeMap;
use std::error::Error;
use std::num::NonZeroU64;
use std::path::Path;
use std::time::Instant;

use flodl_ddp::checkpoint::{
    Checkpoint, CheckpointError, CheckpointStore, ConfigHash, EpochCoverage, Expectation,
    HEADER_LEN, MAGIC, MAX_META_BYTES, ModelSignature, OpaqueState, ReadLimits, RngStream,
    SampleRange, SaveInterval, SaveReason, SignatureEntry, StoredDType, TensorRecord, TensorSet,
    locate,
};
use flodl_ddp::{Chunk, Cutting, Dispatcher, WorkTally};
use flodl_tensor::{DType, Device, Stream, Tensor, bf16, gpu_skip_reason, skip_or_fail};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

type TestResult = std::result::Result<(), Box<dyn Error>>;

/// Which errors a case accepts.
type Accept = fn(&CheckpointError) -> bool;

const SEEDS: [u64; 6] = [1, 7, 42, 1234, 99_991, 0xdead_beef];

fn fail(msg: String) -> Box<dyn Error> {
    msg.into()
}

/// Checks that `result` is an error accepted by `accept`.
fn expect_err<T: std::fmt::Debug>(
    result: Result<T, CheckpointError>,
    accept: impl Fn(&CheckpointError) -> bool,
    context: &str,
) -> TestResult {
    match result {
        Err(e) if accept(&e) => Ok(()),
        Err(e) => Err(fail(format!("{context}: unexpected error {e:?}"))),
        Ok(v) => Err(fail(format!("{context}: expected an error, got {v:?}"))),
    }
}

fn random_shape(rng: &mut Xoshiro256PlusPlus) -> Vec<usize> {
    let rank = rng.random_range(0..4usize);
    (0..rank).map(|_| rng.random_range(0..6usize)).collect()
}

fn random_record(
    rng: &mut Xoshiro256PlusPlus,
    name: String,
) -> Result<TensorRecord, CheckpointError> {
    let shape = random_shape(rng);
    let numel: usize = shape.iter().product();
    match rng.random_range(0..3u8) {
        // Arbitrary bit patterns: NaN payloads, infinities and -0.0 must survive bitwise.
        0 => {
            let v: Vec<f32> = (0..numel).map(|_| f32::from_bits(rng.random::<u32>())).collect();
            TensorRecord::from_f32(name, shape, &v)
        }
        1 => {
            let v: Vec<u16> = (0..numel).map(|_| rng.random::<u16>()).collect();
            TensorRecord::from_bf16_bits(name, shape, &v)
        }
        _ => {
            let v: Vec<i32> = (0..numel).map(|_| rng.random::<i32>()).collect();
            TensorRecord::from_i32(name, shape, &v)
        }
    }
}

fn random_set(
    rng: &mut Xoshiro256PlusPlus,
    prefix: &str,
    max: usize,
) -> Result<TensorSet, CheckpointError> {
    let n = rng.random_range(0..=max);
    let records = (0..n)
        .map(|i| random_record(rng, format!("{prefix}.{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    TensorSet::from_records(records)
}

/// A stand-in for a cadence controller's state, with floats that must round-trip exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct CadenceLike {
    counts: Vec<u64>,
    ms_per_batch: Vec<f64>,
    anchor: Option<u32>,
    label: String,
}

fn random_ranges(rng: &mut Xoshiro256PlusPlus, total: usize, n: usize) -> Vec<SampleRange> {
    (0..n)
        .map(|_| {
            let offset = rng.random_range(0..=total);
            let size = rng.random_range(0..=(total - offset));
            SampleRange::new(offset, size)
        })
        .collect()
}

fn random_checkpoint(seed: u64) -> Result<Checkpoint, Box<dyn Error>> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let world = rng.random_range(1..5usize);
    let mut params = random_set(&mut rng, "param", 6)?;
    if params.is_empty() {
        params.push(random_record(&mut rng, "param.only".into())?)?;
    }
    let mut ckpt = Checkpoint::new(params, world, ConfigHash::of(&format!("config-{seed}")));
    ckpt.reason = match seed % 3 {
        0 => SaveReason::Periodic,
        1 => SaveReason::Fault { detail: format!("rank {} died", seed % 4) },
        _ => SaveReason::SingleSurvivor,
    };
    ckpt.global_step = rng.random();
    ckpt.epoch = rng.random_range(0..100);
    ckpt.reduce_version = rng.random();
    ckpt.buffers = random_set(&mut rng, "buffer", 3)?;
    ckpt.optimizer = (0..world)
        .map(|r| random_set(&mut rng, &format!("rank{r}.momentum"), 4))
        .collect::<Result<_, _>>()?;
    ckpt.outer = random_set(&mut rng, "outer", 3)?;
    let cadence = CadenceLike {
        counts: (0..world).map(|_| rng.random_range(1..100)).collect(),
        ms_per_batch: (0..world).map(|_| f64::from_bits(rng.random::<u64>() >> 2)).collect(),
        anchor: rng.random::<bool>().then(|| rng.random()),
        label: format!("seed {seed}"),
    };
    ckpt.elche = Some(OpaqueState::encode(&cadence)?);
    for e in 0..rng.random_range(0..3u64) {
        let total = rng.random_range(0..500usize);
        let n = rng.random_range(0..8usize);
        let done = random_ranges(&mut rng, total, n);
        ckpt.coverage.push(EpochCoverage::with_completed(
            ckpt.epoch + e,
            rng.random(),
            total,
            &done,
        )?);
    }
    ckpt.rng = (0..world)
        .map(|r| RngStream {
            name: format!("rank{r}"),
            words: (0..4).map(|_| rng.random()).collect(),
        })
        .collect();
    ckpt.extras.insert("lr".into(), OpaqueState::encode(&(rng.random::<f64>(), 3u8))?);
    Ok(ckpt)
}

/// `ranges` of `0..total` sorted, merged and non-adjacent, as an epoch's coverage keeps them.
fn normalise(ranges: &[SampleRange], total: usize) -> Result<Vec<SampleRange>, CheckpointError> {
    Ok(EpochCoverage::with_completed(0, 0, total, ranges)?.completed().to_vec())
}

/// The ranges of `0..total` that `completed` leaves to do, as an epoch's coverage reports them.
fn uncovered(completed: &[SampleRange], total: usize) -> Result<Vec<SampleRange>, CheckpointError> {
    Ok(EpochCoverage::with_completed(0, 0, total, completed)?.uncovered())
}

fn expectation_of(ckpt: &Checkpoint) -> Expectation {
    Expectation {
        signature: ckpt.signature(),
        world_size: ckpt.world_size,
        config_hash: ckpt.config_hash,
    }
}

/// A small bundle with every section non-empty, for byte-level corruption sweeps.
fn small_checkpoint() -> Result<Checkpoint, Box<dyn Error>> {
    let mut ckpt = Checkpoint::new(
        TensorSet::from_records(vec![
            TensorRecord::from_f32("w", vec![2, 3], &[0.5, -1.0, 2.0, 3.5, 0.0, -0.0])?,
            TensorRecord::from_f32("b", vec![3], &[1.0, 2.0, 3.0])?,
        ])?,
        2,
        ConfigHash::of("small"),
    );
    ckpt.global_step = 17;
    ckpt.buffers = TensorSet::from_records(vec![TensorRecord::from_i32("n", vec![1], &[9])?])?;
    ckpt.optimizer = vec![TensorSet::from_records(vec![TensorRecord::from_bf16_bits(
        "m",
        vec![2],
        &[0x3f80, 0xbf80],
    )?])?];
    ckpt.coverage.push(EpochCoverage::with_completed(0, 42, 100, &[SampleRange::new(0, 40)])?);
    ckpt.elche = Some(OpaqueState::encode(&vec![1u64, 2, 3])?);
    Ok(ckpt)
}

#[test]
fn round_trip_is_bitwise_in_memory_and_on_disk() -> TestResult {
    let dir = tempfile::tempdir()?;
    for seed in SEEDS {
        let ckpt = random_checkpoint(seed)?;
        let bytes = ckpt.to_bytes()?;
        let back = Checkpoint::from_bytes(&bytes)?;
        if back != ckpt {
            return Err(fail(format!("seed {seed}: in-memory round trip differs")));
        }
        // The encoding is deterministic.
        if back.to_bytes()? != bytes {
            return Err(fail(format!("seed {seed}: re-encoding differs")));
        }
        let path = dir.path().join(format!("rt-{seed}.fdlck"));
        ckpt.save(&path)?;
        let loaded = Checkpoint::load(&path, &expectation_of(&ckpt))?;
        if loaded != ckpt {
            return Err(fail(format!("seed {seed}: file round trip differs")));
        }
        if std::fs::read(&path)? != bytes {
            return Err(fail(format!("seed {seed}: file bytes differ from to_bytes")));
        }
        // Tensor values compared element by element, by bit pattern.
        for (a, b) in ckpt.params.records().iter().zip(loaded.params.records()) {
            let same = match a.dtype() {
                StoredDType::F32 => {
                    let bits = |r: &TensorRecord| {
                        r.to_f32_vec().map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                    };
                    bits(a) == bits(b)
                }
                StoredDType::Bf16 => a.to_bf16_bits() == b.to_bf16_bits(),
                StoredDType::I32 => a.to_i32_vec() == b.to_i32_vec(),
            };
            if !same || a.numel() * a.dtype().size_in_bytes() != a.data().len() {
                return Err(fail(format!("seed {seed}: tensor {} differs", a.name())));
            }
        }
    }
    Ok(())
}

#[test]
fn opaque_state_round_trips_exactly() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
    for _ in 0..50 {
        let state = CadenceLike {
            counts: (0..rng.random_range(0..6)).map(|_| rng.random()).collect(),
            ms_per_batch: (0..rng.random_range(0..6))
                .map(|_| f64::from_bits(rng.random::<u64>() >> 2))
                .chain([-0.0, f64::MIN_POSITIVE / 3.0])
                .collect(),
            anchor: rng.random::<bool>().then(|| rng.random()),
            label: "x".repeat(rng.random_range(0..20)),
        };
        let blob = OpaqueState::encode(&state)?;
        let back: CadenceLike = blob.decode()?;
        let bits = |s: &CadenceLike| s.ms_per_batch.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        if back != state || bits(&back) != bits(&state) {
            return Err(fail(format!("opaque state differs: {back:?} vs {state:?}")));
        }
        // Trailing bytes and wrong types are typed errors.
        let mut longer = blob.as_bytes().to_vec();
        longer.push(0);
        expect_err(
            OpaqueState::from_bytes(longer).decode::<CadenceLike>(),
            |e| matches!(e, CheckpointError::Malformed { .. }),
            "trailing byte",
        )?;
    }
    expect_err(
        OpaqueState::from_bytes(vec![0xff; 3]).decode::<CadenceLike>(),
        |e| matches!(e, CheckpointError::Decode { .. }),
        "garbage opaque state",
    )
}

/// Which errors a flipped byte at `offset` may produce, by section.
fn accept_flip(offset: usize, e: &CheckpointError) -> bool {
    match offset {
        0..8 => matches!(e, CheckpointError::BadMagic { .. }),
        8..12 => matches!(e, CheckpointError::UnsupportedVersion { .. }),
        16..32 => matches!(
            e,
            CheckpointError::TooLarge { .. }
                | CheckpointError::Truncated { .. }
                | CheckpointError::TrailingBytes { .. }
        ),
        // Reserved field, checksum field, metadata and tensor data.
        _ => matches!(e, CheckpointError::ChecksumMismatch),
    }
}

#[test]
fn every_flipped_byte_is_a_typed_error() -> TestResult {
    let bytes = small_checkpoint()?.to_bytes()?;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
    for offset in 0..bytes.len() {
        for mask in [0x01u8, 0x80, rng.random_range(1..=255u8)] {
            let mut bad = bytes.clone();
            bad[offset] ^= mask;
            expect_err(
                Checkpoint::from_bytes(&bad),
                |e| accept_flip(offset, e),
                &format!("flip {mask:#04x} at byte {offset} of {}", bytes.len()),
            )?;
        }
    }
    // Through the file reader too, one offset per section.
    let dir = tempfile::tempdir()?;
    let meta_start = HEADER_LEN + 1;
    for offset in [0, 9, 13, 20, 40, meta_start, bytes.len() - 1] {
        let mut bad = bytes.clone();
        bad[offset] ^= 0x10;
        let path = dir.path().join(format!("flip-{offset}.fdlck"));
        std::fs::write(&path, &bad)?;
        expect_err(
            Checkpoint::read(&path),
            |e| accept_flip(offset, e),
            &format!("file flip at {offset}"),
        )?;
    }
    Ok(())
}

#[test]
fn every_truncation_and_extension_is_a_typed_error() -> TestResult {
    let bytes = small_checkpoint()?.to_bytes()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("cut.fdlck");
    for len in 0..bytes.len() {
        let is_truncated = |e: &CheckpointError| matches!(e, CheckpointError::Truncated { actual, .. } if *actual == len as u64);
        expect_err(
            Checkpoint::from_bytes(&bytes[..len]),
            is_truncated,
            &format!("truncated to {len}"),
        )?;
        std::fs::write(&path, &bytes[..len])?;
        expect_err(Checkpoint::read(&path), is_truncated, &format!("file truncated to {len}"))?;
    }
    for extra in [1usize, 7, 1000] {
        let mut longer = bytes.clone();
        longer.extend(std::iter::repeat_n(0u8, extra));
        expect_err(
            Checkpoint::from_bytes(&longer),
            |e| matches!(e, CheckpointError::TrailingBytes { actual, .. } if *actual == longer.len() as u64),
            &format!("{extra} bytes appended"),
        )?;
    }
    Ok(())
}

#[test]
fn wrong_magic_and_version_are_typed_errors() -> TestResult {
    let bytes = small_checkpoint()?.to_bytes()?;
    let magics: [[u8; 8]; 3] = [[0; 8], *b"\x89PNG\r\n\x1a\n", *b"FDLCKPT1"];
    for magic in magics {
        let mut bad = bytes.clone();
        bad[..8].copy_from_slice(&magic);
        expect_err(
            Checkpoint::from_bytes(&bad),
            |e| matches!(e, CheckpointError::BadMagic { found } if *found == magic),
            &format!("magic {magic:02x?}"),
        )?;
    }
    for version in [0u32, 2, 3, u32::MAX] {
        let mut bad = bytes.clone();
        bad[8..12].copy_from_slice(&version.to_le_bytes());
        expect_err(
            Checkpoint::from_bytes(&bad),
            |e| matches!(e, CheckpointError::UnsupportedVersion { found, supported: 1 } if *found == version),
            &format!("version {version}"),
        )?;
    }
    if bytes[..8] != MAGIC {
        return Err(fail("bundle does not start with MAGIC".into()));
    }
    Ok(())
}

/// Rewrites the header lengths and checksum of `bytes` over a new payload, as a buggy or
/// hostile writer that knows the format would.
fn reseal(bytes: &[u8], meta: &[u8], data: &[u8], reserved: u32) -> Vec<u8> {
    let mut out = bytes[..HEADER_LEN].to_vec();
    out[12..16].copy_from_slice(&reserved.to_le_bytes());
    out[16..24].copy_from_slice(&(meta.len() as u64).to_le_bytes());
    out[24..32].copy_from_slice(&(data.len() as u64).to_le_bytes());
    let mut h = Sha256::new();
    h.update(&out[..32]);
    h.update(meta);
    h.update(data);
    let digest: [u8; 32] = h.finalize().into();
    out[32..64].copy_from_slice(&digest);
    out.extend_from_slice(meta);
    out.extend_from_slice(data);
    out
}

#[test]
fn forged_lengths_and_sealed_garbage_are_rejected() -> TestResult {
    let ckpt = small_checkpoint()?;
    let bytes = ckpt.to_bytes()?;
    let meta_len = u64::from_le_bytes(bytes[16..24].try_into()?) as usize;
    let meta = &bytes[HEADER_LEN..HEADER_LEN + meta_len];
    let data = &bytes[HEADER_LEN + meta_len..];
    // Declared lengths over the ceilings: refused before any allocation.
    let mut big = bytes.clone();
    big[16..24].copy_from_slice(&(MAX_META_BYTES + 1).to_le_bytes());
    expect_err(
        Checkpoint::from_bytes(&big),
        |e| matches!(e, CheckpointError::TooLarge { what: "metadata", .. }),
        "metadata length over the cap",
    )?;
    let mut big = bytes.clone();
    big[24..32].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
    expect_err(
        Checkpoint::from_bytes(&big),
        |e| matches!(e, CheckpointError::TooLarge { what: "bundle", .. }),
        "data length overflowing",
    )?;
    let limits = ReadLimits { max_bundle_bytes: bytes.len() as u64 - 1 };
    expect_err(
        Checkpoint::from_bytes_with_limits(&bytes, limits),
        |e| matches!(e, CheckpointError::TooLarge { what: "bundle", .. }),
        "bundle over a caller's limit",
    )?;
    // A correctly sealed bundle whose content is inconsistent.
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
    let cases: Vec<(String, Vec<u8>)> = vec![
        ("reserved field set".into(), reseal(&bytes, meta, data, 1)),
        ("extra data byte".into(), reseal(&bytes, meta, &[data, &[0]].concat(), 0)),
        ("missing data byte".into(), reseal(&bytes, meta, &data[..data.len() - 1], 0)),
        ("metadata with a trailing byte".into(), reseal(&bytes, &[meta, &[0]].concat(), data, 0)),
        ("metadata cut short".into(), reseal(&bytes, &meta[..meta.len() / 2], data, 0)),
        (
            "random metadata".into(),
            reseal(&bytes, &(0..meta.len()).map(|_| rng.random()).collect::<Vec<u8>>(), data, 0),
        ),
        ("empty metadata".into(), reseal(&bytes, &[], data, 0)),
    ];
    for (name, bad) in cases {
        expect_err(
            Checkpoint::from_bytes(&bad),
            |e| matches!(e, CheckpointError::Malformed { .. } | CheckpointError::Decode { .. }),
            &name,
        )?;
    }
    Ok(())
}

#[test]
fn mismatched_bundles_are_rejected_with_typed_errors() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = CheckpointStore::open(dir.path(), 2)?;
    let ckpt = random_checkpoint(77)?;
    store.save(&ckpt)?;
    let good = expectation_of(&ckpt);
    let first = ckpt.params.records()[0].signature_entry();
    let with_first = |f: &dyn Fn(&mut SignatureEntry)| {
        let mut entries = good.signature.entries().to_vec();
        f(&mut entries[0]);
        Expectation { signature: ModelSignature::new(entries), ..good.clone() }
    };
    let other_dtype = match first.dtype {
        StoredDType::F32 => StoredDType::I32,
        _ => StoredDType::F32,
    };
    let mut more = good.signature.entries().to_vec();
    more.push(SignatureEntry { name: "extra".into(), shape: vec![1], dtype: StoredDType::F32 });
    let cases: Vec<(&str, Expectation, Accept)> = vec![
        ("renamed parameter", with_first(&|e| e.name.push('x')), |e| {
            matches!(e, CheckpointError::SignatureMismatch { .. })
        }),
        ("reshaped parameter", with_first(&|e| e.shape.push(2)), |e| {
            matches!(e, CheckpointError::SignatureMismatch { .. })
        }),
        ("other dtype", with_first(&|e| e.dtype = other_dtype), |e| {
            matches!(e, CheckpointError::SignatureMismatch { .. })
        }),
        (
            "one more parameter",
            Expectation { signature: ModelSignature::new(more), ..good.clone() },
            |e| matches!(e, CheckpointError::SignatureMismatch { .. }),
        ),
        (
            "other world size",
            Expectation { world_size: good.world_size + 1, ..good.clone() },
            |e| matches!(e, CheckpointError::WorldSizeMismatch { .. }),
        ),
        (
            "other configuration",
            Expectation { config_hash: ConfigHash::of("another config"), ..good.clone() },
            |e| matches!(e, CheckpointError::ConfigMismatch { .. }),
        ),
    ];
    for (name, expect, accept) in cases {
        expect_err(store.load_latest(&expect), accept, name)?;
        expect_err(ckpt.check_compatible(&expect), accept, name)?;
    }
    if store.load_latest(&good)? != ckpt {
        return Err(fail("the matching expectation does not load the bundle".into()));
    }
    Ok(())
}

#[test]
fn store_keeps_latest_and_the_newest_steps() -> TestResult {
    let dir = tempfile::tempdir()?;
    let base = small_checkpoint()?;
    let expect = expectation_of(&base);
    expect_err(
        locate(&dir.path().join("missing")),
        |e| matches!(e, CheckpointError::NotFound { .. }),
        "missing directory",
    )?;
    let store = CheckpointStore::open(dir.path(), 3)?;
    expect_err(
        store.load_latest(&expect),
        |e| matches!(e, CheckpointError::NotFound { .. }),
        "empty store",
    )?;
    let steps = [5u64, 10, 15, 20, 25, 30, 35];
    for (i, &s) in steps.iter().enumerate() {
        let mut c = base.clone();
        c.global_step = s;
        let path = store.save(&c)?;
        if path != store.step_path(s) {
            return Err(fail(format!("save returned {path:?}")));
        }
        let kept: Vec<u64> = store.steps()?.into_iter().map(|(s, _)| s).collect();
        let want: Vec<u64> = steps[(i + 1).saturating_sub(3)..=i].to_vec();
        if kept != want {
            return Err(fail(format!("after step {s}: kept {kept:?}, want {want:?}")));
        }
        if store.load_latest(&expect)?.global_step != s {
            return Err(fail(format!("latest is not step {s}")));
        }
    }
    // Named bundles leave latest alone; names that could clash are refused.
    let mut last = base.clone();
    last.reason = SaveReason::GracefulShutdown;
    last.global_step = 99;
    let final_path = store.save_named("final", &last)?;
    if Checkpoint::load(&final_path, &expect)? != last
        || store.load_latest(&expect)?.global_step != 35
    {
        return Err(fail("named save disturbed latest or did not load".into()));
    }
    for name in ["", "latest", "../x", ".hidden", "a/b", "step-3"] {
        expect_err(
            store.save_named(name, &last),
            |e| matches!(e, CheckpointError::InvalidName { .. }),
            name,
        )?;
    }
    // Without `latest`, the highest step is loaded.
    std::fs::remove_file(store.path_of("latest"))?;
    if store.load_latest(&expect)?.global_step != 35 {
        return Err(fail("fallback to the highest step failed".into()));
    }
    Ok(())
}

/// The names of the files in `dir`, sorted.
fn listing(dir: &Path) -> Result<Vec<String>, Box<dyn Error>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    Ok(names)
}

/// `locate` picks `latest` when it reads intact, else the highest intact step bundle (a corrupt
/// `latest` is skipped), a file is itself, and it never changes the directory (an interrupted
/// save's temporary file stays); the store's loaders go through it.
#[test]
fn locate_skips_a_corrupt_latest_and_only_reads() -> TestResult {
    /// A case: the store's files to corrupt or delete, what `locate(dir)` returns (the step of
    /// the bundle chosen, `None` for `latest`; or the error it must fail with) and how many
    /// bundles it skips.
    type Case = (&'static str, &'static [&'static str], &'static [&'static str], Expect);
    enum Expect {
        Picks(Option<u64>, usize),
        Fails(Accept),
    }
    let corrupt = |e: &CheckpointError| matches!(e, CheckpointError::ChecksumMismatch);
    let not_found = |e: &CheckpointError| matches!(e, CheckpointError::NotFound { .. });
    let cases: [Case; 6] = [
        ("intact", &[], &[], Expect::Picks(None, 0)),
        // latest and step-3 are one bundle (a hard link): both corrupt.
        ("corrupt newest", &["latest", "step-3"], &[], Expect::Picks(Some(2), 2)),
        ("corrupt latest only", &["latest"], &[], Expect::Picks(Some(3), 1)),
        ("no latest", &[], &["latest"], Expect::Picks(Some(3), 0)),
        ("all corrupt", &["latest", "step-1", "step-2", "step-3"], &[], Expect::Fails(corrupt)),
        ("empty", &[], &["latest", "step-1", "step-2", "step-3"], Expect::Fails(not_found)),
    ];
    let base = small_checkpoint()?;
    let expect = expectation_of(&base);
    for (name, damaged, deleted, want) in cases {
        let dir = tempfile::tempdir()?;
        let store = CheckpointStore::open(dir.path(), 4)?;
        for s in [1u64, 2, 3] {
            let mut c = base.clone();
            c.global_step = s;
            store.save(&c)?;
        }
        for file in damaged {
            let path = store.path_of(file);
            let mut bytes = std::fs::read(&path)?;
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff;
            // A fresh file, so a hard-linked twin is damaged only when listed.
            std::fs::remove_file(&path)?;
            std::fs::write(&path, &bytes)?;
        }
        for file in deleted {
            std::fs::remove_file(store.path_of(file))?;
        }
        std::fs::write(dir.path().join(".latest.fdlck.tmp-1-0"), b"an interrupted save")?;
        let before = listing(dir.path())?;
        match want {
            Expect::Picks(step, skipped) => {
                let found = locate(dir.path())?;
                let path = step.map_or_else(|| store.path_of("latest"), |s| store.step_path(s));
                if found.path != path || found.skipped.len() != skipped {
                    return Err(fail(format!(
                        "{name}: picked {:?} after skipping {:?}",
                        found.path, found.skipped
                    )));
                }
                if found.checkpoint.global_step != step.unwrap_or(3)
                    || store.load_latest(&expect)? != found.checkpoint
                {
                    return Err(fail(format!("{name}: the loaders disagree with locate")));
                }
            }
            Expect::Fails(accept) => {
                expect_err(locate(dir.path()), accept, name)?;
                expect_err(store.load_latest(&expect), accept, name)?;
            }
        }
        if listing(dir.path())? != before {
            return Err(fail(format!("{name}: locating changed the directory")));
        }
        // A file is itself, intact or not.
        let step1 = store.step_path(1);
        if step1.is_file() {
            let read = locate(&step1).map(|f| f.path);
            if damaged.contains(&"step-1") {
                expect_err(read, corrupt, name)?;
            } else if read? != step1 {
                return Err(fail(format!("{name}: a file did not locate itself")));
            }
        }
    }
    expect_err(locate(Path::new("/nowhere/at/all")), not_found, "missing path")?;
    Ok(())
}

#[test]
fn invalid_values_cannot_be_built_or_encoded() -> TestResult {
    expect_err(
        TensorRecord::from_le_bytes("x", StoredDType::F32, vec![2, 2], vec![0; 15]),
        |e| matches!(e, CheckpointError::Malformed { .. }),
        "wrong byte count",
    )?;
    expect_err(
        TensorRecord::from_le_bytes("x", StoredDType::F32, vec![usize::MAX, 2], vec![]),
        |e| matches!(e, CheckpointError::Malformed { .. }),
        "overflowing shape",
    )?;
    let r = TensorRecord::from_f32("x", vec![1], &[1.0])?;
    expect_err(
        TensorSet::from_records(vec![r.clone(), r]),
        |e| matches!(e, CheckpointError::Malformed { .. }),
        "duplicate names",
    )?;
    let mut c = small_checkpoint()?;
    c.world_size = 0;
    expect_err(c.to_bytes(), |e| matches!(e, CheckpointError::Malformed { .. }), "world 0")?;
    let mut c = small_checkpoint()?;
    c.coverage.push(EpochCoverage::new(0, 1, 10));
    expect_err(c.to_bytes(), |e| matches!(e, CheckpointError::Malformed { .. }), "two coverages")?;
    Ok(())
}

#[test]
fn shape_checks_find_every_mismatch_before_writing() -> TestResult {
    let set = TensorSet::from_records(vec![
        TensorRecord::from_f32("a", vec![2, 3], &[0.0; 6])?,
        TensorRecord::from_i32("b", vec![4], &[0; 4])?,
    ])?;
    let (s23, s4, s5): (&[usize], &[usize], &[usize]) = (&[2, 3], &[4], &[5]);
    set.check_shapes("p", [(s23, StoredDType::F32), (s4, StoredDType::I32)].into_iter())?;
    type Targets<'a> = Vec<(&'a [usize], StoredDType)>;
    let cases: Vec<(&str, Targets<'_>, Accept)> = vec![
        ("one target", vec![(s23, StoredDType::F32)], |e| {
            matches!(e, CheckpointError::CountMismatch { expected: 2, found: 1, .. })
        }),
        (
            "shape",
            vec![(s23, StoredDType::F32), (s5, StoredDType::I32)],
            |e| matches!(e, CheckpointError::TensorMismatch { name, .. } if name == "b"),
        ),
        (
            "dtype",
            vec![(s23, StoredDType::Bf16), (s4, StoredDType::I32)],
            |e| matches!(e, CheckpointError::TensorMismatch { name, .. } if name == "a"),
        ),
    ];
    for (name, targets, accept) in cases {
        expect_err(set.check_shapes("p", targets.into_iter()), accept, name)?;
    }
    Ok(())
}

/// The covered positions of `ranges` as a bitmap (the reference).
fn bitmap(ranges: &[SampleRange], total: usize) -> Vec<bool> {
    let mut bits = vec![false; total];
    for r in ranges {
        bits[r.offset..r.offset + r.size].iter_mut().for_each(|b| *b = true);
    }
    bits
}

fn check_sorted_disjoint(ranges: &[SampleRange], non_adjacent: bool) -> bool {
    ranges.iter().all(|r| r.size > 0)
        && ranges.windows(2).all(|w| {
            let end = w[0].offset + w[0].size;
            if non_adjacent { end < w[1].offset } else { end <= w[1].offset }
        })
}

#[test]
fn coverage_properties_hold_for_random_ranges() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(2024);
    for case in 0..2000 {
        let total = rng.random_range(0..300usize);
        let n = rng.random_range(0..12usize);
        let done = random_ranges(&mut rng, total, n);
        let covered = normalise(&done, total)?;
        let gaps = uncovered(&done, total)?;
        let reference = bitmap(&done, total);
        let ok = bitmap(&covered, total) == reference
            && bitmap(&gaps, total) == reference.iter().map(|b| !b).collect::<Vec<_>>()
            && check_sorted_disjoint(&covered, true)
            && check_sorted_disjoint(&gaps, true);
        if !ok {
            return Err(fail(format!(
                "case {case}: total {total}, done {done:?} -> covered {covered:?}, gaps {gaps:?}"
            )));
        }
        // Marking ranges one by one gives the same coverage.
        let mut epoch = EpochCoverage::new(3, 9, total);
        for r in &done {
            epoch.mark_done(*r)?;
        }
        let count = reference.iter().filter(|b| **b).count();
        if epoch.completed() != covered.as_slice()
            || epoch.uncovered() != gaps
            || epoch.done_count() != count
            || epoch.is_complete() != (count == total)
        {
            return Err(fail(format!("case {case}: EpochCoverage disagrees")));
        }
    }
    // Ranges past the end, or overflowing, are typed errors and change nothing.
    let mut epoch = EpochCoverage::with_completed(0, 0, 10, &[SampleRange::new(2, 3)])?;
    for bad in [SampleRange::new(8, 3), SampleRange::new(11, 0), SampleRange::new(usize::MAX, 2)] {
        expect_err(
            uncovered(&[bad], 10),
            |e| matches!(e, CheckpointError::RangeOutOfBounds { .. }),
            &format!("{bad:?}"),
        )?;
        expect_err(
            epoch.mark_done(bad),
            |e| matches!(e, CheckpointError::RangeOutOfBounds { .. }),
            "mark",
        )?;
    }
    if epoch.completed() != [SampleRange::new(2, 3)] {
        return Err(fail("a rejected range changed the coverage".into()));
    }
    Ok(())
}

#[test]
fn bundle_fields_survive_with_their_meaning() -> TestResult {
    let ckpt = random_checkpoint(31)?;
    let back = Checkpoint::from_bytes(&ckpt.to_bytes()?)?;
    let cadence: CadenceLike =
        back.elche.as_ref().ok_or_else(|| fail("no elche state".into()))?.decode()?;
    let original: CadenceLike =
        ckpt.elche.as_ref().ok_or_else(|| fail("no elche state".into()))?.decode()?;
    let extras: BTreeMap<String, (f64, u8)> = back
        .extras
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.decode()?)))
        .collect::<Result<_, CheckpointError>>()?;
    if cadence != original || extras.len() != 1 || back.signature() != ckpt.signature() {
        return Err(fail("fields changed meaning".into()));
    }
    for c in &back.coverage {
        let again = back.coverage_of(c.epoch).ok_or_else(|| fail("coverage lookup".into()))?;
        if again.uncovered() != uncovered(c.completed(), c.total)? {
            return Err(fail("coverage differs".into()));
        }
    }
    Ok(())
}

/// Tensors and their values as bit patterns.
type TensorsAndBits = (Vec<Tensor>, Vec<Vec<u32>>);

/// Random tensors of every dtype on `stream`'s device, with their host values as bit patterns.
fn random_tensors(
    rng: &mut Xoshiro256PlusPlus,
    stream: &Stream,
    n: usize,
) -> Result<TensorsAndBits, Box<dyn Error>> {
    let mut tensors = Vec::new();
    let mut bits = Vec::new();
    for _ in 0..n {
        let shape = random_shape(rng);
        let numel: usize = shape.iter().product();
        let raw: Vec<u32> = (0..numel).map(|_| rng.random()).collect();
        let t = match rng.random_range(0..3u8) {
            0 => {
                let v: Vec<f32> = raw.iter().map(|&b| f32::from_bits(b)).collect();
                Tensor::from_slice(&v, &shape, stream)?
            }
            1 => {
                let v: Vec<bf16> = raw.iter().map(|&b| bf16::from_bits(b as u16)).collect();
                bits.push(v.iter().map(|x| u32::from(x.to_bits())).collect());
                tensors.push(Tensor::from_slice(&v, &shape, stream)?);
                continue;
            }
            _ => {
                let v: Vec<i32> = raw.iter().map(|&b| b as i32).collect();
                Tensor::from_slice(&v, &shape, stream)?
            }
        };
        bits.push(raw);
        tensors.push(t);
    }
    Ok((tensors, bits))
}

/// A tensor's values as bit patterns (widened to u32).
fn tensor_bits(t: &Tensor, stream: &Stream) -> Result<Vec<u32>, Box<dyn Error>> {
    Ok(match t.dtype() {
        DType::F32 => t.to_vec::<f32>(stream)?.iter().map(|x| x.to_bits()).collect(),
        DType::Bf16 => t.to_vec::<bf16>(stream)?.iter().map(|x| u32::from(x.to_bits())).collect(),
        DType::I32 => t.to_vec::<i32>(stream)?.iter().map(|&x| x as u32).collect(),
    })
}

fn zeros_like(ts: &[Tensor], stream: &Stream) -> Result<Vec<Tensor>, Box<dyn Error>> {
    Ok(ts.iter().map(|t| Tensor::zeros(t.shape(), t.dtype(), stream)).collect::<Result<_, _>>()?)
}

/// Capture → bundle bytes → decode → restore into fresh tensors, bitwise, on one device.
fn capture_restore_round_trip(stream: &Stream) -> TestResult {
    for seed in SEEDS {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let (params, param_bits) = random_tensors(&mut rng, stream, 5)?;
        let (buffers, buffer_bits) = random_tensors(&mut rng, stream, 2)?;
        let names: Vec<String> = (0..params.len()).map(|i| format!("layer{i}.w")).collect();
        let mut ckpt = Checkpoint::new(
            TensorSet::capture(&names, &params, stream)?,
            2,
            ConfigHash::of("transfer"),
        );
        ckpt.buffers = TensorSet::capture_indexed("buf", &buffers, stream)?;
        let expect = Expectation {
            signature: ModelSignature::of_tensors(&names, &params)?,
            world_size: 2,
            config_hash: ConfigHash::of("transfer"),
        };
        if ModelSignature::of_indexed("buf", &buffers) != ckpt.buffers.signature() {
            return Err(fail(format!("seed {seed}: indexed signature differs")));
        }
        let back = Checkpoint::from_bytes(&ckpt.to_bytes()?)?;
        back.check_compatible(&expect)?;
        let mut p = zeros_like(&params, stream)?;
        let mut b = zeros_like(&buffers, stream)?;
        back.restore_model_into(&mut p, &mut b, stream)?;
        for (t, want) in p.iter().chain(&b).zip(param_bits.iter().chain(&buffer_bits)) {
            if tensor_bits(t, stream)? != *want {
                return Err(fail(format!("seed {seed}: restored tensor differs")));
            }
        }
        for (t, want) in back.params.to_tensors(stream)?.iter().zip(&param_bits) {
            if tensor_bits(t, stream)? != *want {
                return Err(fail(format!("seed {seed}: to_tensors differs")));
            }
        }
    }
    Ok(())
}

#[test]
fn capture_and_restore_are_bitwise_on_cpu() -> TestResult {
    capture_restore_round_trip(&Stream::cpu_with_threads(1))
}

#[test]
fn capture_and_restore_are_bitwise_on_cuda() -> TestResult {
    if let Some(reason) = gpu_skip_reason() {
        skip_or_fail(&reason);
        return Ok(());
    }
    capture_restore_round_trip(&Stream::new(Device::Cuda(0))?)
}

#[test]
fn a_mismatched_target_stops_the_restore_before_any_write() -> TestResult {
    let s = Stream::cpu_with_threads(1);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(8);
    let params: Vec<Tensor> = (0..3)
        .map(|i| Tensor::rand_normal(&[2, i + 1], 0.0, 1.0, rng.random(), &s))
        .collect::<Result<_, _>>()?;
    let buffers = vec![Tensor::from_slice(&[5i32, 6], &[2], &s)?];
    let mut ckpt =
        Checkpoint::new(TensorSet::capture_indexed("p", &params, &s)?, 1, ConfigHash::of("m"));
    ckpt.buffers = TensorSet::capture_indexed("b", &buffers, &s)?;
    type Make = fn(&Stream) -> flodl_tensor::Result<(Vec<Tensor>, Vec<Tensor>)>;
    let cases: Vec<(&str, Make, Accept)> = vec![
        (
            "last param reshaped",
            |s| {
                Ok((
                    vec![
                        Tensor::zeros(&[2, 1], DType::F32, s)?,
                        Tensor::zeros(&[2, 2], DType::F32, s)?,
                        Tensor::zeros(&[3, 2], DType::F32, s)?,
                    ],
                    vec![Tensor::zeros(&[2], DType::I32, s)?],
                ))
            },
            |e| matches!(e, CheckpointError::TensorMismatch { name, .. } if name == "p.2"),
        ),
        (
            "buffer of another dtype",
            |s| {
                Ok((
                    vec![
                        Tensor::zeros(&[2, 1], DType::F32, s)?,
                        Tensor::zeros(&[2, 2], DType::F32, s)?,
                        Tensor::zeros(&[2, 3], DType::F32, s)?,
                    ],
                    vec![Tensor::zeros(&[2], DType::F32, s)?],
                ))
            },
            |e| matches!(e, CheckpointError::TensorMismatch { name, .. } if name == "b.0"),
        ),
        (
            "a param missing",
            |s| {
                Ok((
                    vec![
                        Tensor::zeros(&[2, 1], DType::F32, s)?,
                        Tensor::zeros(&[2, 2], DType::F32, s)?,
                    ],
                    vec![Tensor::zeros(&[2], DType::I32, s)?],
                ))
            },
            |e| matches!(e, CheckpointError::CountMismatch { expected: 3, found: 2, .. }),
        ),
    ];
    for (name, make, accept) in cases {
        let (mut p, mut b) = make(&s)?;
        expect_err(ckpt.restore_model_into(&mut p, &mut b, &s), accept, name)?;
        for t in p.iter().chain(&b) {
            if tensor_bits(t, &s)?.iter().any(|&x| x != 0) {
                return Err(fail(format!("{name}: a tensor was written before the check failed")));
            }
        }
    }
    expect_err(
        TensorSet::capture(&["only one name"], &params, &s),
        |e| matches!(e, CheckpointError::CountMismatch { .. }),
        "names and tensors differ in count",
    )
}

#[test]
fn save_interval_matches_hand_computed_schedules() -> TestResult {
    let cases: [(SaveInterval, &[u64], &[u64]); 5] = [
        (SaveInterval::never(), &[], &[]),
        (SaveInterval::every_reduces(0), &[], &[]),
        (SaveInterval::every_reduces(3), &[3, 6, 9], &[]),
        (SaveInterval::every_epochs(2), &[], &[2, 4, 6, 8, 10]),
        (
            SaveInterval { every_reduces: NonZeroU64::new(1), every_epochs: NonZeroU64::new(5) },
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            &[5, 10],
        ),
    ];
    for (interval, reduces, epochs) in cases {
        let got_r: Vec<u64> = (0..=10).filter(|&n| interval.due_after_reduce(n)).collect();
        let got_e: Vec<u64> = (0..=10).filter(|&n| interval.due_after_epoch(n)).collect();
        if got_r != reduces || got_e != epochs {
            return Err(fail(format!("{interval:?}: reduces {got_r:?}, epochs {got_e:?}")));
        }
        // Every case that saves at all saves within its first ten reduces or epochs.
        if interval.is_periodic() == (reduces.is_empty() && epochs.is_empty()) {
            return Err(fail(format!("{interval:?}: periodic {}", interval.is_periodic())));
        }
    }
    Ok(())
}

#[test]
fn a_resumed_dispatcher_hands_out_exactly_the_uncovered_ranges() -> TestResult {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(606);
    for case in 0..200 {
        let world = rng.random_range(1..5usize);
        let batch = rng.random_range(1..9usize);
        let batches = rng.random_range(0..50usize);
        let cutting = if rng.random::<bool>() {
            Cutting::Static
        } else {
            Cutting::Progressive { min_chunk: rng.random_range(1..4) }
        };
        let mut book = Dispatcher::new(world, batch, batches, 1, cutting);
        // Hand out chunks, complete some, leave others in flight at the "crash".
        let mut held: Vec<(usize, Chunk)> = Vec::new();
        for _ in 0..rng.random_range(0..30) {
            let rank = rng.random_range(0..world);
            if let Some(chunk) =
                book.next_chunk(rank, &vec![2; world], rng.random(), Instant::now())
            {
                held.push((rank, chunk));
            }
        }
        for (rank, chunk) in &held {
            if rng.random_range(0..3) > 0 {
                let work = WorkTally { batches: chunk.batches(batch), ..Default::default() };
                book.complete(*rank, chunk, &work, Instant::now());
            }
        }
        let seed = rng.random();
        let saved = book.coverage(&[], seed)?;
        let mut ckpt = small_checkpoint()?;
        ckpt.coverage = saved.clone();
        let back = Checkpoint::from_bytes(&ckpt.to_bytes()?)?;
        if back.coverage != saved || back.coverage.iter().any(|c| c.seed != seed) {
            return Err(fail(format!("case {case}: coverage changed in the bundle")));
        }
        // Drain the resumed book: it hands out exactly the uncovered positions, once each.
        let total = batches * batch;
        let restored = back.coverage_of(0).cloned();
        let completed = restored.as_ref().map_or(&[][..], |c| c.completed());
        let uncovered_now = uncovered(completed, total)?;
        let mut resumed =
            Dispatcher::new(world, batch, batches, 1, cutting).resume(0, &back.coverage)?;
        let mut dispatched = Vec::new();
        let mut ranks: Vec<usize> = (0..world).collect();
        loop {
            let before = dispatched.len();
            ranks.sort_by_key(|_| rng.random::<u32>());
            for &rank in &ranks {
                if let Some(chunk) = resumed.next_chunk(rank, &vec![2; world], true, Instant::now())
                {
                    dispatched.push(SampleRange::new(chunk.offset, chunk.len));
                }
            }
            if dispatched.len() == before {
                break;
            }
        }
        let mut seen = vec![0u32; total];
        for r in completed.iter().chain(&dispatched) {
            seen[r.offset..r.offset + r.size].iter_mut().for_each(|c| *c += 1);
        }
        if normalise(&dispatched, total)? != uncovered_now || seen.iter().any(|&c| c != 1) {
            return Err(fail(format!(
                "case {case}: done {completed:?}, uncovered {uncovered_now:?}, dispatched {dispatched:?}"
            )));
        }
    }
    Ok(())
}

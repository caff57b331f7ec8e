//! Hostile files (a gzip bomb, a lying gzip trailer, lying idx dimensions, a record header whose
//! sizes wrap) give a typed error naming the file, and the memory asked for stays bounded: a
//! counting global allocator measures each case's peak (its own binary, one test, so nothing
//! else allocates meanwhile).

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use flodl_data::{Access, Error, Mnist, RecordFile, Split, Verify};
use sha2::{Digest, Sha256};

/// The system allocator, counting the bytes held now and the most held since the last reset.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to `System` with the caller's layout unchanged; the counters are
// plain atomics and never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received; the caller upholds `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (so from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`; the caller upholds the rest.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            HELD.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

fn grew(bytes: usize) {
    let now = HELD.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const MIB: usize = 1 << 20;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let _ = e.write_all(bytes);
    e.finish().unwrap_or_default()
}

/// An idx image header declaring `n` images of 28 × 28.
fn image_header(n: u32) -> Vec<u8> {
    let mut h = 0x0000_0803u32.to_be_bytes().to_vec();
    for d in [n, 28, 28] {
        h.extend_from_slice(&d.to_be_bytes());
    }
    h
}

/// A sound idx label file of `n` labels.
fn labels(n: u32) -> Vec<u8> {
    let mut b = 0x0000_0801u32.to_be_bytes().to_vec();
    b.extend_from_slice(&n.to_be_bytes());
    b.extend((0..n).map(|i| (i % 10) as u8));
    gzip(&b)
}

/// A record file header (version 1) declaring `samples` samples of one f32 field of `shape`,
/// with a correct checksum, padded to the first block.
fn record_header(samples: u64, shape: &[u64]) -> Vec<u8> {
    let mut body = samples.to_le_bytes().to_vec();
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&1u16.to_le_bytes());
    body.push(b'x');
    body.push(0);
    body.push(shape.len() as u8);
    for d in shape {
        body.extend_from_slice(&d.to_le_bytes());
    }
    let mut out = b"FLODLREC".to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum[..8]);
    out.resize(4096 * 2, 0);
    out
}

/// What a case reads.
enum Reader {
    /// `t10k-images-idx3-ubyte[.gz]` holding these bytes, beside a sound label file of 10.
    MnistImages { gz: bool, bytes: Vec<u8> },
    /// A record file holding these bytes.
    Records(Vec<u8>),
}

struct Case {
    what: &'static str,
    reader: Reader,
    expect: fn(&Error) -> bool,
    /// The most the reading may hold at once, in bytes.
    most: usize,
}

fn cases() -> Vec<Case> {
    let ten_images = {
        let mut b = image_header(10);
        b.extend(std::iter::repeat_n(7u8, 10 * 784));
        b
    };
    let bomb = {
        // 10 images declared, then 64 MiB of zeros: ~65 KB on disk.
        let mut b = image_header(10);
        b.resize(b.len() + 64 * MIB, 0);
        gzip(&b)
    };
    let lying_trailer = {
        let mut gz = gzip(&ten_images);
        let n = gz.len();
        gz[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
        gz
    };
    let claims_everything = {
        // 2,000,000 images (1.5 GB) declared by a file of a few bytes.
        let mut b = image_header(2_000_000);
        b.extend(std::iter::repeat_n(0u8, 784));
        gzip(&b)
    };
    let claims_past_the_cap = {
        // The same claim, padded past 1.5 GB / 1032 bytes: deflate could expand it that far,
        // the reader's cap (1 GiB of data) refuses it.
        let mut gz = claims_everything.clone();
        gz.resize(2 * MIB, 0x55);
        gz
    };
    let raw_lying_dims = {
        let mut b = image_header(60_000);
        b.extend(std::iter::repeat_n(1u8, 10 * 784));
        b
    };
    let gz_lying_dims = gzip(&raw_lying_dims);
    let gz_short = {
        // 100 images declared, 10 of noise held: a claim deflate could honour, found short.
        let mut b = image_header(100);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        b.extend((0..10 * 784).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        }));
        gzip(&b)
    };
    vec![
        Case {
            what: "gzip bomb (64 MiB of zeros after a header of 10 images)",
            reader: Reader::MnistImages { gz: true, bytes: bomb },
            expect: |e| matches!(e, Error::WrongLength { expected: 7840, found: 7841, .. }),
            most: 2 * MIB,
        },
        Case {
            what: "gzip trailer claiming 4 GiB",
            reader: Reader::MnistImages { gz: true, bytes: lying_trailer },
            expect: |e| matches!(e, Error::Decompress { .. }),
            most: 2 * MIB,
        },
        Case {
            what: "a few bytes declaring 2,000,000 images",
            reader: Reader::MnistImages { gz: true, bytes: claims_everything },
            expect: |e| matches!(e, Error::DeclaredTooLarge { .. }),
            most: 2 * MIB,
        },
        Case {
            what: "2 MiB declaring 2,000,000 images (over the cap)",
            reader: Reader::MnistImages { gz: true, bytes: claims_past_the_cap },
            expect: |e| matches!(e, Error::DeclaredTooLarge { most: 1_073_741_824, .. }),
            most: 2 * MIB,
        },
        Case {
            what: "raw idx declaring 60,000 images, holding 10",
            reader: Reader::MnistImages { gz: false, bytes: raw_lying_dims },
            expect: |e| matches!(e, Error::WrongLength { .. }),
            most: 2 * MIB,
        },
        Case {
            what: "gzipped idx declaring 60,000 images, holding 10",
            reader: Reader::MnistImages { gz: true, bytes: gz_lying_dims },
            expect: |e| matches!(e, Error::DeclaredTooLarge { declared: 47_040_000, .. }),
            most: 2 * MIB,
        },
        Case {
            what: "gzipped idx declaring 100 images, holding 10 of noise",
            reader: Reader::MnistImages { gz: true, bytes: gz_short },
            expect: |e| matches!(e, Error::WrongLength { expected: 78_400, found: 7840, .. }),
            most: 2 * MIB,
        },
        // Both headers wrap to the 8 KiB file they sit in: unchecked arithmetic opens them.
        Case {
            what: "record header whose sample size wraps (shape [2^62 + 1, 4]: 4 elements)",
            reader: Reader::Records(record_header(1, &[(1 << 62) + 1, 4])),
            expect: |e| matches!(e, Error::BadRecordFile { reason, .. } if reason.contains("overflow")),
            most: MIB,
        },
        Case {
            what: "record header whose file size wraps (records × 12 bytes ≡ 4096)",
            reader: Reader::Records(record_header(3_074_457_345_618_258_944, &[1])),
            expect: |e| matches!(e, Error::BadRecordFile { reason, .. } if reason.contains("overflow")),
            most: MIB,
        },
    ]
}

fn write(path: &Path, bytes: &[u8]) -> TestResult {
    std::fs::write(path, bytes)?;
    Ok(())
}

#[test]
fn hostile_files_are_typed_errors_naming_the_file_within_bounded_memory() -> TestResult {
    let dir = tempfile::tempdir()?;
    // The measure itself: a sound file of 10,000 images is held whole (7.8 MB at least).
    {
        let sound = dir.path().join("sound");
        std::fs::create_dir(&sound)?;
        let mut b = image_header(10_000);
        b.extend(std::iter::repeat_n(3u8, 10_000 * 784));
        write(&sound.join("t10k-images-idx3-ubyte.gz"), &gzip(&b))?;
        write(&sound.join("t10k-labels-idx1-ubyte.gz"), &labels(10_000))?;
        PEAK.store(HELD.load(Ordering::Relaxed), Ordering::Relaxed);
        let base = HELD.load(Ordering::Relaxed);
        let m = Mnist::load(&sound, Split::Test, Verify::Skip)?;
        let peak = PEAK.load(Ordering::Relaxed) - base;
        assert!(peak >= m.pixels().len(), "the counter missed the load: {peak} bytes");
    }
    for (i, case) in cases().into_iter().enumerate() {
        let case_dir = dir.path().join(i.to_string());
        std::fs::create_dir(&case_dir)?;
        let (file, bytes) = match case.reader {
            Reader::MnistImages { gz: true, bytes } => ("t10k-images-idx3-ubyte.gz", bytes),
            Reader::MnistImages { gz: false, bytes } => ("t10k-images-idx3-ubyte", bytes),
            Reader::Records(bytes) => ("hostile.rec", bytes),
        };
        write(&case_dir.join(file), &bytes)?;
        write(&case_dir.join("t10k-labels-idx1-ubyte.gz"), &labels(10))?;
        drop(bytes);
        let base = HELD.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let result = if file.ends_with(".rec") {
            RecordFile::open(case_dir.join(file), Access::Buffered).map(drop)
        } else {
            Mnist::load(&case_dir, Split::Test, Verify::Skip).map(drop)
        };
        let peak = PEAK.load(Ordering::Relaxed) - base;
        match result {
            Ok(_) => panic!("{}: read a hostile file", case.what),
            Err(e) => {
                assert!((case.expect)(&e), "{}: unexpected error {e}", case.what);
                assert!(e.to_string().contains(file), "{}: {e} does not name {file}", case.what);
            }
        }
        assert!(peak <= case.most, "{}: {peak} bytes held at the peak", case.what);
        eprintln!("{}: peak {peak} bytes", case.what);
    }
    Ok(())
}

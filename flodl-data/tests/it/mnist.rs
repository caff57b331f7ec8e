//! The MNIST reader on the vendored files and on corrupted copies of them.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use flodl_data::mnist::{self, vendored_dir};
use flodl_data::{Dataset, Error, HostBatch, Mnist, Result, Split, Subset, Verify};
use flodl_tensor::Device;

const FILES: [&str; 4] = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
];

fn gunzip(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    let file = std::fs::read(path).unwrap_or_default();
    flate2::read::GzDecoder::new(&file[..]).read_to_end(&mut out).unwrap_or_default();
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let _ = e.write_all(bytes);
    e.finish().unwrap_or_default()
}

/// A temporary copy of the vendored directory (test split only, plus SHA256SUMS).
fn copy_test_split() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir().map_err(|source| Error::Io { path: "tempdir".into(), source })?;
    for name in [FILES[2], FILES[3], "SHA256SUMS"] {
        let from = vendored_dir().join(name);
        std::fs::copy(&from, dir.path().join(name))
            .map_err(|source| Error::Io { path: from, source })?;
    }
    Ok(dir)
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|source| Error::Io { path: path.to_owned(), source })
}

#[test]
fn vendored_splits_load_with_checksums_and_known_contents() -> Result<()> {
    let cases = [
        (
            Split::Train,
            60_000,
            [5, 0, 4, 1, 9, 2, 1, 3, 1, 4],
            [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949],
            "train",
        ),
        (
            Split::Test,
            10_000,
            [7, 2, 1, 0, 4, 1, 4, 9, 5, 9],
            [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009],
            "t10k",
        ),
    ];
    for (split, count, first, histogram, prefix) in cases {
        let m = Mnist::load(vendored_dir(), split, Verify::Sha256)?;
        assert_eq!(m.len(), count);
        assert_eq!(m.split(), split);
        assert_eq!(&m.labels()[..10], &first);
        let mut h = [0usize; 10];
        for &l in m.labels() {
            h[l as usize] += 1;
        }
        assert_eq!(h, histogram, "{split:?}");
        // Pixels against an f64 reference decoded independently from the raw idx bytes.
        let raw = gunzip(&vendored_dir().join(format!("{prefix}-images-idx3-ubyte.gz")));
        assert_eq!(raw.len(), 16 + count * mnist::PIXELS);
        assert_eq!(m.pixels(), &raw[16..], "{split:?}");
        // A fetched batch holds them as f32 in [0, 1].
        let mut batch = HostBatch::new(m.layout(), Device::Cpu);
        let rows = [0, count / 2, count - 1];
        m.fetch(&rows, &mut batch)?;
        for (row, &index) in rows.iter().enumerate() {
            let p = mnist::PIXELS;
            let got = &batch.f32(Mnist::IMAGE)?[row * p..(row + 1) * p];
            for (i, (&got, &byte)) in got.iter().zip(&raw[16 + index * p..]).enumerate() {
                let want = f64::from(byte) / 255.0;
                assert!((f64::from(got) - want).abs() < 1e-7, "{split:?} {index}/{i}: {got}");
            }
        }
    }
    Ok(())
}

#[test]
fn fetch_gathers_the_requested_samples() -> Result<()> {
    let m = Mnist::load(vendored_dir(), Split::Test, Verify::Skip)?;
    let indices = [9_999usize, 0, 5, 5, 1234];
    let mut batch = HostBatch::new(m.layout(), Device::Cpu);
    m.fetch(&indices, &mut batch)?;
    assert_eq!(batch.len(), indices.len());
    for (row, &i) in indices.iter().enumerate() {
        let p = mnist::PIXELS;
        let want: Vec<f32> =
            m.pixels()[i * p..(i + 1) * p].iter().map(|&b| f32::from(b) / 255.0).collect();
        assert_eq!(batch.f32(Mnist::IMAGE)?[row * p..(row + 1) * p], want[..]);
        assert_eq!(batch.i32(Mnist::LABEL)?[row], m.labels()[i]);
    }
    assert!(matches!(
        m.fetch(&[10_000], &mut batch),
        Err(Error::IndexOutOfRange { index: 10_000, len: 10_000 })
    ));
    let sub = Subset::first(m.clone(), 100);
    assert_eq!(sub.len(), 100);
    sub.fetch(&[99, 3], &mut batch)?;
    assert_eq!(batch.i32(Mnist::LABEL)?, &[m.labels()[99], m.labels()[3]]);
    assert!(sub.fetch(&[100], &mut batch).is_err());
    assert!(Subset::new(m, vec![10_000]).is_err());
    Ok(())
}

#[test]
fn raw_idx_files_load_like_gzipped_ones() -> Result<()> {
    let dir = copy_test_split()?;
    for name in [FILES[2], FILES[3]] {
        let raw = gunzip(&dir.path().join(name));
        std::fs::remove_file(dir.path().join(name))
            .map_err(|source| Error::Io { path: name.into(), source })?;
        write(&dir.path().join(name.trim_end_matches(".gz")), &raw)?;
    }
    let raw = Mnist::load(dir.path(), Split::Test, Verify::Skip)?;
    let gz = Mnist::load(vendored_dir(), Split::Test, Verify::Skip)?;
    assert_eq!(raw.pixels(), gz.pixels());
    assert_eq!(raw.labels(), gz.labels());
    // The raw files are not listed in SHA256SUMS.
    assert!(matches!(
        Mnist::load(dir.path(), Split::Test, Verify::Sha256),
        Err(Error::MissingChecksum { .. })
    ));
    Ok(())
}

/// A corruption of the test split's images or labels and the error it must give.
struct Corruption {
    what: &'static str,
    file: &'static str,
    verify: Verify,
    // Rewrites the decompressed idx bytes; `None` means edit the .gz bytes instead.
    edit_idx: Option<fn(&mut Vec<u8>)>,
    edit_gz: Option<fn(&mut Vec<u8>)>,
    expect: fn(&Error) -> bool,
}

#[test]
fn corrupted_copies_fail_with_typed_errors_naming_the_file() -> Result<()> {
    let images = FILES[2];
    let labels = FILES[3];
    let cases = [
        Corruption {
            what: "flipped byte, sha256 on",
            file: images,
            verify: Verify::Sha256,
            edit_idx: None,
            edit_gz: Some(|b| b[100] ^= 0xff),
            expect: |e| matches!(e, Error::Checksum { .. }),
        },
        Corruption {
            what: "corrupt deflate stream",
            file: images,
            verify: Verify::Skip,
            edit_idx: None,
            edit_gz: Some(|b| {
                for x in &mut b[20..200] {
                    *x = 0xff;
                }
            }),
            expect: |e| matches!(e, Error::Decompress { .. } | Error::WrongLength { .. }),
        },
        Corruption {
            what: "truncated gzip",
            file: labels,
            verify: Verify::Skip,
            edit_idx: None,
            edit_gz: Some(|b| b.truncate(b.len() / 2)),
            expect: |e| matches!(e, Error::Decompress { .. } | Error::WrongLength { .. }),
        },
        Corruption {
            what: "bad magic",
            file: images,
            verify: Verify::Skip,
            edit_idx: Some(|b| b[3] = 0x01),
            edit_gz: None,
            expect: |e| matches!(e, Error::BadMagic { found: 0x801, expected: 0x803, .. }),
        },
        Corruption {
            what: "bad dimensions",
            file: images,
            verify: Verify::Skip,
            edit_idx: Some(|b| b[11] = 27),
            edit_gz: None,
            expect: |e| matches!(e, Error::BadDims { .. }),
        },
        Corruption {
            what: "data shorter than the header says",
            file: images,
            verify: Verify::Skip,
            edit_idx: Some(|b| b.truncate(b.len() - 1)),
            edit_gz: None,
            expect: |e| matches!(e, Error::WrongLength { .. }),
        },
        Corruption {
            what: "trailing bytes",
            file: labels,
            verify: Verify::Skip,
            edit_idx: Some(|b| b.push(3)),
            edit_gz: None,
            expect: |e| matches!(e, Error::WrongLength { .. }),
        },
        Corruption {
            what: "forged huge count",
            file: images,
            verify: Verify::Skip,
            edit_idx: Some(|b| b[4..8].copy_from_slice(&u32::MAX.to_be_bytes())),
            edit_gz: None,
            expect: |e| matches!(e, Error::DeclaredTooLarge { .. }),
        },
        Corruption {
            what: "fewer labels than images",
            file: labels,
            verify: Verify::Skip,
            edit_idx: Some(|b| {
                b.truncate(b.len() - 10);
                b[4..8].copy_from_slice(&9_990u32.to_be_bytes());
            }),
            edit_gz: None,
            expect: |e| {
                matches!(e, Error::CountMismatch { image_count: 10_000, label_count: 9_990, .. })
            },
        },
        Corruption {
            what: "label out of range",
            file: labels,
            verify: Verify::Skip,
            edit_idx: Some(|b| b[8 + 17] = 10),
            edit_gz: None,
            expect: |e| matches!(e, Error::BadLabel { index: 17, label: 10, .. }),
        },
        Corruption {
            what: "empty file",
            file: labels,
            verify: Verify::Skip,
            edit_idx: Some(|b| b.clear()),
            edit_gz: None,
            expect: |e| matches!(e, Error::WrongLength { .. }),
        },
    ];
    for case in &cases {
        let dir = copy_test_split()?;
        let path: PathBuf = dir.path().join(case.file);
        let mut gz =
            std::fs::read(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
        if let Some(edit) = case.edit_gz {
            edit(&mut gz);
        }
        if let Some(edit) = case.edit_idx {
            let mut idx = gunzip(&path);
            edit(&mut idx);
            gz = gzip(&idx);
        }
        write(&path, &gz)?;
        match Mnist::load(dir.path(), Split::Test, case.verify) {
            Ok(_) => panic!("{}: loaded a corrupted copy", case.what),
            Err(e) => {
                assert!((case.expect)(&e), "{}: unexpected error {e}", case.what);
                let message = e.to_string();
                assert!(
                    message.contains(case.file),
                    "{}: {message:?} does not name the file",
                    case.what
                );
            }
        }
    }
    // A missing file names itself too.
    let dir = copy_test_split()?;
    std::fs::remove_file(dir.path().join(labels))
        .map_err(|source| Error::Io { path: labels.into(), source })?;
    let e = Mnist::load(dir.path(), Split::Test, Verify::Skip).err();
    assert!(matches!(&e, Some(Error::Io { path, .. }) if path.ends_with("t10k-labels-idx1-ubyte")));
    Ok(())
}

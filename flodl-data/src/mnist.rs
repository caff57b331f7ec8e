//! The MNIST handwritten digits, read from idx files (gzipped or raw).

use std::path::{Path, PathBuf};

use flodl_tensor::DType;

use crate::batch::HostBatch;
use crate::checksum;
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::idx::{self, IMAGE_SIDE};
use crate::in_memory::{InMemory, Values};
use crate::layout::{Field, SampleLayout};

/// Which half of MNIST to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// The 60,000 training samples (`train-*`).
    Train,
    /// The 10,000 test samples (`t10k-*`).
    Test,
}

impl Split {
    fn prefix(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "t10k",
        }
    }
}

/// Whether to check the files' sha256 against the directory's `SHA256SUMS` before decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verify {
    /// Check every file against `SHA256SUMS` (which must list it).
    Sha256,
    /// Trust the files (the idx header, length and labels are still validated).
    Skip,
}

/// Number of classes (digits 0–9).
pub const CLASSES: usize = 10;

/// Pixels per image (28 × 28).
pub const PIXELS: usize = (IMAGE_SIDE * IMAGE_SIDE) as usize;

/// The environment variable that overrides [`vendored_dir`].
pub const DIR_ENV: &str = "FLODL_MNIST_DIR";

/// The directory of the MNIST files vendored with flodl (`data/mnist/` at the workspace root),
/// or the value of `FLODL_MNIST_DIR` when it is set and not empty.
pub fn vendored_dir() -> PathBuf {
    match std::env::var_os(DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist"),
    }
}

/// The MNIST images and labels of one split, in host memory.
///
/// Layout: field 0 `image`, f32 `[784]` (a 28 × 28 image flattened row-major, pixel / 255, so in
/// `[0, 1]`); field 1 `label`, i32 scalar in `0..10`.
#[derive(Debug, Clone)]
pub struct Mnist {
    data: InMemory,
    split: Split,
}

impl Mnist {
    /// Index of the image field.
    pub const IMAGE: usize = 0;
    /// Index of the label field.
    pub const LABEL: usize = 1;

    /// Loads `split` from `dir`, which holds `<prefix>-images-idx3-ubyte[.gz]` and
    /// `<prefix>-labels-idx1-ubyte[.gz]` (`prefix` = `train` or `t10k`; the `.gz` file is used
    /// when both exist) and, for [`Verify::Sha256`], `SHA256SUMS`.
    ///
    /// Each file is read once, checked, and decoded while decompressing (u8 → f32 in one pass);
    /// images and labels are decoded in parallel. On any error nothing is returned.
    ///
    /// # Errors
    /// [`Error::Io`] for a missing or unreadable file; [`Error::Checksum`] or
    /// [`Error::MissingChecksum`] under [`Verify::Sha256`]; [`Error::Decompress`],
    /// [`Error::BadMagic`], [`Error::BadDims`], [`Error::WrongLength`] or [`Error::BadLabel`]
    /// for a corrupt file; [`Error::CountMismatch`] when images and labels differ in number.
    /// Every error names the file.
    pub fn load(dir: impl AsRef<Path>, split: Split, verify: Verify) -> Result<Self> {
        let dir = dir.as_ref();
        let images_path = locate(dir, &format!("{}-images-idx3-ubyte", split.prefix()));
        let labels_path = locate(dir, &format!("{}-labels-idx1-ubyte", split.prefix()));
        let sums = dir.join("SHA256SUMS");
        let load_images = || -> Result<(usize, Vec<f32>)> {
            let bytes = read(&images_path)?;
            if verify == Verify::Sha256 {
                checksum::verify(&bytes, &images_path, &sums)?;
            }
            idx::read_images(&bytes, &images_path)
        };
        let load_labels = || -> Result<Vec<i32>> {
            let bytes = read(&labels_path)?;
            if verify == Verify::Sha256 {
                checksum::verify(&bytes, &labels_path, &sums)?;
            }
            idx::read_labels(&bytes, &labels_path, CLASSES as u8)
        };
        let (images, labels) = std::thread::scope(|s| {
            let labels = s.spawn(load_labels);
            let images = load_images();
            let labels = labels.join().unwrap_or(Err(Error::WorkerLost { role: "mnist" }));
            (images, labels)
        });
        let (n, images) = images?;
        let labels = labels?;
        if labels.len() != n {
            return Err(Error::CountMismatch {
                images: images_path,
                image_count: n,
                labels: labels_path,
                label_count: labels.len(),
            });
        }
        let data = InMemory::new(Self::layout(), vec![Values::F32(images), Values::I32(labels)])?;
        Ok(Self { data, split })
    }

    /// The layout of an MNIST sample.
    pub fn layout() -> SampleLayout {
        let fields =
            vec![Field::new("image", &[PIXELS], DType::F32), Field::new("label", &[], DType::I32)];
        // Two distinct, non-empty f32/i32 fields: a valid layout.
        SampleLayout::trusted(fields)
    }

    /// The split loaded.
    pub fn split(&self) -> Split {
        self.split
    }

    /// All images, `len × 784` row-major, in `[0, 1]`.
    pub fn images(&self) -> &[f32] {
        match self.data.values(Self::IMAGE) {
            Ok(Values::F32(v)) => v,
            _ => &[],
        }
    }

    /// All labels, `len` values in `0..10`.
    pub fn labels(&self) -> &[i32] {
        match self.data.values(Self::LABEL) {
            Ok(Values::I32(v)) => v,
            _ => &[],
        }
    }
}

impl Dataset for Mnist {
    fn len(&self) -> usize {
        self.data.len()
    }

    fn layout(&self) -> &SampleLayout {
        self.data.layout()
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> Result<()> {
        self.data.fetch(indices, out)
    }
}

/// `dir/<stem>.gz` when it exists, else `dir/<stem>`.
fn locate(dir: &Path, stem: &str) -> PathBuf {
    let gz = dir.join(format!("{stem}.gz"));
    if gz.is_file() { gz } else { dir.join(stem) }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io { path: path.to_owned(), source })
}

//! The MNIST handwritten digits, read from idx files (gzipped or raw).

use std::path::{Path, PathBuf};

use flodl_tensor::DType;

use crate::batch::HostBatch;
use crate::checksum;
use crate::dataset::{Dataset, check_indices};
use crate::error::{Error, Result};
pub use crate::idx::MAX_DATA_BYTES;
use crate::idx::{self, IMAGE_SIDE};
use crate::in_memory::gather;
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
/// `[0, 1]`); field 1 `label`, i32 scalar in `0..10`. The pixels are held as the file's bytes
/// (a quarter of f32's memory: 47 MB for the training set, not 188 MB) and turned into f32 per
/// fetched batch.
#[derive(Debug, Clone)]
pub struct Mnist {
    layout: SampleLayout,
    pixels: Vec<u8>,
    labels: Vec<i32>,
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
    /// Each file is read once as a stream, hashed and decoded as it goes; images and labels are
    /// decoded in parallel. What a file declares is checked before memory is asked for it (see
    /// [`MAX_DATA_BYTES`]). On any error nothing is returned.
    ///
    /// # Errors
    /// [`Error::Io`] for a missing or unreadable file; [`Error::Checksum`] or
    /// [`Error::MissingChecksum`] under [`Verify::Sha256`] (a checksum that fails is reported
    /// before what it explains); [`Error::Decompress`], [`Error::BadMagic`], [`Error::BadDims`],
    /// [`Error::DeclaredTooLarge`], [`Error::WrongLength`] or [`Error::BadLabel`] for a corrupt
    /// or hostile file; [`Error::CountMismatch`] when images and labels differ in number.
    /// Every error names the file.
    pub fn load(dir: impl AsRef<Path>, split: Split, verify: Verify) -> Result<Self> {
        let dir = dir.as_ref();
        let images_path = locate(dir, &format!("{}-images-idx3-ubyte", split.prefix()));
        let labels_path = locate(dir, &format!("{}-labels-idx1-ubyte", split.prefix()));
        let sums = dir.join("SHA256SUMS");
        let hash = verify == Verify::Sha256;
        let checked = |path: &Path, reading: idx::Reading| -> Result<idx::IdxData> {
            // A file read to its end has a digest; one that could not be has an error.
            if hash && let Some(found) = &reading.sha256 {
                checksum::verify(found, path, &sums)?;
            }
            reading.data
        };
        let (images, labels) = std::thread::scope(|s| {
            let labels = s.spawn(|| {
                checked(&labels_path, idx::read_labels(&labels_path, CLASSES as u8, hash))
            });
            let images = checked(&images_path, idx::read_images(&images_path, hash));
            let labels = labels.join().unwrap_or(Err(Error::WorkerLost { role: "mnist" }));
            (images, labels)
        });
        let images = images?;
        let labels = labels?;
        let n = images.dims[0] as usize;
        if labels.values.len() != n {
            return Err(Error::CountMismatch {
                images: images_path,
                image_count: n,
                labels: labels_path,
                label_count: labels.values.len(),
            });
        }
        let labels = labels.values.into_iter().map(i32::from).collect();
        Ok(Self { layout: Self::layout(), pixels: images.values, labels, split })
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

    /// All images as the file's bytes, `len × 784` row-major, 0 (white) to 255 (black); a
    /// fetched batch holds them as f32, pixel / 255.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// All labels, `len` values in `0..10`.
    pub fn labels(&self) -> &[i32] {
        &self.labels
    }
}

impl Dataset for Mnist {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn layout(&self) -> &SampleLayout {
        &self.layout
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> Result<()> {
        check_indices(indices, self.labels.len())?;
        out.prepare(&self.layout, indices.len())?;
        let images = out.f32_mut(Self::IMAGE)?;
        for (row, &i) in images.chunks_exact_mut(PIXELS).zip(indices) {
            let src = &self.pixels[i * PIXELS..(i + 1) * PIXELS];
            for (d, &p) in row.iter_mut().zip(src) {
                *d = f32::from(p) / 255.0;
            }
        }
        gather(&self.labels, 1, indices, out.i32_mut(Self::LABEL)?);
        Ok(())
    }
}

/// `dir/<stem>.gz` when it exists, else `dir/<stem>`.
fn locate(dir: &Path, stem: &str) -> PathBuf {
    let gz = dir.join(format!("{stem}.gz"));
    if gz.is_file() { gz } else { dir.join(stem) }
}

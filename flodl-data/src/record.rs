//! Record files: a dataset on disk whose samples are read with real I/O on every fetch, and the
//! writer that makes one from any [`Dataset`].
//!
//! # Format (version 1; integers little-endian)
//!
//! ```text
//! 0       8 bytes   magic "FLODLREC"
//! 8       u32       version (1)
//! 12      u32       H, the bytes of the header body
//! 16      H bytes   body: u64 samples, u32 fields, then per field: u16 name length, the UTF-8
//!                   name, u8 dtype (0 f32, 1 i32), u8 dimensions, u64 per dimension
//! 16+H    8 bytes   the first 8 bytes of sha256 over bytes 0..16+H
//!         zeros up to 4096, where the records start
//! 4096    record i at 4096 + i × stride, stride = sample bytes + 8: every field's values in
//!         layout order (4 bytes each), then the first 8 bytes of sha256 over those values and
//!         i as u64 (so a record written at the wrong place fails its check too)
//!         zeros up to a multiple of 4096 (so an aligned direct read never runs past the end)
//! ```
//!
//! The index is positional: record `i`'s offset is computed from the stride, never stored.
//! Reads go through the page cache ([`Access::Buffered`]) or around it ([`Access::Direct`],
//! `O_DIRECT` on Linux: every fetch then reads the disk, for honest benchmarks).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use flodl_tensor::{DType, Device};
use sha2::{Digest, Sha256};

use crate::batch::{HostBatch, View, ViewMut};
use crate::dataset::{Dataset, FetchCost, check_indices};
use crate::error::{Error, Result};
use crate::layout::{Field, SampleLayout};

const MAGIC: &[u8; 8] = b"FLODLREC";
const VERSION: u32 = 1;
/// Where the records start, and the alignment of direct reads and of the file's end.
const BLOCK: usize = 4096;
/// Bytes of a record's checksum.
const SUM: usize = 8;
/// Samples the writer fetches from its source per call.
const WRITE_CHUNK: usize = 1024;

/// How a [`RecordFile`] reads its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Access {
    /// Through the operating system's page cache.
    #[default]
    Buffered,
    /// Around the page cache (`O_DIRECT`, Linux only): block-aligned reads straight from the
    /// device, so repeated fetches of a sample cost a disk read each time.
    Direct,
}

/// A dataset stored in a record file (the format is laid out in the docs of its source file, `record.rs`), read with one
/// positioned read per sample on every fetch, every record checked against its checksum.
#[derive(Debug)]
pub struct RecordFile {
    path: PathBuf,
    file: File,
    layout: SampleLayout,
    len: usize,
    stride: usize,
    access: Access,
}

/// The first 8 bytes of sha256 over `parts`.
fn sum8(parts: &[&[u8]]) -> [u8; SUM] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    let d = h.finalize();
    let mut out = [0u8; SUM];
    out.copy_from_slice(&d[..SUM]);
    out
}

/// The header of a file holding `samples` samples of `layout`, checksum included.
fn header(layout: &SampleLayout, samples: u64) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&samples.to_le_bytes());
    body.extend_from_slice(&(layout.fields().len() as u32).to_le_bytes());
    for f in layout.fields() {
        body.extend_from_slice(&(f.name.len() as u16).to_le_bytes());
        body.extend_from_slice(f.name.as_bytes());
        body.push(u8::from(f.dtype == DType::I32));
        body.push(f.shape.len() as u8);
        for &d in &f.shape {
            body.extend_from_slice(&(d as u64).to_le_bytes());
        }
    }
    let mut out = Vec::with_capacity(16 + body.len() + SUM);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    let sum = sum8(&[&out]);
    out.extend_from_slice(&sum);
    out
}

/// A little-endian reader over a header body that fails with a reason instead of panicking.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("the header ends early".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> std::result::Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
}

/// Parses a header (the file's first block): the layout and the sample count.
fn parse_header(block: &[u8]) -> std::result::Result<(SampleLayout, u64), String> {
    let mut c = Cursor(block);
    if c.take(8)? != MAGIC {
        return Err("bad magic".into());
    }
    let version = c.u32()?;
    if version != VERSION {
        return Err(format!("version {version}, this reader knows {VERSION}"));
    }
    let body_len = c.u32()? as usize;
    if body_len > BLOCK - 16 - SUM {
        return Err(format!("a header body of {body_len} bytes does not fit the first block"));
    }
    let sum = sum8(&[&block[..16 + body_len]]);
    if block[16 + body_len..16 + body_len + SUM] != sum {
        return Err("the header fails its checksum".into());
    }
    let mut c = Cursor(&block[16..16 + body_len]);
    let samples = c.u64()?;
    let count = c.u32()?;
    let mut fields = Vec::new();
    for _ in 0..count {
        let n = c.u16()? as usize;
        let name = std::str::from_utf8(c.take(n)?).map_err(|e| format!("field name: {e}"))?;
        let name = name.to_owned();
        let dtype = match c.u8()? {
            0 => DType::F32,
            1 => DType::I32,
            other => return Err(format!("field {name:?}: unknown dtype code {other}")),
        };
        let dims = c.u8()?;
        let mut shape = Vec::with_capacity(usize::from(dims));
        for _ in 0..dims {
            shape.push(usize::try_from(c.u64()?).map_err(|_| "a dimension overflows")?);
        }
        fields.push(Field::new(name, &shape, dtype));
    }
    let layout = SampleLayout::new(fields).map_err(|e| e.to_string())?;
    Ok((layout, samples))
}

/// A buffer of `len` bytes whose start is aligned to [`BLOCK`] (for direct reads).
struct Aligned {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Self {
        let raw = vec![0u8; len + BLOCK];
        let start = raw.as_ptr().align_offset(BLOCK).min(BLOCK);
        Self { raw, start, len }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }

    fn bytes(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl RecordFile {
    /// Opens the record file at `path`, reading it as `access` says.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be opened or read (a filesystem that refuses
    /// `O_DIRECT` included); [`Error::BadRecordFile`] when its header is not a valid version-1
    /// header or its size does not fit the records it declares.
    pub fn open(path: impl AsRef<Path>, access: Access) -> Result<Self> {
        let path = path.as_ref().to_owned();
        let io = |source| Error::Io { path: path.clone(), source };
        let file = open_for(&path, access).map_err(io)?;
        let mut block = Aligned::new(BLOCK);
        file.read_exact_at(block.bytes_mut(), 0).map_err(io)?;
        let bad = |reason| Error::BadRecordFile { path: path.clone(), reason };
        let (layout, samples) = parse_header(block.bytes()).map_err(bad)?;
        let len = usize::try_from(samples).map_err(|_| bad("too many samples".into()))?;
        // Every size from the header in checked arithmetic: a forged count or shape is an error,
        // never a size that wrapped.
        let stride = layout.sample_bytes() + SUM;
        let size = file.metadata().map_err(io)?.len();
        let need = len
            .checked_mul(stride)
            .and_then(|b| b.checked_add(BLOCK))
            .and_then(|b| b.checked_next_multiple_of(BLOCK))
            .and_then(|b| u64::try_from(b).ok())
            .ok_or_else(|| {
                bad(format!("{len} records of {stride} bytes overflow a file's size"))
            })?;
        if size != need {
            return Err(bad(format!("{size} bytes, {len} records of {stride} need {need}")));
        }
        Ok(Self { path, file, layout, len, stride, access })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How the file is read.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Byte offset of record `index` in the file.
    pub fn offset_of(&self, index: usize) -> u64 {
        (BLOCK + index * self.stride) as u64
    }

    /// Reads record `index` into `scratch` and returns its bytes (values then checksum),
    /// checked.
    fn read_record<'a>(&self, index: usize, scratch: &'a mut Aligned) -> Result<&'a [u8]> {
        let offset = self.offset_of(index);
        let io = |source| Error::Io { path: self.path.clone(), source };
        let (start, skip) = match self.access {
            Access::Buffered => (offset, 0),
            Access::Direct => {
                let start = offset / BLOCK as u64 * BLOCK as u64;
                (start, (offset - start) as usize)
            }
        };
        let span = match self.access {
            Access::Buffered => self.stride,
            Access::Direct => (skip + self.stride).next_multiple_of(BLOCK),
        };
        if scratch.len != span {
            *scratch = Aligned::new(span);
        }
        self.file.read_exact_at(scratch.bytes_mut(), start).map_err(io)?;
        let record = &scratch.bytes()[skip..skip + self.stride];
        let (values, sum) = record.split_at(self.stride - SUM);
        if sum8(&[values, &(index as u64).to_le_bytes()]) != sum {
            return Err(Error::CorruptRecord { path: self.path.clone(), index, offset });
        }
        Ok(record)
    }
}

#[cfg(target_os = "linux")]
fn open_for(path: &Path, access: Access) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = OpenOptions::new();
    opts.read(true);
    if access == Access::Direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    opts.open(path)
}

#[cfg(not(target_os = "linux"))]
fn open_for(path: &Path, access: Access) -> std::io::Result<File> {
    if access == Access::Direct {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "direct reads (O_DIRECT) are available on Linux only",
        ));
    }
    OpenOptions::new().read(true).open(path)
}

impl Dataset for RecordFile {
    fn len(&self) -> usize {
        self.len
    }

    fn layout(&self) -> &SampleLayout {
        &self.layout
    }

    fn fetch(&self, indices: &[usize], out: &mut HostBatch) -> Result<()> {
        check_indices(indices, self.len)?;
        out.prepare(&self.layout, indices.len())?;
        let widths: Vec<usize> = self.layout.fields().iter().map(Field::numel).collect();
        let mut views = out.views_mut()?;
        let mut scratch = Aligned::new(0);
        for (row, &index) in indices.iter().enumerate() {
            let record = self.read_record(index, &mut scratch)?;
            let mut at = 0;
            for (view, &k) in views.iter_mut().zip(&widths) {
                let bytes = &record[at..at + 4 * k];
                at += 4 * k;
                let words = bytes.chunks_exact(4).map(|w| [w[0], w[1], w[2], w[3]]);
                match view {
                    ViewMut::F32(v) => {
                        for (d, w) in v[row * k..(row + 1) * k].iter_mut().zip(words) {
                            *d = f32::from_le_bytes(w);
                        }
                    }
                    ViewMut::I32(v) => {
                        for (d, w) in v[row * k..(row + 1) * k].iter_mut().zip(words) {
                            *d = i32::from_le_bytes(w);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn fetch_cost(&self) -> FetchCost {
        FetchCost::Storage
    }
}

/// Writes a record file: a header, then the samples of the batches appended, in order. The file
/// is written under a temporary name and renamed into place by [`RecordWriter::finish`], so a
/// record file at its final path is always complete.
#[derive(Debug)]
pub struct RecordWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<File>,
    layout: SampleLayout,
    written: u64,
}

impl RecordWriter {
    /// Starts a record file of samples of `layout` at `path`.
    ///
    /// # Errors
    /// [`Error::Io`] when the temporary file cannot be created or written.
    pub fn create(path: impl AsRef<Path>, layout: &SampleLayout) -> Result<Self> {
        let path = path.as_ref().to_owned();
        let mut tmp = path.clone().into_os_string();
        tmp.push(".partial");
        let tmp = PathBuf::from(tmp);
        let io = |source| Error::Io { path: tmp.clone(), source };
        let file = File::create(&tmp).map_err(io)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let mut first = header(layout, 0);
        if first.len() > BLOCK {
            return Err(Error::InvalidLayout {
                reason: format!("the layout's header takes {} bytes, over {BLOCK}", first.len()),
            });
        }
        first.resize(BLOCK, 0);
        out.write_all(&first).map_err(io)?;
        Ok(Self { path, tmp, out, layout: layout.clone(), written: 0 })
    }

    /// Appends every sample of `batch` (of the writer's layout).
    ///
    /// # Errors
    /// [`Error::LayoutMismatch`] for a batch of another layout; [`Error::Io`] when writing fails.
    pub fn append(&mut self, batch: &HostBatch) -> Result<()> {
        if *batch.layout() != self.layout {
            return Err(Error::LayoutMismatch);
        }
        let widths: Vec<usize> = self.layout.fields().iter().map(Field::numel).collect();
        let views = batch.views()?;
        let mut record = Vec::with_capacity(self.layout.sample_bytes() + SUM);
        for row in 0..batch.len() {
            record.clear();
            for (view, &k) in views.iter().zip(&widths) {
                match view {
                    View::F32(v) => {
                        v[row * k..(row + 1) * k]
                            .iter()
                            .for_each(|x| record.extend_from_slice(&x.to_le_bytes()));
                    }
                    View::I32(v) => {
                        v[row * k..(row + 1) * k]
                            .iter()
                            .for_each(|x| record.extend_from_slice(&x.to_le_bytes()));
                    }
                }
            }
            let sum = sum8(&[&record, &self.written.to_le_bytes()]);
            record.extend_from_slice(&sum);
            self.out.write_all(&record).map_err(|source| self.io(source))?;
            self.written += 1;
        }
        Ok(())
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io { path: self.tmp.clone(), source }
    }

    /// Pads the file, writes the final header, syncs and renames it into place; returns the
    /// number of samples written.
    ///
    /// # Errors
    /// [`Error::Io`] when writing, syncing or renaming fails.
    pub fn finish(mut self) -> Result<u64> {
        let stride = (self.layout.sample_bytes() + SUM) as u64;
        let end = BLOCK as u64 + self.written * stride;
        let pad = end.next_multiple_of(BLOCK as u64) - end;
        self.out.write_all(&vec![0u8; pad as usize]).map_err(|source| self.io(source))?;
        self.out.flush().map_err(|source| self.io(source))?;
        let head = header(&self.layout, self.written);
        let file = self.out.get_mut();
        let done = file
            .seek(SeekFrom::Start(0))
            .and_then(|_| file.write_all(&head))
            .and_then(|()| file.sync_all());
        done.map_err(|source| self.io(source))?;
        std::fs::rename(&self.tmp, &self.path)
            .map_err(|source| Error::Io { path: self.path.clone(), source })?;
        Ok(self.written)
    }
}

/// Writes `dataset` to a record file at `path`, `copies` times over (augmentation as
/// multiplicity): record `c × len + i` is sample `i` after `augment(c, batch)` changed the
/// batch it sits in (pass a function that leaves copy 0 alone to keep the originals). Returns
/// the samples written.
///
/// # Errors
/// The dataset's fetch errors, `augment`'s, and the writer's.
pub fn write_records(
    dataset: &dyn Dataset,
    path: impl AsRef<Path>,
    copies: usize,
    augment: &dyn Fn(usize, &mut HostBatch) -> Result<()>,
) -> Result<u64> {
    let mut writer = RecordWriter::create(path, dataset.layout())?;
    let mut batch = HostBatch::new(dataset.layout(), Device::Cpu);
    let indices: Vec<usize> = (0..dataset.len()).collect();
    for copy in 0..copies {
        for chunk in indices.chunks(WRITE_CHUNK) {
            dataset.fetch(chunk, &mut batch)?;
            augment(copy, &mut batch)?;
            writer.append(&batch)?;
        }
    }
    writer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::in_memory::{InMemory, Values};

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    fn small(n: usize) -> Result<InMemory> {
        let layout = SampleLayout::new(vec![
            Field::new("x", &[3], DType::F32),
            Field::new("y", &[], DType::I32),
        ])?;
        let xs = (0..n * 3).map(|v| v as f32 * 0.5 - 1.0).collect();
        let ys = (0..n as i32).map(|v| v * 7 - 3).collect();
        InMemory::new(layout, vec![Values::F32(xs), Values::I32(ys)])
    }

    /// Written and read back, buffered and direct, every sample of every copy is the source's
    /// (after the copy's augmentation), in any order with repeats.
    #[test]
    fn records_round_trip() -> TestResult {
        let dir = tempfile::tempdir()?;
        let src = small(1500)?;
        let path = dir.path().join("small.fdr");
        let shift = |copy: usize, b: &mut HostBatch| -> Result<()> {
            b.f32_mut(0)?.iter_mut().for_each(|v| *v += copy as f32);
            Ok(())
        };
        assert_eq!(write_records(&src, &path, 2, &shift)?, 3000);
        for access in [Access::Buffered, Access::Direct] {
            let file = match RecordFile::open(&path, access) {
                Ok(f) => f,
                // tmpfs and some overlay filesystems refuse O_DIRECT.
                Err(Error::Io { source, .. }) if access == Access::Direct => {
                    eprintln!("direct reads unavailable here: {source}");
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            assert_eq!(file.len(), 3000);
            assert_eq!(file.layout(), src.layout());
            let picks = [2999, 0, 1499, 1500, 7, 7, 2048];
            let mut got = HostBatch::new(file.layout(), Device::Cpu);
            file.fetch(&picks, &mut got)?;
            let mut want = HostBatch::new(src.layout(), Device::Cpu);
            for (row, &p) in picks.iter().enumerate() {
                src.fetch(&[p % 1500], &mut want)?;
                shift(p / 1500, &mut want)?;
                assert_eq!(&got.f32(0)?[row * 3..row * 3 + 3], want.f32(0)?, "{access:?} {p}");
                assert_eq!(got.i32(1)?[row], want.i32(1)?[0], "{access:?} {p}");
            }
            assert!(matches!(file.fetch(&[3000], &mut got), Err(Error::IndexOutOfRange { .. })));
        }
        Ok(())
    }

    /// A flipped byte in a record is a typed error naming the file, the record and its offset;
    /// the records around it still read. A damaged header or a truncated file is refused.
    #[test]
    fn corrupt_record_is_a_typed_error_naming_file_and_offset() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("c.fdr");
        write_records(&small(100)?, &path, 1, &|_, _| Ok(()))?;
        let stride = 3 * 4 + 4 + SUM;
        // (byte flipped, within record) for a value byte and a checksum byte.
        for (record, within) in [(37usize, 5usize), (99, stride - 1), (0, 0)] {
            let mut bytes = std::fs::read(&path)?;
            let at = BLOCK + record * stride + within;
            bytes[at] ^= 0x40;
            let bad = dir.path().join(format!("bad{record}.fdr"));
            std::fs::write(&bad, &bytes)?;
            let file = RecordFile::open(&bad, Access::Buffered)?;
            let mut out = HostBatch::new(file.layout(), Device::Cpu);
            let neighbour = if record == 0 { 1 } else { record - 1 };
            file.fetch(&[neighbour], &mut out)?;
            match file.fetch(&[neighbour, record], &mut out) {
                Err(Error::CorruptRecord { path: p, index, offset }) => {
                    assert_eq!(p, bad);
                    assert_eq!(index, record);
                    assert_eq!(offset, (BLOCK + record * stride) as u64);
                    let msg = Error::CorruptRecord { path: p, index, offset }.to_string();
                    assert!(msg.contains("bad") && msg.contains(&offset.to_string()), "{msg}");
                }
                other => return Err(format!("record {record}: {other:?}").into()),
            }
        }
        let mut bytes = std::fs::read(&path)?;
        bytes[20] ^= 1;
        std::fs::write(dir.path().join("h.fdr"), &bytes)?;
        let header = RecordFile::open(dir.path().join("h.fdr"), Access::Buffered);
        assert!(matches!(header, Err(Error::BadRecordFile { .. })), "{header:?}");
        let bytes = std::fs::read(&path)?;
        std::fs::write(dir.path().join("t.fdr"), &bytes[..bytes.len() - BLOCK])?;
        let cut = RecordFile::open(dir.path().join("t.fdr"), Access::Buffered);
        assert!(matches!(cut, Err(Error::BadRecordFile { .. })), "{cut:?}");
        Ok(())
    }
}

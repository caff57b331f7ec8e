//! `fdl data write`: MNIST's training images as a record file, optionally several times over
//! with shifted copies (augmentation as multiplicity).

use anyhow::{Context, Result, ensure};
use flodl_data::mnist::{self, Mnist, Split, Verify};
use flodl_data::{HostBatch, write_records};

use crate::args::DataWriteArgs;

/// Side of an MNIST image in pixels.
const SIDE: usize = 28;

/// The pixel offset of copy `c`: none for copy 0, then the eight neighbours at distance 1, then
/// distance 2, and so on, in a fixed order.
pub(crate) fn shift_of(copy: usize) -> (isize, isize) {
    if copy == 0 {
        return (0, 0);
    }
    let ring = 1 + (copy - 1) / 8;
    let k = (copy - 1) % 8;
    let r = ring as isize;
    let dirs = [(-1, -1), (0, -1), (1, -1), (-1, 0), (1, 0), (-1, 1), (0, 1), (1, 1)];
    let (dx, dy) = dirs[k];
    (dx * r, dy * r)
}

/// Shifts every image of `batch` by copy `copy`'s offset (pixels shifted in are 0).
fn shift(copy: usize, batch: &mut HostBatch) -> flodl_data::Result<()> {
    let (dx, dy) = shift_of(copy);
    if (dx, dy) == (0, 0) {
        return Ok(());
    }
    let images = batch.f32_mut(Mnist::IMAGE)?;
    let mut out = vec![0.0f32; mnist::PIXELS];
    for image in images.chunks_exact_mut(mnist::PIXELS) {
        out.fill(0.0);
        for y in 0..SIDE {
            let sy = y as isize - dy;
            if !(0..SIDE as isize).contains(&sy) {
                continue;
            }
            for x in 0..SIDE {
                let sx = x as isize - dx;
                if (0..SIDE as isize).contains(&sx) {
                    out[y * SIDE + x] = image[sy as usize * SIDE + sx as usize];
                }
            }
        }
        image.copy_from_slice(&out);
    }
    Ok(())
}

/// `fdl data write OUT [--data DIR] [--copies N]`.
///
/// # Errors
/// MNIST cannot be loaded, no copies asked for, or the file cannot be written.
pub(crate) fn write(args: &DataWriteArgs) -> Result<()> {
    ensure!(args.copies > 0, "--copies must be at least 1");
    let dir = args.data.clone().unwrap_or_else(mnist::vendored_dir);
    let verify = if dir.join("SHA256SUMS").is_file() { Verify::Sha256 } else { Verify::Skip };
    let train = Mnist::load(&dir, Split::Train, verify)
        .with_context(|| format!("cannot load MNIST from {}", dir.display()))?;
    let n = write_records(&train, &args.out, args.copies, &shift)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    let bytes = std::fs::metadata(&args.out).map(|m| m.len()).unwrap_or(0);
    println!("{}: {n} samples, {:.1} MB", args.out.display(), bytes as f64 / 1e6);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flodl_data::{Access, Dataset, RecordFile, Subset};
    use flodl_tensor::Device;

    #[test]
    fn shifts_are_distinct_and_move_pixels() -> anyhow::Result<()> {
        let shifts: Vec<_> = (0..17).map(shift_of).collect();
        for (i, s) in shifts.iter().enumerate() {
            assert!(!shifts[..i].contains(s), "copy {i} repeats {s:?}");
        }
        let train =
            Subset::first(Mnist::load(mnist::vendored_dir(), Split::Train, Verify::Skip)?, 50);
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("m.fdr");
        write_records(&train, &path, 3, &shift)?;
        let file = RecordFile::open(&path, Access::Buffered)?;
        assert_eq!(file.len(), 150);
        let (mut a, mut b) = (
            HostBatch::new(file.layout(), Device::Cpu),
            HostBatch::new(file.layout(), Device::Cpu),
        );
        train.fetch(&[7], &mut a)?;
        file.fetch(&[7], &mut b)?;
        assert_eq!(a.f32(0)?, b.f32(0)?);
        assert_eq!(a.i32(1)?, b.i32(1)?);
        file.fetch(&[57], &mut b)?;
        assert_eq!(a.i32(1)?, b.i32(1)?);
        assert_ne!(a.f32(0)?, b.f32(0)?, "copy 1 is not shifted");
        Ok(())
    }
}

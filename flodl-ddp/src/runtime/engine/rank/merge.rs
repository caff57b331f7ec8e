//! The merge of a round's average into one parameter tensor of a rank's replica, or into a
//! run of its values (a fragment's piece, `--fragments`).

use flodl_tensor::{Stream, Tensor};

use crate::control::fragment::Piece;
use crate::control::outer::{easgd_blend, overlap_merge};
use crate::{Error, Result};

/// Merges `average`, the values of `piece` of tensor `t`, into them: with `sent` (the values
/// of the rank's snapshot) by [`overlap_merge`], `now + μ·(average − sent)` with μ = `blend`
/// or 1; otherwise pulled towards it by EASGD's α = `blend`, or replaced by it. The tensor's
/// values outside the piece are left as they are, bit for bit.
///
/// # Errors
/// [`Error::Mismatch`](crate::Error) when the piece does not fit the tensor or the values do
/// not fit the piece; a tensor operation's error.
pub(super) fn merge_piece(
    t: &mut Tensor,
    piece: &Piece,
    average: &[f32],
    sent: Option<&[f32]>,
    blend: Option<f32>,
    stream: &Stream,
) -> Result<()> {
    if average.len() != piece.len || piece.start + piece.len > t.numel() {
        return Err(Error::mismatch("an averaged tensor's size", piece.len, average.len()));
    }
    if let Some(s) = sent.filter(|s| s.len() != average.len()) {
        return Err(Error::mismatch("a tensor's size since its snapshot", average.len(), s.len()));
    }
    if !piece.covers(t.numel()) {
        // A run of the tensor: merged by the same rules on its values alone, where they lie
        // for a tensor in host memory, else on a host copy written back whole.
        let merged = |run: &[f32]| -> Result<Vec<f32>> {
            Ok(match (sent, blend) {
                (Some(sent), mix) => overlap_merge(run, average, sent, mix.unwrap_or(1.0)),
                (None, Some(alpha)) => {
                    let mut local = Tensor::from_slice(run, &[run.len()], stream)?;
                    let target = Tensor::from_slice(average, &[average.len()], stream)?;
                    easgd_blend(
                        std::slice::from_mut(&mut local),
                        std::slice::from_ref(&target),
                        alpha,
                        stream,
                    )?;
                    local.to_vec::<f32>(stream)?
                }
                (None, None) => average.to_vec(),
            })
        };
        if let Ok(values) = t.as_mut_slice::<f32>() {
            let run = &mut values[piece.range()];
            let m = merged(run)?;
            run.copy_from_slice(&m);
            return Ok(());
        }
        let mut now = t.to_vec::<f32>(stream)?;
        let run = &mut now[piece.range()];
        let m = merged(run)?;
        run.copy_from_slice(&m);
        return Ok(t.copy_from_host(&now, stream)?);
    }
    if let Some(sent) = sent {
        let now = t.to_vec::<f32>(stream)?;
        let merged = overlap_merge(&now, average, sent, blend.unwrap_or(1.0));
        return Ok(t.copy_from_host(&merged, stream)?);
    }
    match blend {
        Some(alpha) => {
            let target = Tensor::from_slice(average, t.shape(), stream)?;
            easgd_blend(std::slice::from_mut(t), std::slice::from_ref(&target), alpha, stream)?;
        }
        None => t.copy_from_host(average, stream)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flodl_tensor::Device;
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    /// On random tensors cut into random runs, merging the runs one after another gives, bit
    /// for bit, the merge of the whole tensor, by every rule (overlap with μ, EASGD's α, the
    /// average alone); a run merged alone leaves every other value as it was; a run past the
    /// tensor or of other lengths is refused.
    #[test]
    fn runs_merged_one_by_one_are_the_whole_merge() -> std::result::Result<(), String> {
        let stream = Stream::new(Device::Cpu).map_err(|e| e.to_string())?;
        let e = |e: Error| e.to_string();
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(31);
        for case in 0..60 {
            let n = rng.random_range(1..400);
            let vals = |rng: &mut Xoshiro256PlusPlus| -> Vec<f32> {
                (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
            };
            let (now, average, sent) = (vals(&mut rng), vals(&mut rng), vals(&mut rng));
            let mut cuts: Vec<usize> =
                (0..rng.random_range(0..4)).map(|_| rng.random_range(1..=n)).collect();
            cuts.extend([0, n]);
            cuts.sort_unstable();
            cuts.dedup();
            let rule = case % 3;
            let (with_sent, blend) = match rule {
                0 => (true, Some(rng.random_range(0.1f32..1.0))),
                1 => (false, Some(rng.random_range(0.1f32..0.9))),
                _ => (false, None),
            };
            let tensor =
                |v: &[f32]| Tensor::from_slice(v, &[n], &stream).map_err(|e| e.to_string());
            let mut whole = tensor(&now)?;
            let piece = Piece::whole(0, n);
            let s = with_sent.then_some(sent.as_slice());
            merge_piece(&mut whole, &piece, &average, s, blend, &stream).map_err(e)?;
            let mut by_runs = tensor(&now)?;
            for w in cuts.windows(2) {
                let piece = Piece { tensor: 0, start: w[0], len: w[1] - w[0] };
                let mut alone = tensor(&now)?;
                let (a, s) = (&average[piece.range()], with_sent.then(|| &sent[piece.range()]));
                merge_piece(&mut by_runs, &piece, a, s, blend, &stream).map_err(e)?;
                merge_piece(&mut alone, &piece, a, s, blend, &stream).map_err(e)?;
                let alone = alone.to_vec::<f32>(&stream).map_err(|e| e.to_string())?;
                let outside = (0..n).filter(|i| !piece.range().contains(i));
                if outside.clone().any(|i| alone[i].to_bits() != now[i].to_bits()) {
                    return Err(format!("case {case}: a run merged alone moved other values"));
                }
            }
            let (want, got) = (whole.to_vec::<f32>(&stream), by_runs.to_vec::<f32>(&stream));
            let (want, got) = (want.map_err(|e| e.to_string())?, got.map_err(|e| e.to_string())?);
            if want.iter().zip(&got).any(|(w, g)| w.to_bits() != g.to_bits()) {
                return Err(format!(
                    "case {case} (rule {rule}): runs {cuts:?} differ from the whole"
                ));
            }
        }
        let mut t = Tensor::from_slice(&[0.0f32; 8], &[8], &stream).map_err(|e| e.to_string())?;
        let past = Piece { tensor: 0, start: 6, len: 3 };
        assert!(merge_piece(&mut t, &past, &[1.0; 3], None, None, &stream).is_err());
        let short = Piece { tensor: 0, start: 0, len: 3 };
        assert!(merge_piece(&mut t, &short, &[1.0; 2], None, None, &stream).is_err());
        assert!(merge_piece(&mut t, &short, &[1.0; 3], Some(&[1.0; 2]), None, &stream).is_err());
        Ok(())
    }
}

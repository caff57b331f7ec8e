//! The neural-network kernels the reference replica needs: bias, row sums, softmax-NLL, accuracy.
//!
//! They work row by row on `[n, m]` matrices whose rows are short (a batch of activations), so
//! they run on the calling thread.

/// `y[r, :] += bias` for every row `r`.
pub(crate) fn bias_add(y: &mut [f32], bias: &[f32]) {
    if bias.is_empty() {
        return;
    }
    for row in y.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += *b;
        }
    }
}

/// `out[j] = Σ_r x[r, j]`, accumulated in row order.
pub(crate) fn sum_rows(x: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    if out.is_empty() {
        return;
    }
    let m = out.len();
    for row in x.chunks_exact(m) {
        for (o, v) in out.iter_mut().zip(row) {
            *o += *v;
        }
    }
}

/// The first row whose label is outside `0..classes`, with that label.
pub(crate) fn first_bad_label(labels: &[i32], classes: usize) -> Option<(usize, i32)> {
    labels
        .iter()
        .enumerate()
        .find(|(_, l)| usize::try_from(**l).map_or(true, |l| l >= classes))
        .map(|(r, l)| (r, *l))
}

/// Mean over rows of `-log softmax(logits[r])[labels[r]]`; writes its gradient to `dlogits`.
///
/// Labels must be in range (checked by the caller) and `labels.len() ≥ 1`.
pub(crate) fn log_softmax_nll(logits: &[f32], labels: &[i32], dlogits: &mut [f32]) -> f32 {
    let n = labels.len();
    let c = logits.len() / n.max(1);
    let inv_n = 1.0 / n as f32;
    let mut total = 0.0f64;
    for ((row, drow), label) in logits.chunks_exact(c).zip(dlogits.chunks_exact_mut(c)).zip(labels)
    {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for (d, x) in drow.iter_mut().zip(row) {
            let e = (*x - max).exp();
            *d = e;
            sum += e;
        }
        let label = *label as usize;
        total += f64::from(max + sum.ln() - row[label]);
        let scale = inv_n / sum;
        for d in drow.iter_mut() {
            *d *= scale;
        }
        drow[label] -= inv_n;
    }
    (total / n as f64) as f32
}

/// How many rows have their largest logit (first one on ties) at the row's label.
pub(crate) fn argmax_correct(logits: &[f32], labels: &[i32]) -> usize {
    let c = logits.len() / labels.len().max(1);
    logits
        .chunks_exact(c)
        .zip(labels)
        .filter(|(row, label)| {
            let mut best = 0;
            for (j, v) in row.iter().enumerate() {
                if *v > row[best] {
                    best = j;
                }
            }
            best as i32 == **label
        })
        .count()
}

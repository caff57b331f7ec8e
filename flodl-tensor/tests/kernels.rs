//! Every kernel against an f64 reference, on fresh random inputs of awkward sizes, per device.

mod common;

use common::{SIZES, TestResult, check_close, check_scalar, f64s, on_each_device, put, rand_vec};
use flodl_tensor::ops::{self, Transpose};
use flodl_tensor::{DType, Tensor, bf16};

/// f32 element-wise tolerance relative to the reference's magnitude (a few roundings).
const EW_TOL: f64 = 1e-6;

#[test]
fn fill_sets_every_element() -> TestResult {
    on_each_device(|s| {
        for (i, &n) in SIZES.iter().enumerate() {
            let v = rand_vec(1, -10.0, 10.0, 100 + i as u64)?[0];
            let mut t = Tensor::zeros(&[n], DType::F32, s)?;
            ops::fill(&mut t, v, s)?;
            check_close(
                "fill f32",
                &t.to_vec::<f32>(s)?,
                &vec![f64::from(v); n],
                &vec![1.0; n],
                0.0,
            )?;
            let mut h = Tensor::zeros(&[n], DType::Bf16, s)?;
            ops::fill(&mut h, v, s)?;
            let want = bf16::from_f32(v);
            if h.to_vec::<bf16>(s)?.iter().any(|x| x.to_bits() != want.to_bits()) {
                return Err(format!("fill bf16 size {n}: not all {want}").into());
            }
            let mut l = Tensor::zeros(&[n], DType::I32, s)?;
            ops::fill(&mut l, v.round(), s)?;
            if l.to_vec::<i32>(s)?.iter().any(|x| *x != v.round() as i32) {
                return Err(format!("fill i32 size {n}").into());
            }
        }
        Ok(())
    })
}

#[test]
fn scale_axpy_lerp_match_f64() -> TestResult {
    on_each_device(|s| {
        for (i, &n) in SIZES.iter().enumerate() {
            let seed = 10 * i as u64;
            let x = rand_vec(n, -3.0, 3.0, seed)?;
            let y = rand_vec(n, -3.0, 3.0, seed + 1)?;
            let alpha = rand_vec(1, -2.0, 2.0, seed + 2)?[0];
            let (xd, yd, a) = (f64s(&x), f64s(&y), f64::from(alpha));

            let mut t = put(&x, &[n], s)?;
            ops::scale(&mut t, alpha, s)?;
            let want: Vec<f64> = xd.iter().map(|v| a * v).collect();
            let mag: Vec<f64> = want.iter().map(|v| v.abs()).collect();
            check_close("scale", &t.to_vec(s)?, &want, &mag, EW_TOL)?;

            let xt = put(&x, &[n], s)?;
            let mut yt = put(&y, &[n], s)?;
            ops::axpy(alpha, &xt, &mut yt, s)?;
            let want: Vec<f64> = xd.iter().zip(&yd).map(|(x, y)| y + a * x).collect();
            let mag: Vec<f64> = xd.iter().zip(&yd).map(|(x, y)| y.abs() + (a * x).abs()).collect();
            check_close("axpy", &yt.to_vec(s)?, &want, &mag, EW_TOL)?;

            let w = rand_vec(1, 0.0, 1.0, seed + 3)?[0];
            let wd = f64::from(w);
            let mut at = put(&x, &[n], s)?;
            let bt = put(&y, &[n], s)?;
            ops::lerp(&mut at, &bt, w, s)?;
            let want: Vec<f64> = xd.iter().zip(&yd).map(|(a, b)| a + wd * (b - a)).collect();
            let mag: Vec<f64> = xd.iter().zip(&yd).map(|(a, b)| a.abs() + b.abs()).collect();
            check_close("lerp", &at.to_vec(s)?, &want, &mag, EW_TOL)?;
        }
        Ok(())
    })
}

#[test]
fn weighted_sum_matches_f64() -> TestResult {
    on_each_device(|s| {
        for (i, &n) in SIZES.iter().enumerate() {
            for w in [1usize, 2, 3, 8] {
                let seed = 1000 + 100 * i as u64 + 10 * w as u64;
                let xs: Vec<Vec<f32>> = (0..w)
                    .map(|j| rand_vec(n, -5.0, 5.0, seed + j as u64))
                    .collect::<Result<_, _>>()?;
                let weights = rand_vec(w, -1.0, 1.0, seed + 9)?;
                let ts: Vec<Tensor> =
                    xs.iter().map(|x| put(x, &[n], s)).collect::<Result<_, _>>()?;
                let refs: Vec<&Tensor> = ts.iter().collect();
                let mut out = Tensor::zeros(&[n], DType::F32, s)?;
                ops::fill(&mut out, f32::NAN, s)?;
                ops::weighted_sum(&refs, &weights, &mut out, s)?;
                let mut want = vec![0.0f64; n];
                let mut mag = vec![0.0f64; n];
                for (x, wt) in xs.iter().zip(&weights) {
                    for k in 0..n {
                        let term = f64::from(*wt) * f64::from(x[k]);
                        want[k] += term;
                        mag[k] += term.abs();
                    }
                }
                check_close(
                    &format!("weighted_sum W={w} n={n}"),
                    &out.to_vec(s)?,
                    &want,
                    &mag,
                    2.0 * EW_TOL,
                )?;
            }
        }
        Ok(())
    })
}

#[test]
fn casts_round_to_nearest_even_and_back_exactly() -> TestResult {
    on_each_device(|s| {
        for (i, &n) in SIZES.iter().enumerate() {
            let mut x = rand_vec(n, -1e3, 1e3, 500 + i as u64)?;
            // Awkward values: exact ties, the largest finite, infinities, NaN, subnormals.
            let specials = [
                f32::from_bits(0x3f80_8000), // tie, even below: rounds down
                f32::from_bits(0x3f81_8000), // tie, odd below: rounds up
                f32::MAX,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::from_bits(1),
                -0.0,
            ];
            for (slot, v) in x.iter_mut().zip(specials) {
                *slot = v;
            }
            if n > specials.len() {
                x[specials.len()] = f32::NAN;
            }
            let src = put(&x, &[n], s)?;
            let mut h = Tensor::zeros(&[n], DType::Bf16, s)?;
            ops::cast(&src, &mut h, s)?;
            let got = h.to_vec::<bf16>(s)?;
            for (k, (g, v)) in got.iter().zip(&x).enumerate() {
                let want = bf16::from_f32(*v);
                let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
                if !same {
                    return Err(format!("f32->bf16 [{k}] {v}: got {g:?}, want {want:?}").into());
                }
                // Independent check of the rounding against f64: the nearest bf16 neighbour.
                if v.is_finite() && g.is_finite() {
                    let err = (f64::from(g.to_f32()) - f64::from(*v)).abs();
                    if err > f64::from(v.abs()) * 2f64.powi(-8) + 2f64.powi(-134) {
                        return Err(format!("f32->bf16 [{k}] {v}: error {err:e} too large").into());
                    }
                }
            }
            let mut back = Tensor::zeros(&[n], DType::F32, s)?;
            ops::cast(&h, &mut back, s)?;
            for (k, (b, g)) in back.to_vec::<f32>(s)?.iter().zip(&got).enumerate() {
                let want = g.to_f32();
                if b.to_bits() != want.to_bits() && !(b.is_nan() && want.is_nan()) {
                    return Err(format!("bf16->f32 [{k}]: got {b}, want {want}").into());
                }
            }
        }
        Ok(())
    })
}

#[test]
fn relu_and_its_backward_match_reference() -> TestResult {
    on_each_device(|s| {
        for (i, &n) in SIZES.iter().enumerate() {
            let x = rand_vec(n, -1.0, 1.0, 700 + i as u64)?;
            let dy = rand_vec(n, -1.0, 1.0, 800 + i as u64)?;
            let xt = put(&x, &[n], s)?;
            let mut y = Tensor::zeros(&[n], DType::F32, s)?;
            ops::relu(&xt, &mut y, s)?;
            let want: Vec<f64> = x.iter().map(|v| f64::from(v.max(0.0))).collect();
            check_close("relu", &y.to_vec(s)?, &want, &vec![1.0; n], 0.0)?;
            let dyt = put(&dy, &[n], s)?;
            let mut dx = Tensor::zeros(&[n], DType::F32, s)?;
            ops::relu_backward(&dyt, &y, &mut dx, s)?;
            let want: Vec<f64> = x
                .iter()
                .zip(&dy)
                .map(|(x, g)| if *x > 0.0 { f64::from(*g) } else { 0.0 })
                .collect();
            check_close("relu_backward", &dx.to_vec(s)?, &want, &vec![1.0; n], 0.0)?;
        }
        Ok(())
    })
}

#[test]
fn dot_and_norms_match_f64() -> TestResult {
    on_each_device(|s| {
        for (i, &n) in SIZES.iter().enumerate() {
            let a = rand_vec(n, -2.0, 2.0, 900 + i as u64)?;
            let b = rand_vec(n, -2.0, 2.0, 950 + i as u64)?;
            let (at, bt) = (put(&a, &[n], s)?, put(&b, &[n], s)?);
            let (ad, bd) = (f64s(&a), f64s(&b));
            let dot: f64 = ad.iter().zip(&bd).map(|(x, y)| x * y).sum();
            let dmag: f64 = ad.iter().zip(&bd).map(|(x, y)| (x * y).abs()).sum();
            check_scalar("dot", ops::dot(&at, &bt, s)?, dot, dmag, 1e-9)?;
            let na: f64 = ad.iter().map(|x| x * x).sum::<f64>().sqrt();
            check_scalar("l2_norm", ops::l2_norm(&at, s)?, na, na, 1e-9)?;
            let nd: f64 = ad.iter().zip(&bd).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
            check_scalar("l2_norm_diff", ops::l2_norm_diff(&at, &bt, s)?, nd, nd, 1e-9)?;
            let nb: f64 = bd.iter().map(|x| x * x).sum::<f64>().sqrt();
            let g = (na * na + nb * nb).sqrt();
            check_scalar("global_l2_norm", ops::global_l2_norm(&[&at, &bt], s)?, g, g, 1e-9)?;
        }
        check_scalar("global_l2_norm of nothing", ops::global_l2_norm(&[], s)?, 0.0, 1.0, 0.0)?;
        Ok(())
    })
}

#[test]
fn clip_global_norm_scales_only_above_the_limit() -> TestResult {
    on_each_device(|s| {
        for (i, &n) in SIZES.iter().enumerate() {
            let a = rand_vec(n, -1.0, 1.0, 1100 + i as u64)?;
            let b = rand_vec(7, -1.0, 1.0, 1150 + i as u64)?;
            let norm: f64 = a.iter().chain(&b).map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            for (max, clips) in [(norm * 0.5, true), (norm * 2.0, false)] {
                let (mut at, mut bt) = (put(&a, &[n], s)?, put(&b, &[7], s)?);
                let got = ops::clip_global_norm(&mut [&mut at, &mut bt], max as f32, s)?;
                check_scalar("clip pre-norm", got, norm, norm, 1e-9)?;
                let coef = if clips { f64::from(max as f32) / (norm + 1e-6) } else { 1.0 };
                for (t, x) in [(&at, &a), (&bt, &b)] {
                    let want: Vec<f64> = x.iter().map(|v| coef * f64::from(*v)).collect();
                    let mag: Vec<f64> = want.iter().map(|v| v.abs()).collect();
                    check_close("clipped", &t.to_vec(s)?, &want, &mag, EW_TOL)?;
                }
            }
        }
        Ok(())
    })
}

fn gemm_reference(
    a: &[f64],
    ta: bool,
    b: &[f64],
    tb: bool,
    (m, n, k): (usize, usize, usize),
) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let av = if ta { a[p * m + i] } else { a[i * k + p] };
                let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                out[i * n + j] += av * bv;
                mag[i * n + j] += (av * bv).abs();
            }
        }
    }
    (out, mag)
}

#[test]
fn gemm_matches_f64_for_every_transpose() -> TestResult {
    let shapes = [(1, 1, 1), (7, 5, 3), (33, 17, 65), (130, 257, 300), (1, 1023, 7)];
    on_each_device(|s| {
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let seed = 2000 + 10 * i as u64 + 2 * ta as u64 + tb as u64;
                let a = rand_vec(m * k, -1.0, 1.0, seed)?;
                let b = rand_vec(k * n, -1.0, 1.0, seed + 100)?;
                let c0 = rand_vec(m * n, -1.0, 1.0, seed + 200)?;
                let params = rand_vec(2, -2.0, 2.0, seed + 300)?;
                let a_shape = if ta { [k, m] } else { [m, k] };
                let b_shape = if tb { [n, k] } else { [k, n] };
                let (at, bt) = (put(&a, &a_shape, s)?, put(&b, &b_shape, s)?);
                let tr = |t: bool| if t { Transpose::Yes } else { Transpose::No };
                let (prod, pmag) = gemm_reference(&f64s(&a), ta, &f64s(&b), tb, (m, n, k));
                for (alpha, beta) in [(1.0f32, 0.0f32), (params[0], params[1])] {
                    let mut c = put(&c0, &[m, n], s)?;
                    if beta == 0.0 {
                        ops::fill(&mut c, f32::NAN, s)?;
                    }
                    ops::gemm(alpha, &at, tr(ta), &bt, tr(tb), beta, &mut c, s)?;
                    let (al, be) = (f64::from(alpha), f64::from(beta));
                    let want: Vec<f64> =
                        prod.iter().zip(&c0).map(|(p, c)| al * p + be * f64::from(*c)).collect();
                    let mag: Vec<f64> = pmag
                        .iter()
                        .zip(&c0)
                        .map(|(p, c)| al.abs() * p + (be * f64::from(*c)).abs())
                        .collect();
                    let what = format!("gemm m={m} n={n} k={k} ta={ta} tb={tb} alpha={alpha}");
                    check_close(
                        &what,
                        &c.to_vec(s)?,
                        &want,
                        &mag,
                        4e-7 * (k as f64).sqrt() + 1e-6,
                    )?;
                }
            }
        }
        Ok(())
    })
}

#[test]
fn bias_add_and_sum_rows_match_f64() -> TestResult {
    on_each_device(|s| {
        for (i, &(n, m)) in [(1, 1), (7, 3), (1023, 7), (64, 1025)].iter().enumerate() {
            let y = rand_vec(n * m, -1.0, 1.0, 3000 + i as u64)?;
            let bias = rand_vec(m, -1.0, 1.0, 3100 + i as u64)?;
            let mut yt = put(&y, &[n, m], s)?;
            ops::bias_add(&mut yt, &put(&bias, &[m], s)?, s)?;
            let want: Vec<f64> =
                (0..n * m).map(|k| f64::from(y[k]) + f64::from(bias[k % m])).collect();
            let mag: Vec<f64> =
                (0..n * m).map(|k| f64::from(y[k].abs()) + f64::from(bias[k % m].abs())).collect();
            check_close("bias_add", &yt.to_vec(s)?, &want, &mag, EW_TOL)?;

            let mut out = Tensor::zeros(&[m], DType::F32, s)?;
            ops::fill(&mut out, f32::NAN, s)?;
            ops::sum_rows(&put(&y, &[n, m], s)?, &mut out, s)?;
            let mut want = vec![0.0; m];
            let mut mag = vec![0.0; m];
            for (k, v) in y.iter().enumerate() {
                want[k % m] += f64::from(*v);
                mag[k % m] += f64::from(v.abs());
            }
            check_close("sum_rows", &out.to_vec(s)?, &want, &mag, 1e-7 * n as f64 + 1e-6)?;
        }
        Ok(())
    })
}

#[test]
fn log_softmax_nll_and_argmax_match_f64() -> TestResult {
    on_each_device(|s| {
        for (i, &(n, c)) in [(1, 1), (7, 10), (1023, 10), (33, 37)].iter().enumerate() {
            // Large logits check numerical stability (exp would overflow without the shift).
            for spread in [3.0f32, 120.0] {
                let seed = 4000 + 10 * i as u64 + spread as u64;
                let logits = rand_vec(n * c, -spread, spread, seed)?;
                let labels: Vec<i32> = rand_vec(n, 0.0, c as f32, seed + 1)?
                    .iter()
                    .map(|v| (*v as i32).min(c as i32 - 1))
                    .collect();
                let lt = put(&logits, &[n, c], s)?;
                let yt = Tensor::from_slice(&labels, &[n], s)?;
                let mut dl = Tensor::zeros(&[n, c], DType::F32, s)?;
                let loss = ops::log_softmax_nll(&lt, &yt, &mut dl, s)?;
                let mut want_loss = 0.0;
                let mut want_grad = vec![0.0; n * c];
                let mut correct = 0;
                for r in 0..n {
                    let row = &f64s(&logits[r * c..(r + 1) * c]);
                    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = row.iter().map(|v| (v - max).exp()).sum();
                    let label = labels[r] as usize;
                    want_loss += max + z.ln() - row[label];
                    for j in 0..c {
                        let onehot = if j == label { 1.0 } else { 0.0 };
                        want_grad[r * c + j] = ((row[j] - max).exp() / z - onehot) / n as f64;
                    }
                    let arg = (0..c).fold(0, |b, j| if row[j] > row[b] { j } else { b });
                    correct += usize::from(arg == label);
                }
                want_loss /= n as f64;
                check_scalar("nll loss", f64::from(loss), want_loss, want_loss.abs() + 1.0, 1e-5)?;
                let mag = vec![1.0 / n as f64; n * c];
                check_close("nll grad", &dl.to_vec(s)?, &want_grad, &mag, 1e-5)?;
                let got = ops::argmax_correct(&lt, &yt, s)?;
                if got != correct {
                    return Err(format!("argmax_correct n={n} c={c}: {got} vs {correct}").into());
                }
            }
        }
        Ok(())
    })
}

#[test]
fn sgd_step_follows_pytorch_semantics() -> TestResult {
    on_each_device(|s| {
        for (i, &n) in SIZES.iter().enumerate() {
            let seed = 5000 + 10 * i as u64;
            let p0 = rand_vec(n, -1.0, 1.0, seed)?;
            let (lr, momentum, wd) = (0.05f32, 0.9f32, 1e-2f32);
            let mut p = put(&p0, &[n], s)?;
            let mut buf = Tensor::zeros(&[n], DType::F32, s)?;
            let mut pd = f64s(&p0);
            let mut bd = vec![0.0f64; n];
            for step in 0..3u64 {
                let g = rand_vec(n, -1.0, 1.0, seed + 1 + step)?;
                ops::sgd_step(&mut p, &put(&g, &[n], s)?, &mut buf, lr, momentum, wd, s)?;
                for k in 0..n {
                    let gk = f64::from(g[k]) + f64::from(wd) * pd[k];
                    bd[k] = if step == 0 { gk } else { f64::from(momentum) * bd[k] + gk };
                    pd[k] -= f64::from(lr) * bd[k];
                }
            }
            let mag: Vec<f64> = pd.iter().map(|v| v.abs() + 1.0).collect();
            check_close("sgd param", &p.to_vec(s)?, &pd, &mag, 1e-6)?;
            check_close("sgd buf", &buf.to_vec(s)?, &bd, &vec![3.0; n], 1e-6)?;
        }
        Ok(())
    })
}

#[test]
fn adam_step_is_bias_corrected_adam() -> TestResult {
    on_each_device(|s| {
        for (i, &n) in SIZES.iter().enumerate() {
            let seed = 6000 + 10 * i as u64;
            let p0 = rand_vec(n, -1.0, 1.0, seed)?;
            let (lr, b1, b2, eps, wd) = (1e-2f32, 0.9f32, 0.999f32, 1e-8f32, 1e-3f32);
            let mut p = put(&p0, &[n], s)?;
            let mut m = Tensor::zeros(&[n], DType::F32, s)?;
            let mut v = Tensor::zeros(&[n], DType::F32, s)?;
            let mut pd = f64s(&p0);
            let (mut md, mut vd) = (vec![0.0f64; n], vec![0.0f64; n]);
            let (b1d, b2d) = (f64::from(b1), f64::from(b2));
            for step in 1..=3u64 {
                let g = rand_vec(n, -1.0, 1.0, seed + step)?;
                ops::adam_step(
                    &mut p,
                    &put(&g, &[n], s)?,
                    &mut m,
                    &mut v,
                    lr,
                    b1,
                    b2,
                    eps,
                    wd,
                    step,
                    s,
                )?;
                let t = step as i32;
                for k in 0..n {
                    let gk = f64::from(g[k]) + f64::from(wd) * pd[k];
                    md[k] = b1d * md[k] + (1.0 - b1d) * gk;
                    vd[k] = b2d * vd[k] + (1.0 - b2d) * gk * gk;
                    let mh = md[k] / (1.0 - b1d.powi(t));
                    let vh = vd[k] / (1.0 - b2d.powi(t));
                    pd[k] -= f64::from(lr) * mh / (vh.sqrt() + f64::from(eps));
                }
            }
            let mag: Vec<f64> = pd.iter().map(|v| v.abs() + 0.03).collect();
            check_close("adam param", &p.to_vec(s)?, &pd, &mag, 1e-5)?;
            check_close("adam m", &m.to_vec(s)?, &md, &vec![1.0; n], 1e-6)?;
            check_close("adam v", &v.to_vec(s)?, &vd, &vec![1.0; n], 1e-6)?;
        }
        Ok(())
    })
}

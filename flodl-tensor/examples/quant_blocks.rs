//! Measures the quantization error of the wire formats' schemes against their bytes, for block
//! sizes 32 to 256: the measurement behind `QuantFormat::block`.
//!
//! `cargo run --release -p flodl-tensor --example quant_blocks`
//!
//! For each scheme and block size it prints the bytes per value relative to f32 (scales
//! included) and the relative RMS error `‖x − q(x)‖ / ‖x‖` on three kinds of delta: Gaussian,
//! heavy-tailed (Student-t, 3 degrees of freedom) and Gaussian whose scale changes every 1,000
//! values over four decades (tensors of different magnitudes side by side). The symmetric
//! schemes (scale = max|x| / levels) are computed by the crate's kernels; the asymmetric q4
//! (a minimum and a step per block, 16 levels) in f64 here, for comparison.

use flodl_tensor::quant::QuantFormat;
use flodl_tensor::{DType, Stream, Tensor, ops};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal, StudentT};
use rand_xoshiro::Xoshiro256PlusPlus;

const N: usize = 1 << 20;

/// Symmetric blockwise quantization with `levels` and `block`, as the kernels do (f64).
fn symmetric(x: &[f32], block: usize, levels: f64) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for b in x.chunks(block) {
        let scale = b.iter().map(|v| f64::from(v.abs())).fold(0.0, f64::max) / levels;
        for v in b {
            let q = if scale > 0.0 { (f64::from(*v) / scale).round() } else { 0.0 };
            y.push(q * scale);
        }
    }
    y
}

/// Asymmetric: 16 levels from the block's minimum to its maximum (two f32 per block).
fn asymmetric_q4(x: &[f32], block: usize) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for b in x.chunks(block) {
        let lo = b.iter().map(|v| f64::from(*v)).fold(f64::INFINITY, f64::min);
        let hi = b.iter().map(|v| f64::from(*v)).fold(f64::NEG_INFINITY, f64::max);
        let step = (hi - lo) / 15.0;
        for v in b {
            let q = if step > 0.0 { ((f64::from(*v) - lo) / step).round() } else { 0.0 };
            y.push(lo + q * step);
        }
    }
    y
}

fn rel_rms(x: &[f32], y: &[f64]) -> f64 {
    let num: f64 = x.iter().zip(y).map(|(a, b)| (f64::from(*a) - b).powi(2)).sum();
    let den: f64 = x.iter().map(|a| f64::from(*a).powi(2)).sum();
    (num / den).sqrt()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
    let normal = Normal::new(0.0f32, 1.0)?;
    let t3 = StudentT::new(3.0f32)?;
    let gaussian: Vec<f32> = (0..N).map(|_| normal.sample(&mut rng)).collect();
    let heavy: Vec<f32> = (0..N).map(|_| t3.sample(&mut rng)).collect();
    let decades = rand_distr::Uniform::new(-4.0f32, 0.0)?;
    let mut mag = 1.0f32;
    let mixed: Vec<f32> = (0..N)
        .map(|i| {
            if i % 1000 == 0 {
                mag = 10f32.powf(decades.sample(&mut rng));
            }
            normal.sample(&mut rng) * mag
        })
        .collect();
    let inputs = [("gaussian", &gaussian), ("student-t3", &heavy), ("mixed-scales", &mixed)];

    // The kernels' own error at their chosen block, as a check on the f64 model below.
    let s = Stream::cpu_with_threads(1);
    for f in QuantFormat::ALL {
        let t = Tensor::from_slice(&gaussian, &[N], &s)?;
        let mut bytes = vec![0u8; f.encoded_len(N)];
        ops::quantize(f, &t, &mut bytes, &s)?;
        let mut y = Tensor::zeros(&[N], DType::F32, &s)?;
        ops::dequantize(f, &bytes, &mut y, &s)?;
        let y: Vec<f64> = y.to_vec::<f32>(&s)?.iter().map(|v| f64::from(*v)).collect();
        println!(
            "kernel {f} (block {}): {:.4}x f32, gaussian rel. RMS error {:.5}",
            f.block(),
            f.ratio_to_f32(N),
            rel_rms(&gaussian, &y)
        );
    }
    println!();
    println!("| scheme | block | bytes/f32 | gaussian | student-t3 | mixed-scales |");
    println!("|---|---|---|---|---|---|");
    for (scheme, levels, code_bits, scales) in
        [("int8 sym", 127.0, 8.0, 1.0), ("q4 sym", 7.0, 4.0, 1.0), ("q4 asym", 0.0, 4.0, 2.0)]
    {
        for block in [32usize, 64, 128, 256] {
            let ratio = (code_bits / 8.0 * block as f64 + 4.0 * scales) / (4.0 * block as f64);
            let errs: Vec<String> = inputs
                .iter()
                .map(|(_, x)| {
                    let y = if levels > 0.0 {
                        symmetric(x, block, levels)
                    } else {
                        asymmetric_q4(x, block)
                    };
                    format!("{:.5}", rel_rms(x, &y))
                })
                .collect();
            println!("| {scheme} | {block} | {ratio:.4} | {} |", errs.join(" | "));
        }
    }
    Ok(())
}

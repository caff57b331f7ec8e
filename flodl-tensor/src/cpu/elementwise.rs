//! Element-wise CPU kernels, written so LLVM vectorises the inner loops.

use half::bf16;

use super::CpuWorkers;
use crate::Element;

pub(crate) fn fill<T: Element>(w: &CpuWorkers, t: &mut [T], v: T) {
    w.split1(t, |_, c| c.fill(v));
}

pub(crate) fn scale(w: &CpuWorkers, t: &mut [f32], alpha: f32) {
    w.split1(t, |_, c| {
        for v in c {
            *v *= alpha;
        }
    });
}

pub(crate) fn axpy(w: &CpuWorkers, alpha: f32, x: &[f32], y: &mut [f32]) {
    w.split1(y, |off, yc| {
        let xc = &x[off..off + yc.len()];
        for (yv, xv) in yc.iter_mut().zip(xc) {
            *yv += alpha * *xv;
        }
    });
}

pub(crate) fn lerp(w: &CpuWorkers, a: &mut [f32], b: &[f32], t: f32) {
    w.split1(a, |off, ac| {
        let bc = &b[off..off + ac.len()];
        for (av, bv) in ac.iter_mut().zip(bc) {
            *av += t * (*bv - *av);
        }
    });
}

pub(crate) fn relu(w: &CpuWorkers, x: &[f32], y: &mut [f32]) {
    w.split1(y, |off, yc| {
        let xc = &x[off..off + yc.len()];
        for (yv, xv) in yc.iter_mut().zip(xc) {
            *yv = if *xv > 0.0 { *xv } else { 0.0 };
        }
    });
}

pub(crate) fn relu_backward(w: &CpuWorkers, dy: &[f32], y: &[f32], dx: &mut [f32]) {
    w.split1(dx, |off, dc| {
        let n = dc.len();
        let (dyc, yc) = (&dy[off..off + n], &y[off..off + n]);
        for ((d, g), o) in dc.iter_mut().zip(dyc).zip(yc) {
            *d = if *o > 0.0 { *g } else { 0.0 };
        }
    });
}

/// f32 to bf16 bits, rounding to nearest, ties to even; NaN stays a (quiet) NaN.
#[inline(always)]
pub(crate) fn f32_to_bf16(x: f32) -> bf16 {
    let b = x.to_bits();
    let bits = if x.is_nan() {
        (b >> 16) as u16 | 0x0040
    } else {
        (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
    };
    bf16::from_bits(bits)
}

pub(crate) fn cast_f32_bf16(w: &CpuWorkers, src: &[f32], dst: &mut [bf16]) {
    w.split1(dst, |off, dc| {
        let sc = &src[off..off + dc.len()];
        for (d, s) in dc.iter_mut().zip(sc) {
            *d = f32_to_bf16(*s);
        }
    });
}

pub(crate) fn cast_bf16_f32(w: &CpuWorkers, src: &[bf16], dst: &mut [f32]) {
    w.split1(dst, |off, dc| {
        let sc = &src[off..off + dc.len()];
        for (d, s) in dc.iter_mut().zip(sc) {
            *d = f32::from_bits(u32::from(s.to_bits()) << 16);
        }
    });
}

pub(crate) fn copy<T: Element>(w: &CpuWorkers, src: &[T], dst: &mut [T]) {
    w.split1(dst, |off, dc| dc.copy_from_slice(&src[off..off + dc.len()]));
}

//! Function multiversioning: one body compiled for AVX-512, AVX2 and the baseline, picked at run
//! time (the crate is built for generic x86-64, whose SSE2 halves the throughput of f64 sums).

/// Defines `fn $name(args) -> ret` whose body runs in the best instruction set the CPU has.
macro_rules! multiversion {
    ($vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $vis fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn body($($arg: $ty),*) -> $ret $body

            #[cfg(target_arch = "x86_64")]
            {
                /// # Safety
                /// The CPU must support AVX-512F.
                #[target_feature(enable = "avx512f")]
                unsafe fn v4($($arg: $ty),*) -> $ret {
                    body($($arg),*)
                }

                /// # Safety
                /// The CPU must support AVX2.
                #[target_feature(enable = "avx2")]
                unsafe fn v3($($arg: $ty),*) -> $ret {
                    body($($arg),*)
                }

                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: AVX-512F support was checked just above.
                    return unsafe { v4($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: AVX2 support was checked just above.
                    return unsafe { v3($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

pub(crate) use multiversion;

//! Shared helpers for flodl's criterion benchmarks (the benchmarks live in `benches/`).
//!
//! Conventions every bench file follows, so `cargo xtask bench-report` can read the results:
//!
//! - one criterion group per subject, named after its file (`kernels`, `collective`, `data`,
//!   `dispatch`, `ddp`): `c.benchmark_group("kernels")`;
//! - function ids come from [`bench_name`]: device-prefixed (`cpu_axpy`, `cuda0_axpy`) and carrying
//!   the throughput unit when it is not bytes (`cuda0_gemm@flop`);
//! - every benchmark sets a throughput with [`Unit::throughput`], so the report can show GB/s,
//!   GFLOP/s or samples/s;
//! - GPU work is timed with `b.iter_custom(|iters| time_iters(iters, run, sync))`, where `sync`
//!   waits for the stream, so queued work is counted;
//! - groups are configured with [`criterion_config`] (short, low-noise runs on a 2-core machine).
//!
//! ```
//! use criterion::BenchmarkId;
//! use flodl_benches::{Unit, bench_name};
//!
//! let name = bench_name("cuda:0", "gemm", Unit::Flops);
//! assert_eq!(name, "cuda0_gemm@flop");
//! let _id = BenchmarkId::new(name, "256x256x256");
//! let _throughput = Unit::Flops.throughput(2 * 256 * 256 * 256);
//! ```

use std::fmt::Display;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};

/// What one iteration of a benchmark processes, and so the unit its throughput is reported in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// Bytes read plus bytes written; reported as GB/s (decimal).
    Bytes,
    /// Floating-point operations (a multiply-add counts as two); reported as GFLOP/s.
    Flops,
    /// Training or data samples; reported as samples/s.
    Samples,
    /// Optimizer or training steps; reported as steps/s.
    Steps,
    /// Any other countable item; reported as elements/s.
    Elements,
}

impl Unit {
    /// The criterion throughput of one iteration that processes `per_iter` of this unit.
    pub fn throughput(self, per_iter: u64) -> Throughput {
        match self {
            Unit::Bytes => Throughput::BytesDecimal(per_iter),
            Unit::Flops | Unit::Samples | Unit::Steps | Unit::Elements => {
                Throughput::Elements(per_iter)
            }
        }
    }

    /// The suffix [`bench_name`] appends to a function id (`@flop`), empty for bytes and elements.
    pub fn suffix(self) -> &'static str {
        match self {
            Unit::Bytes | Unit::Elements => "",
            Unit::Flops => "@flop",
            Unit::Samples => "@sample",
            Unit::Steps => "@step",
        }
    }
}

/// A device's tag in bench names: its display form without punctuation (`cpu`, `cuda0`).
///
/// Takes anything that displays like `flodl_tensor::Device` (`"cpu"`, `"cuda:0"`).
pub fn device_tag(device: impl Display) -> String {
    device.to_string().chars().filter(|c| c.is_ascii_alphanumeric()).collect()
}

/// A benchmark's function id: `<device tag>_<op><unit suffix>`, e.g. `cuda0_gemm@flop`.
pub fn bench_name(device: impl Display, op: &str, unit: Unit) -> String {
    format!("{}_{}{}", device_tag(device), op, unit.suffix())
}

/// The criterion configuration shared by every bench group, sized for a small (2-core) machine.
///
/// Twenty samples after a one-second warm-up over three seconds of measurement, a 3% noise
/// threshold, and no plots (`cargo xtask bench-report` draws its own). Command-line options
/// (`--quick`, `--measurement-time`, `--sample-size`) still override these, since
/// `criterion_group!` applies them after this configuration.
pub fn criterion_config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .noise_threshold(0.03)
        .without_plots()
}

/// Times `iters` calls of `run` followed by one `sync`, for `Bencher::iter_custom`.
///
/// `sync` waits until the queued work is complete (a stream synchronize on CUDA, nothing on CPU),
/// so asynchronous launches are measured by when they finish, not when they were queued.
pub fn time_iters(iters: u64, mut run: impl FnMut(), mut sync: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        run();
    }
    sync();
    start.elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_device_prefixed_and_carry_the_unit() {
        let cases = [
            ("cpu", "axpy", Unit::Bytes, "cpu_axpy"),
            ("cuda:0", "gemm", Unit::Flops, "cuda0_gemm@flop"),
            ("cuda:12", "prefetch", Unit::Samples, "cuda12_prefetch@sample"),
            ("cpu", "ddp_step", Unit::Steps, "cpu_ddp_step@step"),
            ("cpu", "plan", Unit::Elements, "cpu_plan"),
        ];
        for (device, op, unit, want) in cases {
            assert_eq!(bench_name(device, op, unit), want, "{device} {op} {unit:?}");
        }
    }

    #[test]
    fn bytes_are_decimal_and_counts_are_elements() {
        for n in [0_u64, 1, 4096, u64::MAX] {
            assert_eq!(Unit::Bytes.throughput(n), Throughput::BytesDecimal(n));
            for unit in [Unit::Flops, Unit::Samples, Unit::Steps, Unit::Elements] {
                assert_eq!(unit.throughput(n), Throughput::Elements(n));
            }
        }
    }

    #[test]
    fn time_iters_runs_each_iteration_and_syncs_once() {
        for iters in [0_u64, 1, 7, 100] {
            let mut runs = 0_u64;
            let mut syncs = 0_u64;
            let _ = time_iters(iters, || runs += 1, || syncs += 1);
            assert_eq!((runs, syncs), (iters, 1));
        }
    }
}

//! Measured quantities and how they read: times per iteration and throughput rates.

use serde::Serialize;

/// The unit a throughput rate is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RateUnit {
    /// Bytes with binary prefixes (KiB/s, MiB/s, GiB/s), criterion's `Bytes`.
    BinaryBytes,
    /// Bytes with decimal prefixes (kB/s, MB/s, GB/s), criterion's `BytesDecimal`.
    Bytes,
    /// Bits (kbit/s, Mbit/s, Gbit/s).
    Bits,
    /// Floating-point operations (GFLOP/s); elements of a function id ending in `@flop`.
    Flops,
    /// Samples (samples/s); elements of a function id ending in `@sample`.
    Samples,
    /// Steps (steps/s); elements of a function id ending in `@step`.
    Steps,
    /// Any other element.
    Elements,
}

impl RateUnit {
    /// The unit of criterion elements under a function id's `@unit` suffix.
    pub(crate) fn of_elements(function_id: &str) -> RateUnit {
        match function_id.rsplit_once('@').map(|(_, suffix)| suffix) {
            Some("flop") => RateUnit::Flops,
            Some("sample") => RateUnit::Samples,
            Some("step") => RateUnit::Steps,
            _ => RateUnit::Elements,
        }
    }

    /// The divisor and unit label that show `value` (per second) with one to three integer digits.
    pub(crate) fn scale_for(self, value: f64) -> (f64, String) {
        let (base, prefixes, name): (f64, [&str; 5], &str) = match self {
            RateUnit::BinaryBytes => (1024.0, ["B", "KiB", "MiB", "GiB", "TiB"], ""),
            RateUnit::Bytes => (1000.0, ["B", "kB", "MB", "GB", "TB"], ""),
            RateUnit::Bits => (1000.0, ["bit", "kbit", "Mbit", "Gbit", "Tbit"], ""),
            RateUnit::Flops => (1000.0, ["FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP"], ""),
            RateUnit::Samples => (1000.0, ["", "k ", "M ", "G ", "T "], "samples"),
            RateUnit::Steps => (1000.0, ["", "k ", "M ", "G ", "T "], "steps"),
            RateUnit::Elements => (1000.0, ["", "k ", "M ", "G ", "T "], "elem"),
        };
        let mut power = 0;
        let mut divisor = 1.0;
        while power + 1 < prefixes.len() && value.abs() >= divisor * base {
            divisor *= base;
            power += 1;
        }
        (divisor, format!("{}{name}/s", prefixes[power]))
    }

    /// `value` (per second) with a fitting prefix: `12.3 GB/s`, `450 GFLOP/s`, `1.20 k samples/s`.
    pub(crate) fn format(self, value: f64) -> String {
        let (divisor, label) = self.scale_for(value);
        format!("{} {label}", three_digits(value / divisor))
    }
}

/// A time per iteration in nanoseconds with a fitting unit: `850 ns`, `12.3 µs`, `1.50 s`.
pub(crate) fn format_time(ns: f64) -> String {
    let (value, unit) = time_scale(ns);
    format!("{} {unit}", three_digits(ns / value))
}

/// The divisor (from ns) and unit name that show `ns` with one to three integer digits.
pub(crate) fn time_scale(ns: f64) -> (f64, &'static str) {
    match ns.abs() {
        t if t >= 1e9 => (1e9, "s"),
        t if t >= 1e6 => (1e6, "ms"),
        t if t >= 1e3 => (1e3, "µs"),
        _ => (1.0, "ns"),
    }
}

/// A number with three significant digits (`1.23`, `12.3`, `123`).
pub(crate) fn three_digits(x: f64) -> String {
    match x.abs() {
        a if a >= 100.0 || a == 0.0 => format!("{x:.0}"),
        a if a >= 10.0 => format!("{x:.1}"),
        _ => format!("{x:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_with_prefixes() {
        let cases = [
            (RateUnit::Bytes, 12.3e9, "12.3 GB/s"),
            (RateUnit::Bytes, 999.0, "999 B/s"),
            (RateUnit::BinaryBytes, 3.0 * 1024.0 * 1024.0, "3.00 MiB/s"),
            (RateUnit::Bits, 2.5e6, "2.50 Mbit/s"),
            (RateUnit::Flops, 450e9, "450 GFLOP/s"),
            (RateUnit::Flops, 1.5e15, "1500 TFLOP/s"),
            (RateUnit::Samples, 1200.0, "1.20 k samples/s"),
            (RateUnit::Steps, 12.0, "12.0 steps/s"),
            (RateUnit::Elements, 0.0, "0 elem/s"),
        ];
        for (unit, value, want) in cases {
            assert_eq!(unit.format(value), want, "{unit:?} {value}");
        }
    }

    #[test]
    fn element_units_come_from_the_function_suffix() {
        let cases = [
            ("cuda0_gemm@flop", RateUnit::Flops),
            ("cpu_prefetch@sample", RateUnit::Samples),
            ("cpu_ddp_step@step", RateUnit::Steps),
            ("cpu_plan", RateUnit::Elements),
            ("cpu_odd@furlong", RateUnit::Elements),
        ];
        for (function, want) in cases {
            assert_eq!(RateUnit::of_elements(function), want, "{function}");
        }
    }

    #[test]
    fn times_read_with_units() {
        let cases = [
            (850.0, "850 ns"),
            (12_345.0, "12.3 µs"),
            (1.5e6, "1.50 ms"),
            (2.0e9, "2.00 s"),
            (0.5, "0.50 ns"),
        ];
        for (ns, want) in cases {
            assert_eq!(format_time(ns), want, "{ns}");
        }
    }
}

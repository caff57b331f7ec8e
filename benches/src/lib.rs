//! Shared helpers for flodl's criterion benchmarks (the benchmarks live in `benches/`).

#!/usr/bin/env bash
# candle against tch under flodl on the same model, one after the other in one run: the 2-rank
# Cadence run (rank 1 at 2.5x, one candle / libtorch thread per rank) on the same windows, each
# printing its ranks' tokens/s of compute and where their time went; candle's run also times its
# adapter's glue per step. SIZE (default: default, the README model), WINDOWS (64), BATCH (16).
# Needs libtorch as flodl-tch's README says (flodl-tch/libtorch/install).
set -euo pipefail
cd "$(dirname "$0")/../.."
size="${1:-default}" windows="${2:-64}" batch="${3:-16}"
cargo build --release -p flodl-candle --example gpt_figures
cargo build --release --manifest-path flodl-tch/Cargo.toml -p flodl-tch-gpt --target-dir target
uptime; date -u
echo "== candle (flodl-candle gpt_figures)"
target/release/examples/gpt_figures "$size" "$windows" "$batch" 1 none 16
uptime; date -u
echo "== tch (flodl-tch-gpt)"
target/release/flodl-tch-gpt --size "$size" --ranks 2 --slow 2.5 --epochs 1 \
  --train-windows "$windows" --batch "$batch" --valid-windows 16 --warmup 0 --seed 5
uptime; date -u

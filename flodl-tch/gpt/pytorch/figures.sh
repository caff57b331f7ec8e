#!/usr/bin/env bash
# "Same kernels, different runtime": the tch transformer under flodl (Cadence) against PyTorch's
# DDP and a local-SGD loop on the same model, data, tokens and learning-rate schedule, 2 ranks of
# one thread, the second 2.5x slower. Each side evaluates after every epoch on one rank while the
# other trains on (its wall clock pays for it), so the validation curve gives the wall time to a
# target loss. Round-robin repeats (REPEATS, default 3) for medians on a noisy machine.
# PYTHON is a Python with torch 2.13.0 importable (see compare.py's install line).
# Usage: figures.sh [TARGET_NATS_PER_BYTE]   (default 2.85: a loss all three reach)
set -euo pipefail
cd "$(dirname "$0")/../../.."
python="${PYTHON:-target/torch-venv/bin/python}"
target="${1:-2.85}"
common=(--size tiny --ranks 2 --slow 2.5 --epochs 8 --train-windows 384 --valid-windows 128
  --target-loss "$target")
cargo build --release --manifest-path flodl-tch/Cargo.toml -p flodl-tch-gpt --target-dir target
uptime
for repeat in $(seq 1 "${REPEATS:-3}"); do
  echo "== repeat $repeat: flodl (tch replicas, Cadence)"
  target/release/flodl-tch-gpt "${common[@]}" --policy cadence
  echo "== repeat $repeat: PyTorch DDP (gloo)"
  "$python" flodl-tch/gpt/pytorch/compare.py --mode ddp "${common[@]}"
  echo "== repeat $repeat: PyTorch local SGD (gloo, average every 8 steps and at each epoch's end)"
  "$python" flodl-tch/gpt/pytorch/compare.py --mode localsgd --sync-every 8 "${common[@]}"
done
uptime

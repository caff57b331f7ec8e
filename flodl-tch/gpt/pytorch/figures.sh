#!/usr/bin/env bash
# "Same kernels, different runtime": the tch transformer under flodl (Cadence) against PyTorch's
# DDP and a local-SGD loop on the same model, data, tokens and learning-rate schedule, 2 ranks of
# one thread, the second 2.5x slower, one after the other in one run. PYTHON is a Python with
# torch 2.13.0 importable (see compare.py's install line).
set -euo pipefail
cd "$(dirname "$0")/../../.."
python="${PYTHON:-target/torch-venv/bin/python}"
common=(--size tiny --ranks 2 --slow 2.5 --epochs 2 --train-windows 1600 --valid-windows 512)
uptime
cargo build --release --manifest-path flodl-tch/Cargo.toml -p flodl-tch-gpt --target-dir target
echo "== flodl (tch replicas, Cadence)"
target/release/flodl-tch-gpt "${common[@]}" --policy cadence
echo "== PyTorch DDP (gloo)"
"$python" flodl-tch/gpt/pytorch/compare.py --mode ddp "${common[@]}"
echo "== PyTorch local SGD (gloo, average every 8 steps)"
"$python" flodl-tch/gpt/pytorch/compare.py --mode localsgd --sync-every 8 "${common[@]}"
uptime

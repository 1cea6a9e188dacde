#!/usr/bin/env bash
# bench_attention.sh: dense causal flash attention, forward + backward, on the
# GPU: mtrain's CUDA kernels (build/tests/gpu_bench_attention) and PyTorch's
# scaled_dot_product_attention (flash and cuDNN backends) on the same shapes
# (16 q / 2 kv heads, head dim 128, bf16) in the same run. Ends with a
# markdown table: ms, TFLOP/s, and mtrain time / best SDPA time.
#   scripts/bench_attention.sh [N...]     default 8192 32768 131072
# Logs go to $OUT when set (the GPU sessions), else build/.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(8192 32768 131072)
out=${OUT:-build}
mkdir -p "$out"
make -s build-test-gpu >/dev/null
build/tests/gpu_bench_attention "${sizes[@]}" | tee "$out/bench_mtrain.txt"
PYTHONUNBUFFERED=1 python3 scripts/bench_attention.py "$out/bench_mtrain.txt" "${sizes[@]}"

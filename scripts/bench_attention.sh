#!/usr/bin/env bash
# bench_attention.sh: dense causal flash attention, forward + backward, on the
# GPU: mtrain's CUDA kernels (build/tests/gpu_bench_attention) and PyTorch's
# scaled_dot_product_attention (flash and cuDNN backends) on the same shapes
# (16 q / 2 kv heads, head dim 128, bf16) in the same run. Ends with a
# markdown table: ms, TFLOP/s, and mtrain time / best SDPA time. Then the
# sparse pipeline (build/tests/gpu_bench_sparse: planted vertical-slash
# inputs, GPU estimation + selection + index, sparse forward + backward) at
# SPARSE_SIZES (default 131072 524288) against our dense kernels (dense at
# lengths above 131072 estimated from 131072 x (N / 131072)^2), as a second
# table: density, ms, speedup, estimation + index as % of dense.
#   scripts/bench_attention.sh [N...]     default 8192 32768 131072
# Logs go to $OUT when set (e.g. a run on a GPU machine), else build/.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(8192 32768 131072)
out=${OUT:-build}
mkdir -p "$out"
make -s build-test-gpu >/dev/null
build/tests/gpu_bench_attention "${sizes[@]}" | tee "$out/bench_mtrain.txt"
PYTHONUNBUFFERED=1 python3 scripts/bench_attention.py "$out/bench_mtrain.txt" "${sizes[@]}" || true
read -r -a sparse_sizes <<<"${SPARSE_SIZES:-131072 524288}"
build/tests/gpu_bench_sparse "${sparse_sizes[@]}" | tee "$out/bench_sparse.txt"
echo
echo "| N (sparse) | density | dense fwd+bwd ms | sparse fwd+bwd ms | speedup | estimation+index ms | % of dense |"
echo "|---|---|---|---|---|---|---|"
awk '$1 == "sparse" { printf "| %d | %.1f%% | %.1f%s | %.1f | %.1fx | %.1f | %.1f%% |\n", $2, 100 * $6, $3,
     ($7 == 1 ? "" : " (est.)"), $4, $3 / $4, $5, 100 * $5 / $3 }' "$out/bench_sparse.txt"

#!/usr/bin/env bash
# test_kernel_resources.sh: the static resources of every CUDA kernel, from
# nvcc for sm_80 and sm_90 through scripts/kernel_resources.sh (no GPU
# needed): per kernel and arch no spill, shared memory within the A100/H100
# per-block limits of the launch, registers x threads within an SM, threads
# within __launch_bounds__, the dense forward at two CTAs per SM (head dims
# 64 and 128), every kernel in the script's launch table and every row of
# that table used.
# Then the script itself on a small probe kernel that spills and that the
# launch table does not know: both must show. Without nvcc it cannot check
# and says so as one failure. Prints "ok NAME" / "FAIL NAME: why".
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh

NVCC=$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
if [ ! -x "$NVCC" ]; then
  echo "FAIL kernel_resources: no nvcc (PATH or /usr/local/cuda/bin/nvcc): spills and shared memory cannot be checked"
  exit 1
fi
export NVCC

# Every kernel of the project, both archs, compiled once.
bash scripts/kernel_resources.sh --check >"$tmp/check.txt" 2>"$tmp/check.err"
rc=$?
cat "$tmp/check.txt"
failures=$((failures + $(grep -c '^FAIL' "$tmp/check.txt")))
expect "launch_table_complete" "[ $rc -eq 0 ] && [ ! -s '$tmp/check.err' ]"
[ -s "$tmp/check.err" ] && sed 's/^/    /' "$tmp/check.err"
# The parse dropped no kernel: at least one instance per __global__ of the sources, per arch.
globals=$(cat attention/*.cu model/*.cu dist/*.cu 2>/dev/null | grep -c '__global__')
seen=$(grep -c '^ok no_spill .*\[sm_80\]' "$tmp/check.txt")
expect "every_kernel_seen" "[ $seen -ge $globals ]   # kernel instances seen >= __global__ functions"
expect "dense_forward_d64_checked" \
  "grep -q '^ok no_spill flash_forward_kernel<64, .*\[sm_80\]' '$tmp/check.txt' &&
   grep -q '^ok no_spill flash_forward_kernel<64, .*\[sm_90\]' '$tmp/check.txt'"
# The dense forward: two CTAs per SM (occupancy x 64 warps / the warps of its __launch_bounds__, which its
# launch uses) at head dims 64 and 128, with and without documents, on both archs.
bash scripts/kernel_resources.sh attention/kernels/flash_cuda.cu >"$tmp/flash.tsv" 2>/dev/null
for d in 64 128; do
  expect "dense_forward_d${d}_two_ctas_per_sm" \
    "[ \$(awk -F'\t' '\$2 ~ /^_Z20flash_forward_kernelILi${d}E/ && \$8 * 64 / (\$6 / 32) >= 2' '$tmp/flash.tsv' | wc -l) -eq 4 ]"
done

# The probe: capped at 32 registers (1024 threads, 2 CTAs) with 64 values live.
cat >"$tmp/probe.cu" <<'EOF'
__global__ void __launch_bounds__(1024, 2) probe_spill_kernel(const float *x, float *y) {
    float a[64];
#pragma unroll
    for (int i = 0; i < 64; i++) a[i] = x[threadIdx.x + i * 1024];
    float s = 0.0f;
#pragma unroll
    for (int r = 1; r < 4; r++)
#pragma unroll
        for (int i = 0; i < 64; i++) s += a[i] * a[(i + r) % 64];
    y[threadIdx.x] = s;
}
EOF
bash scripts/kernel_resources.sh "$tmp/probe.cu" >"$tmp/probe.tsv" 2>"$tmp/probe.err"
rc=$?
expect "tsv_header" "[ \"\$(head -n 1 '$tmp/probe.tsv')\" = \"\$(printf 'arch\tkernel\tregisters\tspill_bytes\tstatic_smem\tmax_threads\tmin_blocks\toccupancy')\" ]"
expect "tsv_rows" "awk -F'\t' 'NR > 1 && NF == 8 && \$2 == \"_Z18probe_spill_kernelPKfPf\" && \$4 > 0 &&
                                   \$6 == 1024 && \$7 == 2 && \$8 == \"?\" { n++ } END { exit n != 2 }' '$tmp/probe.tsv'"
expect "probe_unknown_kernel_fails" "[ $rc -ne 0 ] && grep -q 'probe_spill_kernel .* no row in the launch table' '$tmp/probe.err'"
[ "$failures" -eq 0 ]

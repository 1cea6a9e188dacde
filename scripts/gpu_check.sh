#!/usr/bin/env bash
# gpu_check.sh: the one command to run on a GPU machine. Builds everything
# (make all; the trainer's libraries may be missing on a GPU machine, so a
# failure there, or more than 150 s, is reported and the GPU programs are
# built on their own),
# runs make test-gpu, compute-sanitizer (memcheck and racecheck) on the small
# cases of both GPU tests (dense, sparse), then scripts/bench_attention.sh
# (dense vs PyTorch, then the sparse pipeline vs dense). Logs go to $OUT when set (else
# build/gpu-check); a summary and the benchmark table come last.
#   scripts/gpu_check.sh
# CUDA_ARCHS defaults to sm_90 only here (faster to build on the H100/H200).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu-check}
mkdir -p "$out"
export OUT=$out
export CUDA_ARCHS=${CUDA_ARCHS:--gencode arch=compute_90,code=sm_90}
summary=()
step() {   # step NAME LOG COMMAND...: run, log, record ok/FAIL and seconds
  local name=$1 log=$2; shift 2
  local start=$SECONDS
  if "$@" >"$out/$log" 2>&1; then summary+=("ok   $name ($((SECONDS - start)) s)")
  else summary+=("FAIL $name ($((SECONDS - start)) s, see $log)"); fi
  tail -n 3 "$out/$log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true
nvcc --version | tail -n 2
step "make all" make_all.log timeout 150 make -j16 all
step "make test-gpu" test_gpu.log make -j16 test-gpu
for t in attention sparse; do
  step "memcheck $t (small cases)" memcheck_$t.log \
    compute-sanitizer --tool memcheck --error-exitcode 1 build/tests/gpu_test_$t small
  step "racecheck $t (small cases)" racecheck_$t.log \
    compute-sanitizer --tool racecheck --error-exitcode 1 build/tests/gpu_test_$t small
done
step "bench" bench.log bash scripts/bench_attention.sh
echo
grep -E "^FAIL " "$out/test_gpu.log" | head -n 40
grep -E 'passed, .* failed' "$out/test_gpu.log" || true
grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out"/memcheck_*.log "$out"/racecheck_*.log || true
printf '%s\n' "${summary[@]}"
echo
grep -E '^\|' "$out/bench.log"

#!/usr/bin/env bash
# test_cuda_mfu.sh: the MFU of the CUDA backend (build/sim/mtrain) is measured
# against the peak of the hardware section's GPU, not the CPU's: one step on
# an a100-80g (312 TFLOP/s) and one on an h100 (989), each logging tokens/s
# and MFU from the same step time, so MFU / tokens/s is the model's FLOPs per
# token over the peak, and the two runs' ratios are 989 / 312 (within 1%;
# against the CPU's sgemm rate they are alike). The run summary prints no
# host memory plan ("planned") on the CUDA backend, whose plan is the GPU's.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/lib.sh
sim_setup cuda_mfu
RUN="$SIM_RUN train.steps=1"
for gpu in a100-80g h100; do
  sim_train "$gpu" 1 1 hardware.gpu="$gpu"
  rc=$?
  expect "cuda_mfu_run_$gpu: one step (exit $rc)" "[ $rc -eq 0 ] && [ -s '$tmp/$gpu/metrics.jsonl' ]"
done
# MFU per token/s in a run's metrics.jsonl (its one step).
per_tps() { sed -n 's/.*"tokens_per_s": \([0-9.e+-]*\),.*"mfu": \([0-9.e+-]*\),.*/\2 \1/p' "$tmp/$1/metrics.jsonl" | awk '{ printf "%.9g", $1 / $2 }'; }
a=$(per_tps a100-80g)
h=$(per_tps h100)
expect "cuda_mfu_peak: MFU against the GPU's peak (a100-80g / h100 MFU per token/s: $a / $h, expected 989 / 312 = 3.17)" \
  "awk -v a='$a' -v h='$h' 'BEGIN { r = a / h / (989 / 312); exit !(h > 0 && r > 0.99 && r < 1.01) }'"
expect "cuda_mfu_summary: the run summary has no host plan on the CUDA backend ($(grep '^run summary' "$tmp/h100.out"))" \
  "grep -Eq '^run summary: .* peak RSS [0-9.]+ MiB$' '$tmp/h100.out'"
exit $((failures > 0))

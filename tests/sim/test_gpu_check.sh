#!/usr/bin/env bash
# test_gpu_check.sh: scripts/gpu_check.sh --sim, the GPU check's stages on the
# sim builds (build/sim/) at tiny sizes, so that the script is tested before a
# GPU runs it: every stage ok, its figures in the summary, the PyTorch stages
# skipped with one line each, at most 11 files in $OUT (the sweep's table one of them). A stage past its limit
# (GPU_CHECK_LIMITS) says so on its line while the next stage runs and the
# summary is written; --stages runs the stages named (an unknown name: one
# line, exit 2); without the bundle the check refuses with one line.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/lib.sh

if [ ! -x build/sim/mtrain ] || [ ! -x build/sim/tests/gpu_bench_attention ] || [ ! -x build/sim/tests/gpu_sweep_attention ]; then
  bad "gpu_check_sim_build" "build/sim/mtrain, build/sim/tests/gpu_bench_attention or gpu_sweep_attention missing (make build-sim)"
  exit 1
fi
export OMP_NUM_THREADS=1
OUT=$tmp/out bash scripts/gpu_check.sh --sim >"$tmp/check.txt" 2>&1
rc=$?
summary=$tmp/out/summary.txt
expect "gpu_check_sim: exit 0 ($rc)" '[ $rc -eq 0 ]'
for stage in device sweep tests sanitizer attention train dw_stream agreement context; do
  expect "gpu_check_sim_$stage: ok, with figures ($(grep -m 1 -E "^[a-zA-Z]+ +$stage " "$summary" 2>/dev/null))" \
    'grep -qE "^ok +$stage .*\($stage\.log\)" "$summary" && grep -q "^## $stage" "$summary" && [ -s "$tmp/out/$stage.log" ]'
done
expect "gpu_check_sim_figures: tiny model losses, memory plan, dense attention timings, longest sequences" \
  'grep -q "^ok tiny model on synthetic: losses" "$summary" && grep -q "memory plan [0-9.]* GiB printed" "$summary" &&
   grep -q "^mtrain dense N=64 d=64: fwd" "$summary" && grep -q "^longest sequence trained one step, sparse: 128 tokens" "$summary"'
expect "gpu_check_sim_sweep: its table in \$OUT, micro-benchmarks and the best variants in the summary" \
  '[ -s "$tmp/out/sweep.tsv" ] && grep -q "^micro-benchmarks: sm_clock_mhz [0-9]" "$summary" &&
   grep -q "exp2_per_sm_clock [0-9]" "$summary" &&
   grep -q "^best dense_fwd d=128: dense_fwd_d128_.* causal_256, " "$summary" && grep -q "^best sparse_bwd d=64: sparse_bwd_d64_" "$summary"'
expect "gpu_check_sim_skips: the PyTorch stages skipped with one line each" \
  '[ "$(grep -c "^skipped: .*PyTorch" "$summary")" -eq 4 ] && ! grep -q "^FAIL" "$summary"'
expect "gpu_check_sim_dw_stream: tokens/s with train.dw_stream off and on, the losses within 1%" \
  'grep -q "^train.dw_stream at 128 tokens/step: off [0-9.]* tokens/s, on [0-9.]* tokens/s: on ÷ off [0-9.]*$" "$summary" &&
   grep -q "^ok train.dw_stream on: mean loss" "$summary"'
expect "gpu_check_sim_files: at most 11 files in \$OUT ($(ls "$tmp/out" | wc -l))" '[ "$(ls "$tmp/out" | wc -l)" -le 11 ]'

# The stage hold waits until its limit stops it, so a 1 s limit always does; the seconds it took are
# not checked: stopping it and its children may take more than the limit on a busy CI.
GPU_CHECK_LIMITS="hold:1 device:600" OUT=$tmp/limit bash scripts/gpu_check.sh --sim >"$tmp/limit.txt" 2>&1
rc=$?
expect "gpu_check_timeout: a stage past its limit says so, the next runs, exit 1 ($rc; $(grep -m 1 -E "^[A-Z]+ +hold " "$tmp/limit/summary.txt" 2>/dev/null))" \
  '[ $rc -eq 1 ] && grep -qE "^TIMEOUT +hold +[0-9]+ s of +1 s" "$tmp/limit/summary.txt" &&
   grep -qE "^ok +device" "$tmp/limit/summary.txt" && grep -q "stopped at its limit of 1 s" "$tmp/limit/hold.log"'

OUT=$tmp/subset bash scripts/gpu_check.sh --sim --stages agreement,device >"$tmp/subset.txt" 2>&1
rc=$?
expect "gpu_check_stages: --stages agreement,device runs those two, in the usual order, exit 0 ($rc; $(grep -cE '^[a-zA-Z]+ +[a-z]+ +[0-9]+ s of' "$tmp/subset/summary.txt" 2>/dev/null) stage lines)" \
  '[ $rc -eq 0 ] && [ "$(grep -E "^[a-zA-Z]+ +[a-z]+ +[0-9]+ s of" "$tmp/subset/summary.txt" | awk "{ printf \"%s %s \", \$1, \$2 }")" = "ok device ok agreement " ] &&
   [ ! -e "$tmp/subset/tests.log" ]'
bash scripts/gpu_check.sh --sim --stages device,bogus >"$tmp/bad_stage.txt" 2>&1
rc=$?
expect "gpu_check_stages_unknown: an unknown stage: one line naming it, exit 2 ($rc)" \
  '[ $rc -eq 2 ] && [ "$(wc -l <"$tmp/bad_stage.txt")" -eq 1 ] && grep -q "no stage .bogus." "$tmp/bad_stage.txt"'

env -u MTRAIN_BUNDLE bash scripts/gpu_check.sh >"$tmp/refuse.txt" 2>&1
rc=$?
expect "gpu_check_no_bundle: one line, exit 2 ($rc)" \
  '[ $rc -eq 2 ] && [ "$(wc -l <"$tmp/refuse.txt")" -eq 1 ] && grep -q "run it from the GPU bundle" "$tmp/refuse.txt"'
exit $((failures > 0))

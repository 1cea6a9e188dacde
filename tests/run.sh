#!/usr/bin/env bash
# run.sh: the test runner. Runs every test program (build/tests/test_*, from
# tests/unit/), every shell test (tests/*/test_*.sh) and every Python test
# (tests/*/test_*.py, with Debian's /usr/bin/python3 that has torch). Each
# prints "ok NAME" or "FAIL NAME: why" per check; a program that exits non-zero
# without printing a FAIL line counts as one failure. Ends with
# "N passed, N failed" and exits non-zero on any failure.
#   tests/run.sh [FILTER]   only tests whose file name contains FILTER
# MTRAIN_BUILD=build/san (make test SANITIZE=1) runs the sanitized build: its
# test programs and the shell tests that run $MTRAIN; the others (they run
# build/ programs directly) and the Python tests are left to make test.
# The folders, by what a test exercises (a new test goes to the first that fits):
#   unit/       C programs that call the library's functions (build/tests/test_*),
#               their headers, and shell tests that drive those programs
#   reference/  Python tests against an independent reference (fp64 PyTorch,
#               finite differences, Qwen's tokenizer, a format read from its spec)
#   sim/        GPU programs (gpu_*, mpi_gpu_*, sim_selftest) and every test that
#               runs build/sim/; the CPU execution model of CUDA itself in sim/cudasim/
#   mpi/        MPI programs (mpi_*) and the shell tests of several ranks as such
#               (dp x cp against one rank, ZeRO shards, Slurm)
#   cli/        shell tests of build/mtrain's verbs
#   repo/       shell tests of the build, scripts/ and the documents' commands
#   fuzz/       libFuzzer targets (make fuzz, not this runner)
#   lib/        helpers every kind shares (lib.sh, check.h, harness.py, ...)
set -uo pipefail
cd "$(dirname "$0")/.."
filter=${1:-}
build=${MTRAIN_BUILD:-build}
export MTRAIN=$build/mtrain
passed=0; failed=0; skipped=0
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

run_one() {
  local name=$1; shift
  local out="$log/$(basename "$name").out"
  local start=$SECONDS
  "$@" >"$out" 2>&1
  local rc=$?
  local ok fail skip
  ok=$(grep -c '^ok ' "$out")
  fail=$(grep -c '^FAIL ' "$out")
  skip=$(grep -c '^skip ' "$out")
  if [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then
    fail=1
    echo "FAIL $name: exited with status $rc" >>"$out"
  fi
  if [ "$rc" -eq 0 ] && [ "$ok" -eq 0 ] && [ "$fail" -eq 0 ] && [ "$skip" -eq 0 ]; then
    fail=1
    echo "FAIL $name: ran no check" >>"$out"
  fi
  passed=$((passed + ok)); failed=$((failed + fail)); skipped=$((skipped + skip))
  printf '%-40s %4d ok %3d failed  %4ds' "$name" "$ok" "$fail" $((SECONDS - start))
  if [ "$skip" -gt 0 ]; then
    printf '  %d skipped\n' "$skip"
    grep -E '^skip ' "$out" | sed 's/^/    /'
  else
    echo
  fi
  if [ "$fail" -ne 0 ]; then
    grep -E '^FAIL ' "$out" | sed 's/^/    /'
    echo "    --- last lines of output ---"
    tail -n 15 "$out" | sed 's/^/    /'
  fi
}

# summary: the last line, "N passed, N failed[, N skipped]" (CI reads it).
summary() {
  if [ "$skipped" -eq 0 ]; then echo "$passed passed, $failed failed"
  else echo "$passed passed, $failed failed, $skipped skipped"; fi
}

for t in "$build"/tests/test_*; do
  [ -x "$t" ] || continue
  case "$t" in *"$filter"*) run_one "$(basename "$t")" "$t" ;; esac
done
left=()
for t in tests/*/test_*.sh; do
  [ -e "$t" ] || continue
  if [ "$build" != build ] && ! grep -q 'MTRAIN:-build/mtrain' "$t"; then left+=("$(basename "$t")"); continue; fi
  case "${t##*/}" in *"$filter"*) run_one "$(basename "$t")" bash "$t" ;; esac
done
if [ "$build" != build ]; then
  echo "not run against $build (they run build/ programs): ${left[*]} and tests/*/test_*.py"
  summary
  [ "$failed" -eq 0 ]
  exit
fi
for t in tests/*/test_*.py; do
  [ -e "$t" ] || continue
  case "${t##*/}" in *"$filter"*) run_one "$(basename "$t")" /usr/bin/python3 "$t" ;; esac
done

summary
[ "$failed" -eq 0 ]

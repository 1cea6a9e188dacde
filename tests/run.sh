#!/usr/bin/env bash
# run.sh: the test runner. Runs every test program (build/tests/test_*, from
# tests/unit/), every shell test (tests/*/test_*.sh) and every Python test
# (tests/*/test_*.py, with Debian's /usr/bin/python3 that has torch). Each
# prints "ok NAME" or "FAIL NAME: why" per check; a program that exits non-zero
# without printing a FAIL line counts as one failure. Ends with
# "N passed, N failed" and exits non-zero on any failure.
#   tests/run.sh [FILTER]   only tests whose file name contains FILTER
# Tests run MTRAIN_TEST_JOBS at a time (default: the number of cores), the
# longest kinds first (sim/, then mpi/); each line is printed as its test
# ends. The tests that run make on the real tree (SERIAL below) never run
# at the same time as each other. MTRAIN_TEST_JOBS=1 runs one at a time in
# the order above.
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
jobs_max=${MTRAIN_TEST_JOBS:-$(nproc)}
[ "$jobs_max" -ge 1 ] 2>/dev/null || { echo "tests/run.sh: MTRAIN_TEST_JOBS=$jobs_max (expected a count >= 1)" >&2; exit 2; }
# Tests that run make in the real tree (its build/ and gpu-bundle/): one at a time.
SERIAL=" test_docs_commands.sh test_gpu_bundle.sh test_makefile.sh "
passed=0; failed=0; skipped=0
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# report NAME SECONDS: count and print the result of a finished test from
# $log/NAME.out and $log/NAME.rc.
report() {
  local name=$1 seconds=$2
  local out="$log/$name.out" rc ok fail skip
  rc=$(cat "$log/$name.rc")
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
  printf '%-40s %4d ok %3d failed  %4ds' "$name" "$ok" "$fail" "$seconds"
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

# The queue: test names and their commands (a program, or "bash FILE", or
# "python FILE"), longest kinds first.
names=(); commands=()
queue() { case "$1" in *"$filter"*) names+=("$(basename "$1")"); commands+=("$2 $1") ;; esac; }
left=()
for kind in sim mpi repo reference cli unit; do
  for t in tests/$kind/test_*.sh; do
    [ -e "$t" ] || continue
    if [ "$build" != build ] && ! grep -q 'MTRAIN:-build/mtrain' "$t"; then left+=("$(basename "$t")"); continue; fi
    queue "$t" bash
  done
done
for t in "$build"/tests/test_*; do
  [ -x "$t" ] && queue "$t" ""
done
if [ "$build" = build ]; then
  for t in tests/*/test_*.py; do
    [ -e "$t" ] && queue "$t" /usr/bin/python3
  done
fi

# Run the queue, jobs_max at a time; a SERIAL test waits while another runs.
declare -A job_of started_at
running=0 serial_busy=0 next_done=0
taken=()
for i in "${!names[@]}"; do taken[i]=0; done
while [ "$next_done" -lt "${#names[@]}" ]; do
  while [ "$running" -lt "$jobs_max" ]; do
    pick=-1
    for i in "${!names[@]}"; do
      [ "${taken[i]}" -eq 0 ] || continue
      if [[ "$SERIAL" == *" ${names[i]} "* ]] && [ "$serial_busy" -eq 1 ]; then continue; fi
      pick=$i; break
    done
    [ "$pick" -ge 0 ] || break
    taken[pick]=1
    name=${names[pick]}
    [[ "$SERIAL" == *" $name "* ]] && serial_busy=1
    # stdin from /dev/null: a test never reads the runner's input.
    ( ${commands[pick]} >"$log/$name.out" 2>&1 </dev/null; echo $? >"$log/$name.rc" ) &
    job_of[$!]=$name; started_at[$name]=$SECONDS
    running=$((running + 1))
  done
  wait -n -p finished
  name=${job_of[$finished]}
  [[ "$SERIAL" == *" $name "* ]] && serial_busy=0
  running=$((running - 1)); next_done=$((next_done + 1))
  report "$name" $((SECONDS - ${started_at[$name]}))
done

if [ "$build" != build ]; then
  echo "not run against $build (they run build/ programs): ${left[*]} and tests/*/test_*.py"
fi
summary
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# run.sh: runs one libFuzzer target over its corpus, seeded from mtrain's own
# test inputs, and prints its figures (executions, time, coverage).
#   bash tests/fuzz/run.sh NAME RUNS [SEED]    (after make build-fuzz)
# NAME: config_yaml | hf_config | safetensors | shard | tokenizer. SEED:
# libFuzzer's -seed (default 0: a new one each run). Inputs that crash are
# written to build/fuzz/crashes/NAME/ and fail the run; any other step that
# fails is named with its line.
set -euo pipefail
trap 'echo "tests/fuzz/run.sh ${name:-}: line $LINENO failed: $BASH_COMMAND" >&2' ERR
cd "$(dirname "$0")/../.."
name=$1 runs=$2 seed=${3:-0}
corpus=build/fuzz/corpus/$name seeds=build/fuzz/seeds
crashes=build/fuzz/crashes/$name
mkdir -p "$corpus" "$crashes" "$seeds"

# Seeds: the run files in configs/, the tests' tiny tokenizer.json, files
# written by mtrain's own writers (build/fuzz/fuzz_seeds), and every input
# that once crashed a reader (tests/fuzz/regressions/NAME/).
build/fuzz/fuzz_seeds "$seeds"
case $name in
  config_yaml) cp configs/*.yaml "$corpus"/ ;;
  tokenizer) python3 -c '
import os, sys
sys.path.insert(0, "tests/reference")
import test_tokenizer as t
for form in ("string", "array"):
    t.write_json(os.path.join(sys.argv[1], f"tiny_{form}.json"), t.tiny_tokenizer(form))' "$corpus" ;;
  *) cp "$seeds/$name"/* "$corpus"/ ;;
esac
if [ -d tests/fuzz/regressions/"$name" ]; then cp tests/fuzz/regressions/"$name"/* "$corpus"/; fi

log=build/fuzz/$name.log
start=$(date +%s)
status=0
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  build/fuzz/fuzz_"$name" "$corpus" -runs="$runs" -seed="$seed" -max_len=8192 -close_fd_mask=2 -print_final_stats=1 \
  -artifact_prefix="$crashes/" >"$log" 2>&1 || status=$?
seconds=$(( $(date +%s) - start ))
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
feat=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
echo "fuzz $name (seed $seed): ${execs:-?} executions in ${seconds} s, coverage ${cov:-?} edges, ${feat:-?} features," \
     "corpus $(ls "$corpus" | wc -l) inputs, exit $status (log $log)"
if [ "$status" -ne 0 ]; then
  grep -m5 'ERROR\|SUMMARY\|runtime error' "$log" || true
  # The sanitizer's report with its stacks (a CI log keeps it).
  sed -n '/^==[0-9]*==ERROR/,/^SUMMARY/p' "$log" | head -n 80
  # The inputs that failed, in the log as well: a CI run's scratch copy is gone
  # by the time anyone reads it (add them to tests/fuzz/regressions/NAME/).
  for input in "$crashes"/*; do
    [ -f "$input" ] && echo "failing input $input (base64): $(base64 -w0 "$input")"
  done
  exit 1
fi

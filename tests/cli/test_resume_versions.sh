#!/usr/bin/env bash
# test_resume_versions.sh: a checkpoint written by another mtrain version
# resumes by `checkpoint.resume: auto` when no key of its run changed. Its
# state.json's fingerprint then differs (the versions hash other keys), so
# the run's keys are compared one by one: a key the checkpoint lacks (added
# by a later version) is no change at its default and a change otherwise; a
# key only the checkpoint has (one this version no longer hashes, as
# attention.kernels, which says how a run computes) is none. A changed key
# still refuses with one line naming it.
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib/lib.sh

RUN="configs/tiny-cpu.yaml model.hidden_size=32 model.intermediate_size=64 train.seq_len=64 train.warmup_steps=0
     attention.block_size=16 log.every=1"
train() {  # train NAME ARGS...: run NAME in $tmp/NAME (stdout+stderr in $tmp/NAME.out); returns its exit status
  local name=$1
  shift
  # shellcheck disable=SC2086  # $RUN is a list of settings
  "$MTRAIN" train $RUN checkpoint.dir="$tmp/$name" log.dir="$tmp/$name/logs" "$@" >"$tmp/$name.out" 2>&1
}
# older NAME: rewrite NAME's step-2 state.json as an older mtrain wrote it:
# another fingerprint, without the key attention.budget_file (at its default,
# none) and train.seed, with attention.kernels.
older() {
  /usr/bin/python3 - "$tmp/$1/step_00000002/state.json" <<'P'
import json, sys
path = sys.argv[1]
state = json.load(open(path))
lines = [l for l in state["run_keys"].splitlines() if not l.startswith(("attention.budget_file=", "train.seed="))]
state["run_keys"] = "\n".join(lines + ["attention.kernels=auto"]) + "\n"
state["fingerprint"] = "0123456789abcdef"
json.dump(state, open(path, "w"), indent=1)
P
}

for name in same seed; do
  train "$name" train.steps=2
  expect "$name: 2 steps with a checkpoint" '[ -f "$tmp/$name/step_00000002/state.json" ]'
  older "$name"
done

train same train.steps=3
rc=$?
expect "another version's checkpoint, no key changed: resumed at step 2 (exit $rc; $(grep -m1 'resumed\|mtrain:' "$tmp/same.out"))" \
  '[ $rc -eq 0 ] && grep -q "^resumed from .*step_00000002" "$tmp/same.out" && [ -d "$tmp/same/step_00000003" ]'

train seed train.steps=3 train.seed=99
rc=$?
expect "another version's checkpoint, a key it lacks set off its default: refused naming it (exit $rc; $(grep -m1 'mtrain:' "$tmp/seed.out"))" \
  '[ $rc -ne 0 ] && grep -q "train.seed (none) -> 99" "$tmp/seed.out" && [ ! -d "$tmp/seed/step_00000003" ]'

exit $((failures > 0))

#!/usr/bin/env bash
# test_kill_resume.sh: SIGKILL at chosen points, then resume, over and over.
# A tiny run writing a checkpoint after every step (keep 2: every write also
# prunes) is killed 24 times on 1 rank, and 6 times on 2 ranks (cp 2, rank 0
# killed, mpirun ends the other), each time at a point drawn from a seed that
# the test prints (MTRAIN_KILL_SEED=S repeats it) and reached by the run
# itself (MTRAIN_TEST_FAULT=kill:0@POINT#N, dist/test_hooks.h): in start-up, after a
# step, inside a checkpoint write, between a step folder's rename and
# `latest`'s, after `latest`, and inside pruning, the 1st to 3rd time the run
# gets there. No kill races the run's end, so the count does not depend on the
# machine's speed. The run is resumed after each kill and finally run to its
# end: the last checkpoint's weights and AdamW state must be bit-identical to
# an uninterrupted run's, every step must appear once in metrics.jsonl, and
# no leftover of a killed writer may stay.
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib/lib.sh
mpirun_env

seed=${MTRAIN_KILL_SEED:-$(date +%s)}
echo "kill test seed $seed (MTRAIN_KILL_SEED=$seed repeats the kill points)"
RANDOM=$seed
RUN="configs/tiny-cpu.yaml model.hidden_size=32 model.intermediate_size=64 train.seq_len=64 train.warmup_steps=0
     attention.block_size=16 log.every=1000 checkpoint.every=1 checkpoint.keep=2"
POINTS=(start step write rename latest prune)
run() {  # run NP DIR ARGS...: mtrain train into DIR on NP ranks; waits until every rank is gone
  local np=$1 dir=$2
  shift 2
  if [ "$np" -gt 1 ]; then
    mpirun --oversubscribe --bind-to none -np "$np" "$MTRAIN" train $RUN parallel.cp="$np" checkpoint.dir="$dir" \
      log.dir="$dir/logs" "$@" >>"$dir.out" 2>&1 &
  else
    "$MTRAIN" train $RUN checkpoint.dir="$dir" log.dir="$dir/logs" "$@" >>"$dir.out" 2>&1 &
  fi
  wait $! 2>/dev/null  # (no "Killed" line from the shell)
  local rc=$?
  # mpirun may exit before its other ranks are gone (a sanitizer build takes
  # a while to unmap); a writer still alive keeps its leftover, by design.
  while pgrep -f -- "checkpoint.dir=$dir log.dir" >/dev/null; do sleep 0.05; done
  return $rc
}

# kill_and_resume NAME NP STEPS KILLS: the uninterrupted run, then KILLS
# launches each killed at a drawn point, with a resume after each, then the
# run to its end. A launch makes at most 3 steps of progress before its kill,
# so STEPS > 3 KILLS leaves every kill point reachable.
kill_and_resume() {
  local name=$1 np=$2 steps=$3 kills=$4 ref="$tmp/$1.ref" dir="$tmp/$1"
  run "$np" "$ref" train.steps="$steps"
  local launches=0 done_kills=0 points="" point nth
  while [ "$launches" -lt "$kills" ]; do
    point=${POINTS[RANDOM % ${#POINTS[@]}]}
    nth=$((RANDOM % 3 + 1))
    [ "$point" = start ] && nth=1
    points="$points $point#$nth"
    MTRAIN_TEST_FAULT="kill:0@$point#$nth" run "$np" "$dir" train.steps="$steps"
    launches=$((launches + 1))
    done_kills=$(grep -c "^rank 0: MTRAIN_TEST_FAULT: kill at the fault point" "$dir.out")
  done
  echo "$name: kill points:$points"
  run "$np" "$dir" train.steps="$steps"
  local rc=$?
  local landed
  landed=$(grep -c "^warning: .*\(removed (left by process\|restored from\)" "$dir.out")
  echo "$name: $done_kills kills; leftovers of killed checkpoint writes and prunes cleaned up at restart: $landed"
  local last
  last=$(printf 'step_%08d' "$steps")
  expect "$name: every one of the $kills launches killed at its point (killed: $done_kills)" '[ "$done_kills" -eq "$kills" ]'
  expect "$name: the resumed run ends (rc $rc)" '[ $rc -eq 0 ] && [ -f "$dir/$last/state.json" ]'
  expect "$name: final weights and AdamW state bit-identical to the uninterrupted run" \
    'cmp -s "$dir/$last/model.safetensors" "$ref/$last/model.safetensors" && cmp -s "$dir/$last/optimizer.zst" "$ref/$last/optimizer.zst"'
  local logged
  logged=$(grep -o '^{"step": [0-9]*' "$dir/logs/metrics.jsonl" | grep -o '[0-9]*$' | tr '\n' ' ')
  expect "$name: metrics.jsonl holds steps 1..$steps once each" '[ "$logged" = "$(seq -s " " 1 "$steps") " ]'
  local leftovers
  leftovers=$(find "$dir" -maxdepth 2 -name '*.tmp.*' -o -name '*.old.*' -o -name '*.del.*' | tr '\n' ' ')
  expect "$name: no leftover of a killed writer stays (found: ${leftovers:-none})" '[ -z "$leftovers" ]'
  expect "$name: the keep policy holds (2 checkpoints)" '[ "$(ls -d "$dir"/step_???????? | wc -l)" = 2 ]'
}
kill_and_resume one_rank 1 80 24
kill_and_resume two_ranks 2 24 6
exit $((failures > 0))

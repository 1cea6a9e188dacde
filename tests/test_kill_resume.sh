#!/usr/bin/env bash
# test_kill_resume.sh: SIGKILL at random moments, then resume, over and over.
# A tiny run writing a checkpoint after every step (keep 2: every write also
# prunes) is killed 24 times on 1 rank, and 6 times on 2 ranks (cp 2, every
# rank killed at once), at moments drawn from a seed that the test prints
# (MTRAIN_KILL_SEED=S repeats it); kills land in start-up, in steps, inside
# checkpoint writes and inside pruning. The run is resumed after each kill and
# finally run to its end: the last checkpoint's weights and AdamW state must be
# bit-identical to an uninterrupted run's, every step must appear once in
# metrics.jsonl, and no leftover of a killed writer may stay.
set -u
cd "$(dirname "$0")/.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib.sh
mpirun_env

seed=${MTRAIN_KILL_SEED:-$(date +%s)}
echo "kill test seed $seed (MTRAIN_KILL_SEED=$seed repeats the delays)"
RANDOM=$seed
RUN="configs/tiny-cpu.yaml model.hidden_size=32 model.intermediate_size=64 train.seq_len=64 train.warmup_steps=0
     attention.block_size=16 log.every=1000 checkpoint.every=1 checkpoint.keep=2"
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
launch() {  # launch NP DIR ARGS...: mtrain train into DIR on NP ranks, in the background
  local np=$1 dir=$2
  shift 2
  if [ "$np" -gt 1 ]; then
    mpirun --oversubscribe --bind-to none -np "$np" "$MTRAIN" train $RUN parallel.cp="$np" checkpoint.dir="$dir" \
      log.dir="$dir/logs" "$@" >>"$dir.out" 2>&1 &
  else
    "$MTRAIN" train $RUN checkpoint.dir="$dir" log.dir="$dir/logs" "$@" >>"$dir.out" 2>&1 &
  fi
}

newest_step() {  # newest_step DIR: the newest step folder's step, 0 when none
  local newest
  newest=$(ls -d "$1"/step_???????? 2>/dev/null | tail -1)
  [ -n "$newest" ] && echo $((10#${newest##*_})) || echo 0
}

# kill_and_resume NAME NP STEPS KILLS: the uninterrupted run, then KILLS
# random SIGKILLs with a resume after each, then the run to its end.
kill_and_resume() {
  local name=$1 np=$2 steps=$3 kills=$4 ref="$tmp/$1.ref" dir="$tmp/$1"
  # Start-up: until the first checkpoint is in place; then the time per step.
  local start first_ms=0
  start=$(now_ms)
  launch "$np" "$ref" train.steps="$steps"
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    [ "$first_ms" -eq 0 ] && [ "$(newest_step "$ref")" -gt 0 ] && first_ms=$(( $(now_ms) - start ))
    sleep 0.01
  done
  wait "$pid"
  local startup_ms=$first_ms step_ms=$(( ($(now_ms) - start - first_ms) / steps + 1 ))
  # Where each kill lands is chosen by progress, not by the clock, so a slow
  # or loaded machine cannot let the run end before its kills are done: one
  # launch in four is killed at a random moment of its start-up (loading,
  # recovering leftovers); the others once 1 to 3 new checkpoints are in place,
  # a random part of a step later (inside the next step, its checkpoint write
  # or its pruning). A launch thus does at most about 4 steps.
  local done_kills=0 landed=0 before=0
  echo "$name: start-up $startup_ms ms, $step_ms ms per step with its checkpoint"
  while [ "$done_kills" -lt "$kills" ]; do
    launch "$np" "$dir" train.steps="$steps"
    local pid=$! target=$((RANDOM % 4)) delay
    if [ "$target" -eq 0 ]; then
      delay=$(( RANDOM * startup_ms / 32768 ))
    else
      while kill -0 "$pid" 2>/dev/null && [ "$(newest_step "$dir")" -lt $((before + target)) ]; do sleep 0.005; done
      delay=$(( RANDOM * step_ms / 32768 ))
    fi
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    local victims=$pid
    if [ "$np" -gt 1 ]; then  # every rank, once mpirun has started them all
      for _ in $(seq 50); do
        victims=$(pgrep -P "$pid" -x mtrain | tr '\n' ' ')
        [ "$(echo $victims | wc -w)" -ge "$np" ] || ! kill -0 "$pid" 2>/dev/null && break
        sleep 0.1
      done
    fi
    # shellcheck disable=SC2086
    if [ -n "$victims" ] && kill -9 $victims 2>/dev/null; then done_kills=$((done_kills + 1)); fi
    wait "$pid" 2>/dev/null
    # mpirun may exit before its killed ranks are gone (a sanitizer build takes
    # a while to unmap); a writer still alive keeps its leftover, by design.
    # shellcheck disable=SC2086
    while kill -0 $victims 2>/dev/null; do sleep 0.01; done
    [ -f "$dir/step_$(printf %08d "$steps")/state.json" ] && break
    before=$(newest_step "$dir")
  done
  launch "$np" "$dir" train.steps="$steps"
  wait $!
  local rc=$?
  landed=$(grep -c "^warning: .*\(removed (left by process\|restored from\)" "$dir.out")
  echo "$name: $done_kills kills; leftovers of killed checkpoint writes and prunes cleaned up at restart: $landed"
  local last
  last=$(printf 'step_%08d' "$steps")
  expect "$name: $done_kills kills (at least $kills) before the run ended" '[ "$done_kills" -ge "$kills" ]'
  expect "$name: the resumed run ends (rc $rc)" '[ $rc -eq 0 ] && [ -f "$dir/$last/state.json" ]'
  expect "$name: final weights and AdamW state bit-identical to the uninterrupted run" \
    'cmp -s "$dir/$last/model.safetensors" "$ref/$last/model.safetensors" && cmp -s "$dir/$last/optimizer.zst" "$ref/$last/optimizer.zst"'
  local logged
  logged=$(grep -o '^{"step": [0-9]*' "$dir/logs/metrics.jsonl" | grep -o '[0-9]*$' | tr '\n' ' ')
  expect "$name: metrics.jsonl holds steps 1..$steps once each" '[ "$logged" = "$(seq -s " " 1 "$steps") " ]'
  # (A leftover whose process id a live process has taken since is kept.)
  local leftovers="" path
  for path in $(find "$dir" -maxdepth 2 -name '*.tmp.*' -o -name '*.old.*' -o -name '*.del.*'); do
    kill -0 "${path##*.}" 2>/dev/null || leftovers="$leftovers $path"
  done
  expect "$name: no leftover of a killed writer stays (found:${leftovers:- none})" '[ -z "$leftovers" ]'
  expect "$name: the keep policy holds (2 checkpoints)" '[ "$(ls -d "$dir"/step_???????? | wc -l)" = 2 ]'
}
kill_and_resume one_rank 1 200 24
kill_and_resume two_ranks 2 60 6
exit $((failures > 0))

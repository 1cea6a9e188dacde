#!/usr/bin/env bash
# test_launcher_gone.sh: ranks whose launcher is killed (kill -9 of mpirun,
# 2 ranks, a checkpoint every step) stop within one step, writing at most the
# checkpoint whose write had begun, and leave no process behind.
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib/lib.sh
mpirun_env
export OMP_NUM_THREADS=1

RUN="configs/tiny-cpu.yaml model.hidden_size=32 model.intermediate_size=64 train.steps=100000 train.seq_len=64
     train.warmup_steps=0 attention.block_size=16 log.every=1 checkpoint.every=1 checkpoint.keep=2"
# shellcheck disable=SC2086  # $RUN is a list of settings
mpirun --oversubscribe --bind-to none -np 2 "$MTRAIN" train $RUN parallel.dp=2 checkpoint.dir="$tmp/ck" \
  log.dir="$tmp/ck/logs" >"$tmp/out" 2>&1 </dev/null &
launcher=$!
for _ in $(seq 1200); do  # the hang guard: 120 s for step 3's checkpoint
  [ -d "$tmp/ck/step_00000003" ] || ! kill -0 "$launcher" 2>/dev/null && break
  sleep 0.1
done
ranks=$(pgrep -P "$launcher" | tr '\n' ' ')
kill -9 "$launcher"
wait "$launcher" 2>/dev/null
at_kill=$(sed 's/^step_0*//' "$tmp/ck/latest")
alive=$ranks
for _ in $(seq 1200); do  # the hang guard: 120 s for the ranks to stop
  alive=""
  for pid in $ranks; do kill -0 "$pid" 2>/dev/null && alive="$alive $pid"; done
  [ -z "$alive" ] && break
  sleep 0.1
done
final=$(sed 's/^step_0*//' "$tmp/ck/latest")
expect "the ranks ($ranks) of a killed mpirun stop (still alive: ${alive:-none})" '[ -n "$ranks" ] && [ -z "$alive" ]'
expect "they write no checkpoint after the one being written (latest: step $at_kill at the kill, $final after)" \
  '[ -n "$at_kill" ] && [ "$final" -le $((at_kill + 1)) ]'
for pid in $alive; do kill -9 "$pid"; done
exit $((failures > 0))

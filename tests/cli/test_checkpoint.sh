#!/usr/bin/env bash
# test_checkpoint.sh: checkpoints and resume through build/mtrain: bit-identical
# resume (after a clean stop, after a lost checkpoint, after kill -9), a
# half-written checkpoint ignored, the keep policy, checkpoint.final=false, a checkpoint of another
# model refused without damage, train.init_from, and checkpoints as HF folders.
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib/lib.sh

cat >"$tmp/run.yaml" <<EOF
model:
  hidden_size: 32
  intermediate_size: 64
  num_layers: 2
  num_heads: 4
  num_kv_heads: 2
  vocab_size: 64
train:
  steps: 12
  seq_len: 64
  lr: 3e-3
  warmup_steps: 2
  micro_batches: 2
log:
  dir: $tmp/logs
  every: 100
EOF
train() { "$MTRAIN" train "$tmp/run.yaml" "$@" >>"$tmp/out.txt" 2>&1; }
same() { cmp -s "$1/model.safetensors" "$2/model.safetensors" && cmp -s "$1/optimizer.zst" "$2/optimizer.zst"; }

# Reference: 12 steps without interruption (cosine schedule).
train checkpoint.dir="$tmp/ref" checkpoint.every=4
expect "uninterrupted run writes step 12" '[ -f "$tmp/ref/step_00000012/state.json" ]'
expect "latest points at step 12" '[ "$(cat "$tmp/ref/latest")" = step_00000012 ]'
# checkpoint.final=false: no checkpoint after the last step, those of `every` still written.
train checkpoint.dir="$tmp/nofinal" checkpoint.every=5 checkpoint.final=false
expect "checkpoint.final=false: steps 5 and 10 written, not 12 ($(ls "$tmp/nofinal" 2>&1 | tr '\n' ' '))" \
  '[ -f "$tmp/nofinal/step_00000010/state.json" ] && [ -f "$tmp/nofinal/step_00000005/state.json" ] && [ ! -e "$tmp/nofinal/step_00000012" ]'

# A crash after step 8's checkpoint: step 12 lost, resume continues from 8.
cp -r "$tmp/ref" "$tmp/crash"
rm -rf "$tmp/crash/step_00000012"
train checkpoint.dir="$tmp/crash"
expect "resume logs the checkpoint it continued from" 'grep -q "resumed from $tmp/crash/step_00000008: step 8" "$tmp/out.txt"'
expect "resumed from step 8 to 12 is bit-identical" 'same "$tmp/ref/step_00000012" "$tmp/crash/step_00000012"'

# train.steps is the total: 8 steps, then the same run file extended to 12 (constant LR).
train checkpoint.dir="$tmp/const_ref" train.lr_schedule=constant
train checkpoint.dir="$tmp/const" train.lr_schedule=constant train.steps=8
train checkpoint.dir="$tmp/const" train.lr_schedule=constant
expect "8 steps resumed to 12 equals 12 steps" 'same "$tmp/const_ref/step_00000012" "$tmp/const/step_00000012"'

# A half-written checkpoint (process killed while writing) is ignored.
cp -r "$tmp/ref" "$tmp/half"
rm -rf "$tmp/half/step_00000012"
mkdir "$tmp/half/step_00000012.tmp.4242"
head -c 100 "$tmp/ref/step_00000012/model.safetensors" >"$tmp/half/step_00000012.tmp.4242/model.safetensors"
: >"$tmp/out.txt"
train checkpoint.dir="$tmp/half"
expect "half-written checkpoint ignored, previous one used" 'grep -q "resumed from $tmp/half/step_00000008" "$tmp/out.txt" && same "$tmp/ref/step_00000012" "$tmp/half/step_00000012"'

# kill -9 mid-run (checkpoint every step): the run holds after step 7's
# update, before its checkpoint (MTRAIN_TEST_FAULT's stall at the 7th step),
# is killed there, and the resume from step 6 ends bit-identical.
MTRAIN_TEST_FAULT=stall:0@step#7 "$MTRAIN" train "$tmp/run.yaml" checkpoint.dir="$tmp/killed" checkpoint.every=1 \
  parallel.timeout_s=60 >"$tmp/killed.out" 2>&1 &
pid=$!
for _ in $(seq 6000); do  # at most 10 min: a hang guard
  grep -q "stall at the fault point step" "$tmp/killed.out" && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
rc=$?
expect "kill -9 landed mid-run: at step 7, step 6 the last checkpoint (exit $rc; latest $(cat "$tmp/killed/latest" 2>&1))" \
  '[ $rc -eq 137 ] && [ "$(cat "$tmp/killed/latest")" = step_00000006 ] && [ ! -e "$tmp/killed/step_00000007" ]'
: >"$tmp/out.txt"
train checkpoint.dir="$tmp/killed"
expect "resume after kill -9 continues from step 6 and ends bit-identical" \
  'grep -q "resumed from $tmp/killed/step_00000006: step 6" "$tmp/out.txt" && same "$tmp/ref/step_00000012" "$tmp/killed/step_00000012"'

# Keep policy: every 2 steps, keep the newest 2, keep every 4th for good.
train checkpoint.dir="$tmp/keep" checkpoint.every=2 checkpoint.keep=2 checkpoint.keep_every=4 train.steps=10
kept=$(cd "$tmp/keep" && ls -d step_* | tr '\n' ' ')
expect "keep policy leaves steps 4 8 10 (got: $kept)" '[ "$kept" = "step_00000004 step_00000008 step_00000010 " ]'

# A checkpoint of another model shape is refused, and left untouched: resume
# auto names the run's differing key; an explicit checkpoint.resume warns that
# the run differs, then names the field.
sum_before=$(cat "$tmp/ref/step_00000012"/* | md5sum)
"$MTRAIN" train "$tmp/run.yaml" checkpoint.dir="$tmp/ref" model.hidden_size=48 train.steps=20 >"$tmp/shape.out" 2>"$tmp/shape.err"
rc=$?
expect "other model shape exits non-zero" '[ $rc -ne 0 ]'
expect "other model shape: one line naming the key" '[ $(wc -l <"$tmp/shape.err") -eq 1 ] && grep -q "step_00000012: a checkpoint of another run (model.hidden_size 32 -> 48)" "$tmp/shape.err"'
"$MTRAIN" train "$tmp/run.yaml" checkpoint.dir="$tmp/shape" checkpoint.resume="$tmp/ref/step_00000012" model.hidden_size=48 \
  train.steps=20 >"$tmp/shape.out" 2>"$tmp/shape.err"
rc=$?
expect "explicit resume of another shape exits non-zero" '[ $rc -ne 0 ]'
expect "explicit resume of another shape: the field" 'grep -q "^warning: .*step_00000012: resuming a checkpoint of another run" "$tmp/shape.err" && grep -q "step_00000012/config.json: checkpoint has hidden_size 32 but the run has 48" "$tmp/shape.err" && [ $(wc -l <"$tmp/shape.err") -eq 2 ]'
expect "refused checkpoint is unchanged" '[ "$(cat "$tmp/ref/step_00000012"/* | md5sum)" = "$sum_before" ]'

# Checkpoints are Hugging Face folders: score loads one; init_from starts from one.
printf '1 2 3 4 5 6 7 8 9 10\n' >"$tmp/tokens.txt"
expect "checkpoint folder scores as an HF model" '"$MTRAIN" score --model "$tmp/ref/step_00000012" --tokens "$tmp/tokens.txt" | grep -q "^loss "'
: >"$tmp/out.txt"
train checkpoint.dir="$tmp/init" checkpoint.resume=never train.init_from="$tmp/ref/step_00000012" train.steps=1 train.warmup_steps=0 train.lr=0
expect "init_from loads the folder" 'grep -q "initialised from $tmp/ref/step_00000012" "$tmp/out.txt"'
expect "init_from with lr 0 keeps the weights exactly" 'cmp -s "$tmp/ref/step_00000012/model.safetensors" "$tmp/init/step_00000001/model.safetensors"'
"$MTRAIN" train "$tmp/run.yaml" checkpoint.dir="$tmp/init2" train.init_from="$tmp/nothing" >/dev/null 2>"$tmp/init.err"
expect "init_from a missing folder: clear error" 'grep -q "train.init_from: .*nothing: no config.json there" "$tmp/init.err"'

exit $((failures > 0))

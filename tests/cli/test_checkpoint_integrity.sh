#!/usr/bin/env bash
# test_checkpoint_integrity.sh: checkpoints that cannot be mixed up, through
# build/mtrain on one rank. Every reader of a step folder (resume,
# train.init_from, eval, generate, export, score) checks the weights against
# state.json's XXH64; state.json binds the optimizer file (its name and XXH64)
# and its fields agree (tokens_seen = data_cursor x seq_len, bad steps within
# the steps); a damaged old folder is skipped with a warning, never stops a
# run; a roll-back refuses to overwrite another run's steps and its
# metrics.jsonl starts with the parent's lines; a folder where a file should
# be is named; a zombie writer's temporary folder is removed; eval reads a
# read-only checkpoint.dir; generate keeps to the model's context; tokenize
# refuses to overwrite its input; resume is not blocked by a clamped warmup
# and names another global batch.
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib/lib.sh

RUN="configs/tiny-cpu.yaml model.hidden_size=32 model.intermediate_size=64 train.steps=6 train.seq_len=64
     train.warmup_steps=0 attention.block_size=16 log.every=1 checkpoint.every=1 checkpoint.keep=100"
train() {  # train NAME ARGS...: run NAME in $tmp/NAME (stdout+stderr in $tmp/NAME.out); returns its exit status
  local name=$1
  shift
  # shellcheck disable=SC2086  # $RUN is a list of settings
  "$MTRAIN" train $RUN checkpoint.dir="$tmp/$name" log.dir="$tmp/$name/logs" "$@" >"$tmp/$name.out" 2>&1
}
# one_line NAME RC OUT PATTERN: exit non-zero and OUT is one line (warnings and notes aside) matching PATTERN.
one_line() {
  local lines
  lines=$(grep -vc '^warning\|^note' "$3")
  if [ "$2" -ne 0 ] && [ "$lines" = 1 ] && grep -q -- "$4" "$3"; then ok "$1: exit $2, one line"
  else bad "$1" "exit $2, $lines lines, wanted one matching '$4': $(head -c 400 "$3")"; fi
}

train ref
ref="$tmp/ref"
expect "state.json names its optimizer file with its XXH64" \
  'grep -q "\"optimizer\":[[:space:]]*\"optimizer.zst\"" "$ref/step_00000006/state.json" && grep -q "\"optimizer_xxh64\":[[:space:]]*\"[0-9a-f]\{16\}\"" "$ref/step_00000006/state.json"'

# 1. Weights damaged after the write (1e30 into one weight): every reader
# refuses with one line naming model.safetensors.
cp -r "$ref" "$tmp/dmg"
f="$tmp/dmg/step_00000006/model.safetensors"
printf '\xca\xf2\x49\x71' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 64 )) conv=notrunc status=none
pattern="step_00000006/model.safetensors: checksum mismatch"
"$MTRAIN" export "$tmp/dmg/step_00000006" "$tmp/dmg_export" >"$tmp/export.out" 2>&1
one_line "damaged weights: export" $? "$tmp/export.out" "$pattern"
"$MTRAIN" eval $RUN checkpoint.dir="$tmp/dmg" eval.model="$tmp/dmg/step_00000006" eval.tasks=perplexity \
  eval.lengths=64 eval.samples=1 eval.out="$tmp/dmg_eval" >"$tmp/eval.out" 2>&1
one_line "damaged weights: eval" $? "$tmp/eval.out" "$pattern"
echo "1 2 3 4 5" >"$tmp/tokens.txt"
"$MTRAIN" generate --model "$tmp/dmg/step_00000006" --tokens "$tmp/tokens.txt" --max-new 2 >"$tmp/gen.out" 2>&1
one_line "damaged weights: generate" $? "$tmp/gen.out" "$pattern"
"$MTRAIN" score --model "$tmp/dmg/step_00000006" --tokens "$tmp/tokens.txt" >"$tmp/score.out" 2>&1
one_line "damaged weights: score" $? "$tmp/score.out" "$pattern"
train init_dmg train.init_from="$tmp/dmg/step_00000006" train.steps=1
rc=$?
expect "damaged weights: train.init_from: exit non-zero, one error line naming the file (rc $rc)" \
  '[ $rc -ne 0 ] && [ "$(grep -c "^mtrain: " "$tmp/init_dmg.out")" = 1 ] && grep -q "^mtrain: .*$pattern" "$tmp/init_dmg.out" && ! [ -d "$tmp/init_dmg/step_00000001" ]'

train dmg train.steps=7
one_line "damaged weights: resume" $? "$tmp/dmg.out" "$pattern"

# 2. The optimizer state is bound to its step: step 5's optimizer.zst in
# step 6 is refused, naming it.
cp -r "$ref" "$tmp/opt"
cp "$ref/step_00000005/optimizer.zst" "$tmp/opt/step_00000006/optimizer.zst"
train opt train.steps=7
one_line "step 5's optimizer.zst in step 6: resume" $? "$tmp/opt.out" \
  "step_00000006/optimizer.zst: XXH64 [0-9a-f]*, state.json records [0-9a-f]* (the optimizer state of another checkpoint)"

# A checkpoint written before state.json named its optimizer file (both
# fields removed): it resumes, says the optimizer state is read unverified,
# and ends where the checkpoint with the fields ends (the same step 7).
cp -r "$ref" "$tmp/legacy"
cp -r "$ref" "$tmp/current"
sed -i '/"optimizer":/d; /"optimizer_xxh64":/d' "$tmp/legacy/step_00000006/state.json"
train legacy train.steps=7
rc=$?
train current train.steps=7
expect "an older checkpoint without the optimizer fields resumes with a note, the same as with them (rc $rc)" \
  '[ $rc -eq 0 ] && grep -q "^note: .*step_00000006/state.json records no optimizer digest (an older checkpoint): optimizer.zst is read unverified" "$tmp/legacy.out" && cmp -s "$tmp/legacy/step_00000007/model.safetensors" "$tmp/current/step_00000007/model.safetensors"'

# 3. state.json's fields must agree with each other.
cp -r "$ref" "$tmp/cursor"
sed -i 's/"data_cursor":[^,]*,/"data_cursor": 7,/' "$tmp/cursor/step_00000006/state.json"
train cursor train.steps=7
one_line "data_cursor 6 -> 7 (tokens_seen 384 = 6 x 64)" $? "$tmp/cursor.out" \
  "step_00000006/state.json: tokens_seen 384 is not data_cursor 7 x train.seq_len 64"
cp -r "$ref" "$tmp/badcount"
sed -i 's/"bad_steps_in_a_row":[^,]*,/"bad_steps_in_a_row": 9e15,/' "$tmp/badcount/step_00000006/state.json"
train badcount train.steps=7
one_line "bad_steps_in_a_row 9e15" $? "$tmp/badcount.out" \
  "step_00000006/state.json: bad_steps_in_a_row 9000000000000000 is more than step 6"

# 4. A damaged old folder never stops a run: pruning and the scan skip it
# with a warning; a damaged newest one falls back to the one before it.
cp -r "$ref" "$tmp/old"
echo garbage >"$tmp/old/step_00000002/state.json"
train old train.steps=7 checkpoint.keep=2
rc=$?
expect "garbage in an old step's state.json: the run resumes, prunes and ends (rc $rc), one warning naming it" \
  '[ $rc -eq 0 ] && [ -f "$tmp/old/step_00000007/state.json" ] && ! [ -d "$tmp/old/step_00000005" ] && [ -d "$tmp/old/step_00000002" ] && [ "$(grep -c "^warning: $tmp/old/step_00000002: state.json is not a JSON object" "$tmp/old.out")" = 1 ]'
# Another checkpoint's optimizer.index.json beside the right optimizer.zst:
# state.json names optimizer.zst, which is used (the same step 7).
cp -r "$ref" "$tmp/index"
printf '{"parameters": 1, "shards": []}' >"$tmp/index/step_00000006/optimizer.index.json"
train index train.steps=7
expect "a stray optimizer.index.json beside optimizer.zst: state.json's optimizer.zst is used (exit $?)" \
  'cmp -s "$tmp/index/step_00000007/model.safetensors" "$tmp/old/step_00000007/model.safetensors"'
train old train.steps=8 checkpoint.keep=2
rc=$?
expect "and the next restart goes on (rc $rc)" '[ $rc -eq 0 ] && [ -f "$tmp/old/step_00000008/state.json" ]'
cp -r "$ref" "$tmp/newest"
echo garbage >"$tmp/newest/step_00000006/state.json"
train newest train.steps=7 train.micro_batches=2
rc=$?
expect "garbage in the newest step's state.json: step 5 is resumed, with a warning (rc $rc)" \
  '[ $rc -eq 0 ] && grep -q "^warning: $tmp/newest/step_00000006: state.json is not a JSON object" "$tmp/newest.out" && grep -q "^resumed from $tmp/newest/step_00000005: step 5" "$tmp/newest.out"'
expect "a resume with another global batch (train.micro_batches 1 -> 2) says so in one line" \
  '[ "$(grep -c "^note: the checkpoint.s steps were made on dp 1 x cp 1, layout [a-z]*, 1 sequence a step; this run.s are on dp 1 x cp 1, layout [a-z]*, 2 sequences a step$" "$tmp/newest.out")" = 1 ]'
cp -r "$ref" "$tmp/never"
echo garbage >"$tmp/never/step_00000003/state.json"
train never checkpoint.resume=never checkpoint.overwrite=true train.seed=7 train.steps=1
expect "resume never with overwrite: a damaged folder is skipped with a warning (rc $?)" \
  '[ -f "$tmp/never/step_00000001/state.json" ] && grep -q "^warning: $tmp/never/step_00000003: state.json is not" "$tmp/never.out"'

# 5. A roll-back never overwrites another run's steps unless asked; its
# metrics.jsonl starts with the parent's lines, whatever ran last (another
# run, then the first roll-back).
train parent train.steps=10 checkpoint.every=2 log.dir="$tmp/shared"
sum=$(md5sum <"$tmp/parent/step_00000010/model.safetensors")
train other train.steps=3 log.dir="$tmp/shared"
train parent checkpoint.resume="$tmp/parent/step_00000004" train.lr=1e-3 train.steps=10 checkpoint.every=2 \
  log.dir="$tmp/shared"
one_line "roll-back to step 4 over the parent's steps 6, 8, 10" $? "$tmp/parent.out" \
  "step_00000004: a roll-back to step 4, and $tmp/parent holds another run's steps 6, 8, 10 up to train.steps, which it would overwrite: use another checkpoint.dir, or checkpoint.overwrite=true"
expect "the refused roll-back leaves the parent's step 10 as it was" \
  '[ "$(md5sum <"$tmp/parent/step_00000010/model.safetensors")" = "$sum" ]'
metric_steps() { grep -o '^{"step": [0-9]*' "$1" | grep -o '[0-9]*$' | tr '\n' ' '; }
for round in 1 2; do
  train parent checkpoint.resume="$tmp/parent/step_00000004" train.lr=1e-3 train.steps=10 checkpoint.every=2 \
    checkpoint.overwrite=true log.dir="$tmp/shared"
  rc=$?
  expect "roll-back $round with checkpoint.overwrite after another run wrote last: metrics.jsonl holds steps 1-10 (rc $rc; got $(metric_steps "$tmp/shared/metrics.jsonl"))" \
    '[ $rc -eq 0 ] && [ "$(metric_steps "$tmp/shared/metrics.jsonl")" = "$(seq -s " " 1 10) " ]'
done

# 6. A folder where a file should be: one line naming it.
cp -r "$ref" "$tmp/kind"
rm "$tmp/kind/latest" && mkdir "$tmp/kind/latest"
train kind train.steps=7
one_line "latest is a folder" $? "$tmp/kind.out" "$tmp/kind/latest: is a folder (expected a file)"
mkdir "$tmp/dir.shard"
train kind_data data.train="$tmp/dir.shard"
one_line "a data.train shard that is a folder" $? "$tmp/kind_data.out" "$tmp/dir.shard: is a folder (expected a file)"

# 7. A writer that exited but was not reaped (a zombie, as rank 0 is briefly
# after mpirun ends) is gone: its step_N.tmp.PID is removed at start. And a
# key the user never set does not block a resume: warmup 5 is clamped to
# train.steps 1, and steps 2 continues it.
/usr/bin/python3 -c 'import os, sys, time
pid = os.fork()
if pid == 0: os._exit(0)
print(pid, flush=True)
time.sleep(60)' >"$tmp/zombie.pid" &
parent=$!
until [ -s "$tmp/zombie.pid" ]; do sleep 0.05; done
zombie=$(cat "$tmp/zombie.pid")
mkdir -p "$tmp/warm/step_00000009.tmp.$zombie"
train warm train.steps=1 train.warmup_steps=5
expect "a zombie writer's step_00000009.tmp.$zombie is removed with a warning" \
  '! [ -e "$tmp/warm/step_00000009.tmp.$zombie" ] && grep -q "step_00000009.tmp.$zombie: removed (left by process $zombie, which is gone)" "$tmp/warm.out"'
kill "$parent"
wait "$parent" 2>/dev/null
train warm train.steps=2 train.warmup_steps=5
rc=$?
expect "train.steps 1 then 2 with warmup 5: resumed (rc $rc)" \
  '[ $rc -eq 0 ] && grep -q "^resumed from $tmp/warm/step_00000001: step 1" "$tmp/warm.out" && [ -f "$tmp/warm/step_00000002/state.json" ]'

# 8. eval with an explicit eval.model reads a checkpoint.dir it may not
# write (/proc/sys is read-only, for root too).
"$MTRAIN" eval $RUN checkpoint.dir=/proc/sys/mtrain_checkpoints log.dir=/proc/sys/mtrain_logs \
  eval.model="$ref/step_00000006" eval.tasks=perplexity eval.lengths=64 eval.samples=1 eval.out="$tmp/ro_eval" \
  >"$tmp/ro.out" 2>&1
expect "eval with eval.model and a read-only checkpoint.dir and log.dir runs (exit $?)" '[ -f "$tmp/ro_eval/results.json" ]'

# 9. generate keeps to the model's context (max_position_embeddings 256).
yes 7 | head -300 | tr '\n' ' ' >"$tmp/long.txt"
"$MTRAIN" generate --model "$ref/step_00000006" --tokens "$tmp/long.txt" >"$tmp/long.out" 2>&1
one_line "generate: a 300-token prompt on a 256-position model" $? "$tmp/long.out" \
  "generate: the prompt has 300 tokens, the model's context is 256 (model.max_position_embeddings"
"$MTRAIN" generate --model "$ref/step_00000006" --tokens "$tmp/tokens.txt" --max-new 1000000000 --ids \
  >"$tmp/many.out" 2>"$tmp/many.err"
rc=$?
expect "generate --max-new 1e9: capped to the context (251 new tokens), with a note (rc $rc)" \
  '[ $rc -eq 0 ] && [ "$(wc -w <"$tmp/many.out")" = 251 ] && grep -q "^note: generate: --max-new 1000000000 capped to 251" "$tmp/many.err"'

# 10. tokenize refuses an output that is one of its inputs.
for i in $(seq 50); do echo "document $i"; done >"$tmp/in.txt"
cp "$tmp/in.txt" "$tmp/in.copy"
"$MTRAIN" tokenize --tokenizer bytes --input "$tmp/in.txt" --output "$tmp/in.txt" --force >"$tmp/tok.out" 2>&1
one_line "tokenize --output = --input" $? "$tmp/tok.out" "$tmp/in.txt: --output is the --input $tmp/in.txt"
expect "tokenize: the input is unchanged" 'cmp -s "$tmp/in.txt" "$tmp/in.copy"'

exit $((failures > 0))

#!/usr/bin/env bash
# test_checkpoint_safety.sh: bad steps and the checkpoint folder's safety
# through build/mtrain. Bad steps (MTRAIN_TEST_NAN_STEP) on 1 rank and on 2
# ranks (dp 2, cp 2): the step is skipped on every rank (weights and AdamW
# state unchanged), logged with step and rank, the run goes on;
# train.max_bad_steps in a row stop it with one line, checkpoints kept.
# Checkpoints: a replaced step folder, and leftovers of dead writers
# (.tmp/.old/.del), recovered; the run fingerprint refuses another run's
# folder (resume never without checkpoint.overwrite, and auto); pruning keeps
# the checkpoint resumed from and the one just written; a flipped byte in the
# weights, an out-of-range state.json and a step beyond train.steps are
# refused with one line; a stray empty step folder does not block auto; no
# step appears twice in metrics.jsonl after a resume.
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib/lib.sh
mpirun_env

RUN="configs/tiny-cpu.yaml model.hidden_size=32 model.intermediate_size=64 train.steps=6 train.seq_len=64
     train.warmup_steps=0 attention.block_size=16 log.every=1 checkpoint.every=1 checkpoint.keep=100"
train() {  # train NP NAME ARGS...: run NAME in $tmp/NAME on NP ranks (stdout+stderr in $tmp/NAME.out)
  local np=$1 name=$2
  shift 2
  if [ "$np" -gt 1 ]; then
    mpirun --oversubscribe --bind-to none -np "$np" "$MTRAIN" train $RUN checkpoint.dir="$tmp/$name" \
      log.dir="$tmp/$name/logs" "$@" >"$tmp/$name.out" 2>&1
  else
    "$MTRAIN" train $RUN checkpoint.dir="$tmp/$name" log.dir="$tmp/$name/logs" "$@" >"$tmp/$name.out" 2>&1
  fi
}
same() { cmp -s "$1/model.safetensors" "$2/model.safetensors" && cmp -s "$1/optimizer.zst" "$2/optimizer.zst"; }
dead_pid() { sleep 0 & local pid=$!; wait "$pid"; echo "$pid"; }

# Bad steps: step 3 non-finite on one rank.
bad_step() {  # bad_step NAME NP RANK DP ARGS...
  local name=$1 np=$2 rank=$3 dp=$4
  shift 4
  MTRAIN_TEST_NAN_STEP=3,$rank train "$np" "$name" "$@"
  local rc=$? d="$tmp/$name"
  expect "$name: the run goes on to the end (rc $rc)" '[ $rc -eq 0 ] && [ -f "$d/step_00000006/state.json" ]'
  expect "$name: weights and AdamW state after the skipped step equal those before it" \
    'same "$d/step_00000002" "$d/step_00000003"'
  expect "$name: the step after it changes the weights" '! cmp -s "$d/step_00000003/model.safetensors" "$d/step_00000004/model.safetensors"'
  expect "$name: step line names step 3 and rank $rank" \
    'grep -q "^step      3/6 | bad step: loss nan, grad norm nan (non-finite first on rank $rank): skipped, 1 in a row" "$tmp/$name.out"'
  expect "$name: metrics.jsonl records it" 'grep -q "^{\"step\": 3, \"bad_step\": true, \"rank\": $rank," "$d/logs/metrics.jsonl"'
  expect "$name: its sequences are consumed (data cursor 3 steps on)" \
    '[ "$(grep -o "\"data_cursor\":[[:space:]]*[0-9]*" "$d/step_00000003/state.json" | grep -o "[0-9]*$")" = $((3 * dp)) ]'
}
bad_step bad1 1 0 1
bad_step bad_dp2 2 1 2 parallel.dp=2
bad_step bad_cp2 2 1 1 parallel.cp=2

MTRAIN_TEST_NAN_STEP=2,0,3 train 1 bad_stop train.max_bad_steps=3
rc=$?
expect "max_bad_steps 3 with 3 bad steps in a row: exit 1 with one line" \
  '[ $rc -eq 1 ] && [ "$(grep -c "^mtrain: step 4: 3 bad steps in a row (train.max_bad_steps)" "$tmp/bad_stop.out")" = 1 ]'
expect "max_bad_steps: the checkpoints are kept" '[ -f "$tmp/bad_stop/step_00000001/state.json" ] && ! [ -d "$tmp/bad_stop/step_00000005" ]'
MTRAIN_TEST_NAN_STEP=2,0,2 train 1 bad_two train.max_bad_steps=3
expect "max_bad_steps 3 with 2 bad steps in a row: the run ends normally" '[ -f "$tmp/bad_two/step_00000006/state.json" ]'
MTRAIN_TEST_NAN_STEP=2,1,3 train 2 bad_stop2 parallel.cp=2 train.max_bad_steps=3
rc=$?
expect "max_bad_steps on 2 ranks (cp 2, rank 1 bad): exit non-zero, step line names rank 1" \
  '[ $rc -ne 0 ] && grep -q "3 bad steps in a row" "$tmp/bad_stop2.out" && grep -q "first on rank 1): skipped, 3 in a row" "$tmp/bad_stop2.out"'
MTRAIN_TEST_NAN_STEP=x train 1 bad_env
expect "a malformed MTRAIN_TEST_NAN_STEP: one line" '[ "$(cat "$tmp/bad_env.out")" = "mtrain: MTRAIN_TEST_NAN_STEP=x: expected STEP[,RANK[,COUNT]] (step >= 1, rank >= 0, count >= 1)" ]'

# Reference run of 6 steps.
train 1 ref
ref="$tmp/ref"

# Replacing an existing step folder: resumed from step 4 with
# checkpoint.overwrite, step 5 and 6 are written again in place; no .old
# folder stays.
cp -r "$ref" "$tmp/replace"
train 1 replace checkpoint.resume="$tmp/replace/step_00000004" checkpoint.overwrite=true
expect "re-running from step 4 replaces step 6 with an identical one" \
  'same "$tmp/replace/step_00000006" "$ref/step_00000006" && [ -z "$(find "$tmp/replace" -name "*.old.*")" ]'
# Leftovers of dead writers: a replacement interrupted before (.old, final
# missing: put back) and after (.old, final present: removed) the new
# folder's rename; a pruning (.del) and a write (.tmp) interrupted; a live
# writer's .tmp is left alone.
cp -r "$ref" "$tmp/left"
dead=$(dead_pid)
mv "$tmp/left/step_00000006" "$tmp/left/step_00000006.old.$dead"
cp -r "$ref/step_00000005" "$tmp/left/step_00000005.old.$dead"
mkdir "$tmp/left/step_00000002.del.$dead" "$tmp/left/step_00000007.tmp.$dead" "$tmp/left/step_00000008.tmp.$$"
echo step_00000007 >"$tmp/left/latest.tmp.$dead"
: >"$tmp/left/step_00000007.tmp.$dead/model.safetensors"
train 1 left train.steps=7
expect "an interrupted replacement is put back, and resumed" 'grep -q "^resumed from $tmp/left/step_00000006: step 6" "$tmp/left.out"'
expect "leftovers of dead writers are removed, with a warning each" \
  '[ -z "$(find "$tmp/left" -name "*.old.*" -o -name "*.del.*" -o -name "*.tmp.$dead")" ] && [ "$(grep -c "^warning: .*: removed (left by process $dead, which is gone)" "$tmp/left.out")" = 4 ]'
expect "a live writer's temporary folder is left alone" '[ -d "$tmp/left/step_00000008.tmp.$$" ]'

# Another run's folder (another seed): resume never refuses with one line and
# changes nothing; with checkpoint.overwrite it removes them and starts afresh.
cp -r "$ref" "$tmp/other"
sum_before=$(cat "$tmp/other"/step_*/* | md5sum)
train 1 other checkpoint.resume=never train.seed=99
rc=$?
expect "resume never into another run's folder: exit non-zero, one line" \
  '[ $rc -ne 0 ] && [ "$(wc -l <"$tmp/other.out")" = 1 ] && grep -q "step_0000000[0-9]: a checkpoint of another run (train.seed 1234 -> 99) and checkpoint.resume is never" "$tmp/other.out"'
expect "resume never refused: the checkpoints are unchanged" '[ "$(cat "$tmp/other"/step_*/* | md5sum)" = "$sum_before" ]'
train 1 other checkpoint.resume=auto train.seed=99 train.steps=8
rc=$?
expect "resume auto of another run: exit non-zero, one line naming both values" \
  '[ $rc -ne 0 ] && grep -q "step_00000006: a checkpoint of another run (train.seed 1234 -> 99)" "$tmp/other.out" && [ "$(grep -vc "^warning" "$tmp/other.out")" = 1 ]'
train 1 other checkpoint.resume=never checkpoint.overwrite=true train.seed=99 train.steps=2
expect "resume never with overwrite: the other run's checkpoints go, the new run's stay" \
  '[ "$(cd "$tmp/other" && ls -d step_* | tr "\n" " ")" = "step_00000001 step_00000002 " ] && [ "$(cat "$tmp/other/latest")" = step_00000002 ]'
train 1 other checkpoint.resume=never train.seed=99 train.steps=2 train.max_bad_steps=2 log.every=2
expect "resume never into the same run's folder (keys outside the fingerprint changed): accepted" \
  'grep -q "^checkpoint: .*step_00000002" "$tmp/other.out"'

# Pruning: rolled back to step 2 with keep 1, the resumed-from folder and the
# one just written survive.
cp -r "$ref" "$tmp/roll"
train 1 roll checkpoint.resume="$tmp/roll/step_00000002" checkpoint.keep=1 train.steps=4 checkpoint.overwrite=true
expect "roll-back: step 2 (resumed from) and step 4 (just written) are kept" \
  '[ -f "$tmp/roll/step_00000002/state.json" ] && [ -f "$tmp/roll/step_00000004/state.json" ] && ! [ -d "$tmp/roll/step_00000003" ]'

# Damaged checkpoints: one line, non-zero exit.
refused() {  # refused NAME WHAT PATTERN ARGS...: resuming copy NAME fails with one line matching PATTERN
  local name=$1 what=$2 pattern=$3
  shift 3
  train 1 "$name" "$@"
  local rc=$?
  expect "$what: exit non-zero, one line" \
    '[ $rc -ne 0 ] && [ "$(grep -vc "^warning" "$tmp/$name.out")" = 1 ] && grep -q "$pattern" "$tmp/$name.out"'
}
cp -r "$ref" "$tmp/flip"
f="$tmp/flip/step_00000006/model.safetensors"
byte=$(( $(stat -c %s "$f") - 100 ))
flipped=$(( ($(od -An -tu1 -j"$byte" -N1 "$f") + 1) % 256 ))
printf "\\$(printf %03o "$flipped")" | dd of="$f" bs=1 seek="$byte" conv=notrunc status=none
refused flip "one flipped byte in the weights" "step_00000006/model.safetensors: checksum mismatch" train.steps=8
cp -r "$ref" "$tmp/huge"
sed -i 's/"step":[^,]*,/"step": 1e30,/' "$tmp/huge/step_00000006/state.json"
refused huge "state.json step 1e30" "state.json: field .step. is 1e+30 (expected a whole count in \[0, 2^53\])" train.steps=8
cp -r "$ref" "$tmp/beyond"
refused beyond "resuming step 6 with train.steps 5" "step_00000006: the checkpoint is at step 6, beyond train.steps = 5" \
  train.steps=5
train 1 beyond train.steps=6
rc=$?
expect "resuming step 6 with train.steps 6: finished, exit 0" '[ $rc -eq 0 ] && grep -q "^the run is finished: step 6" "$tmp/beyond.out"'

# A stray empty step folder: auto resumes the newest complete one, with a warning.
cp -r "$ref" "$tmp/stray"
mkdir "$tmp/stray/step_99999999"
train 1 stray train.steps=7
rc=$?
expect "a stray empty step_99999999 is skipped with a warning; step 6 resumes" \
  '[ $rc -eq 0 ] && grep -q "^warning: .*step_99999999 is incomplete" "$tmp/stray.out" && grep -q "^resumed from $tmp/stray/step_00000006" "$tmp/stray.out" && [ -f "$tmp/stray/step_00000007/state.json" ]'

# metrics.jsonl after a resume from step 4 (steps 5 and 6 lost): each step once.
cp -r "$ref" "$tmp/metrics"
rm -r "$tmp/metrics/step_00000005" "$tmp/metrics/step_00000006"
printf '{"step": 7, "loss": 1' >>"$tmp/metrics/logs/metrics.jsonl"
train 1 metrics
steps=$(grep -o '^{"step": [0-9]*' "$tmp/metrics/logs/metrics.jsonl" | grep -o '[0-9]*$' | tr '\n' ' ')
expect "metrics.jsonl after a resume holds each step once (got: $steps)" '[ "$steps" = "1 2 3 4 5 6 " ]'
expect "resumed steps log the same losses as the uninterrupted run" \
  'cmp -s <(grep -o "\"loss\": [^,]*" "$ref/logs/metrics.jsonl") <(grep -o "\"loss\": [^,]*" "$tmp/metrics/logs/metrics.jsonl")'

# Start-up cleanup removes only mtrain's own names: a user's results.tmp.N and
# thesis.old.N in log.dir, and notes.tmp.N in checkpoint.dir, stay as they are.
dead=$(dead_pid)
mkdir -p "$tmp/own/logs/results.tmp.$dead" "$tmp/own/logs/thesis.old.$dead" "$tmp/own/notes.tmp.$dead" \
  "$tmp/own/step_00000009.tmp.$dead"
: >"$tmp/own/logs/metrics.jsonl.tmp.$dead"
train 1 own train.steps=1
expect "cleanup: a user's results.tmp.N, thesis.old.N (log.dir) and notes.tmp.N (checkpoint.dir) are left alone" \
  '[ -d "$tmp/own/logs/results.tmp.$dead" ] && [ -d "$tmp/own/logs/thesis.old.$dead" ] && ! [ -e "$tmp/own/logs/thesis" ] && [ -d "$tmp/own/notes.tmp.$dead" ]'
expect "cleanup: mtrain's own step_N.tmp.N and metrics.jsonl.tmp.N are removed" \
  '! [ -e "$tmp/own/step_00000009.tmp.$dead" ] && ! [ -e "$tmp/own/logs/metrics.jsonl.tmp.$dead" ]'

# A run owns its checkpoints: a fresh start (resume never) in a folder of the
# same configuration's older run keeps every checkpoint it writes (keep 3),
# leaves the older run's alone, and auto resumes its own latest.
train 1 owner checkpoint.every=2 checkpoint.keep=3 checkpoint.keep_every=4 train.steps=16
cp -r "$tmp/owner" "$tmp/owner_rb"
train 1 owner checkpoint.every=2 checkpoint.keep=3 train.steps=6 checkpoint.resume=never
expect "resume never: the new run keeps steps 2, 4, 6; the older run's 8, 12, 14, 16 stay" \
  '[ "$(cd "$tmp/owner" && ls -d step_* | tr "\n" " ")" = "step_00000002 step_00000004 step_00000006 step_00000008 step_00000012 step_00000014 step_00000016 " ]'
run_of() { grep -o '"run_id":[[:space:]]*"[0-9a-f]*"' "$1/state.json" | grep -o '[0-9a-f]\{16\}'; }
expect "resume never: a new run id in state.json" '[ "$(run_of "$tmp/owner/step_00000006")" != "$(run_of "$tmp/owner/step_00000016")" ]'
train 1 owner checkpoint.every=2 checkpoint.keep=3 train.steps=8
expect "auto after resume never: resumes the new run's latest (step 6), not the older run's step 16" \
  'grep -q "^resumed from $tmp/owner/step_00000006: step 6" "$tmp/owner.out" && [ "$(run_of "$tmp/owner/step_00000008")" = "$(run_of "$tmp/owner/step_00000006")" ]'
# A roll-back with another lr (keep_every 4) is a new run: with
# checkpoint.overwrite (it replaces the older run's step 8) it keeps its own
# newest 3 and auto resumes its own step 9.
train 1 owner_rb checkpoint.resume="$tmp/owner_rb/step_00000004" train.lr=1e-3 checkpoint.every=1 checkpoint.keep=3 \
  checkpoint.keep_every=4 train.steps=9 checkpoint.overwrite=true
expect "roll-back: its steps 7, 8, 9 are kept beside the older run's 12, 14, 16" \
  '[ "$(cd "$tmp/owner_rb" && ls -d step_* | tr "\n" " ")" = "step_00000004 step_00000007 step_00000008 step_00000009 step_00000012 step_00000014 step_00000016 " ]'
train 1 owner_rb train.lr=1e-3 checkpoint.every=1 checkpoint.keep=3 checkpoint.keep_every=4 train.steps=10
expect "auto after a roll-back: resumes the roll-back's step 9" 'grep -q "^resumed from $tmp/owner_rb/step_00000009: step 9" "$tmp/owner_rb.out"'

# A shared log.dir: run A to step 8, run B fresh in the same log.dir, A
# resumed to 12: metrics.jsonl holds A's steps 1..12 only, B's are in
# metrics.RUN.jsonl, each move said in one line.
metric_steps() { grep -o '^{"step": [0-9]*' "$1" | grep -o '[0-9]*$' | tr '\n' ' '; }
train 1 mixA train.steps=8 log.dir="$tmp/shared"
train 1 mixB train.steps=8 log.dir="$tmp/shared"
expect "shared log.dir: a fresh run moves the other run's metrics.jsonl aside, with one line" \
  '[ "$(grep -c "^metrics: .*held run [0-9a-f]*.s metrics: moved to $tmp/shared/metrics.[0-9a-f]*.jsonl" "$tmp/mixB.out")" = 1 ]'
train 1 mixA train.steps=12 log.dir="$tmp/shared"
runs=$(grep -o '"run_id": "[0-9a-f]*"' "$tmp/shared/metrics.jsonl" | sort -u | wc -l)
expect "shared log.dir: metrics.jsonl holds run A's steps 1..12 of one run (got: $(metric_steps "$tmp/shared/metrics.jsonl"), $runs run ids)" \
  '[ "$(metric_steps "$tmp/shared/metrics.jsonl")" = "$(seq -s " " 1 12) " ] && [ "$runs" = 1 ] && grep -q "^metrics: .* of this run moved back to" "$tmp/mixA.out"'
expect "shared log.dir: run B's steps 1..8 are in its own metrics.RUN.jsonl" \
  '[ "$(metric_steps "$(grep -l "$(run_of "$tmp/mixB/step_00000008")" "$tmp"/shared/metrics.*.jsonl)")" = "$(seq -s " " 1 8) " ]'

# One run at a time: while a run holds checkpoint.dir and log.dir (stalled at
# its start-up), a second run on either is refused with one line naming the
# holder; the lock goes with the process.
MTRAIN_TEST_FAULT=stall:0@start "$MTRAIN" train $RUN checkpoint.dir="$tmp/lock" log.dir="$tmp/lock_logs" \
  parallel.timeout_s=30 >"$tmp/holder.out" 2>&1 &
holder=$!
until grep -q "MTRAIN_TEST_FAULT: stall at the fault point start" "$tmp/holder.out" || ! kill -0 $holder 2>/dev/null; do
  sleep 0.05
done
train 1 lock log.dir="$tmp/lock_logs"
expect "lock: a second run on the same checkpoint.dir is refused with one line naming the holder" \
  '[ "$(cat "$tmp/lock.out")" = "mtrain: $tmp/lock: in use by another mtrain run (pid $holder on $(hostname), holding $tmp/lock/mtrain.lock): wait for it to end, or use another folder" ]'
train 1 lock2 log.dir="$tmp/lock_logs"
expect "lock: a second run on the same log.dir is refused with one line" \
  '[ "$(grep -c "^mtrain: $tmp/lock_logs: in use by another mtrain run (pid $holder" "$tmp/lock2.out")" = 1 ] && [ "$(wc -l <"$tmp/lock2.out")" = 1 ]'
kill -9 $holder
wait $holder 2>/dev/null
train 1 lock train.steps=1 log.dir="$tmp/lock_logs"
expect "lock: once the holder is gone, the next run starts" '[ -f "$tmp/lock/step_00000001/state.json" ]'

# A checkpoint write longer than parallel.timeout_s (rank 0 sleeps 5 s inside
# it, timeout 2 s) does not end the job: the other rank's wait has its own limit.
MTRAIN_TEST_FAULT=slow:0@write train 2 slow parallel.dp=2 parallel.timeout_s=2 train.steps=2
rc=$?
expect "a checkpoint write longer than parallel.timeout_s: the run ends (rc $rc)" \
  '[ $rc -eq 0 ] && grep -q "slow at the fault point write" "$tmp/slow.out" && [ -f "$tmp/slow/step_00000002/state.json" ]'

# Steps of 9 digits: step_100000006 is found, resumed and written.
cp -r "$ref" "$tmp/big"
mv "$tmp/big/step_00000006" "$tmp/big/step_100000006"
sed -i 's/"step":[^,]*,/"step": 100000006,/' "$tmp/big/step_100000006/state.json"
train 1 big train.steps=100000007
expect "a 9-digit step folder is resumed and the next one written" \
  'grep -q "^resumed from $tmp/big/step_100000006: step 100000006" "$tmp/big.out" && [ -f "$tmp/big/step_100000007/state.json" ] && [ "$(cat "$tmp/big/latest")" = step_100000007 ]'
# A step folder whose name disagrees with its state.json.
cp -r "$ref" "$tmp/misnamed"
sed -i 's/"step":[^,]*,/"step": 5,/' "$tmp/misnamed/step_00000006/state.json"
refused misnamed "step_00000006 whose state.json says step 5" \
  "step_00000006/state.json: step 5, but the folder is named for step 6" train.steps=8
# A stale `latest` (a kill between the step folder's rename and latest's) is repaired.
cp -r "$ref" "$tmp/stale"
echo step_00000004 >"$tmp/stale/latest"
train 1 stale
expect "a stale latest is repaired at start, with a warning" \
  'grep -q "^warning: $tmp/stale/latest named step_00000004: repaired to step_00000006" "$tmp/stale.out" && [ "$(cat "$tmp/stale/latest")" = step_00000006 ]'
# rng words that are not hex.
for word in '""' '"-1"' '" 1"'; do
  cp -r "$ref" "$tmp/rng"
  sed -i "/\"rng\"/s/\[\"[0-9a-f]*\"/[$word/" "$tmp/rng/step_00000006/state.json"
  refused rng "state.json rng word $word" "state.json: field 'rng' must be 4 hex words" train.steps=8
  rm -rf "$tmp/rng"
done
# The bad-step streak survives a resume: steps 3..5 bad, the run stopped
# after step 4 and resumed: step 5 is the third in a row.
MTRAIN_TEST_NAN_STEP=3,0,3 train 1 streak train.max_bad_steps=3 train.steps=4
MTRAIN_TEST_NAN_STEP=3,0,3 train 1 streak train.max_bad_steps=3
rc=$?
expect "the bad-step streak is restored on resume: step 5 is the 3rd in a row (rc $rc)" \
  '[ $rc -eq 1 ] && grep -q "^mtrain: step 5: 3 bad steps in a row (train.max_bad_steps)" "$tmp/streak.out"'

# The shards' contents are in the fingerprint: text re-tokenized under the
# same shard path is another run for resume auto.
for i in $(seq 200); do echo "document $i: the quick brown fox jumps over the lazy dog"; done >"$tmp/a.txt"
for i in $(seq 200); do echo "document $i: pack my box with five dozen liquor jugs, said the fox"; done >"$tmp/b.txt"
"$MTRAIN" tokenize --tokenizer bytes --input "$tmp/a.txt" --output "$tmp/data.shard" >/dev/null 2>&1
train 1 content train.steps=2 model.vocab_size=512 data.train="$tmp/data.shard"
"$MTRAIN" tokenize --tokenizer bytes --input "$tmp/b.txt" --output "$tmp/data.shard" --force >/dev/null 2>&1
train 1 content train.steps=4 model.vocab_size=512 data.train="$tmp/data.shard"
rc=$?
expect "a shard re-tokenized under the same path: resume auto refuses, naming data.content (rc $rc)" \
  '[ $rc -ne 0 ] && grep -q "step_00000002: a checkpoint of another run (data.content [0-9a-f]* -> [0-9a-f]*)" "$tmp/content.out"'
exit $((failures > 0))

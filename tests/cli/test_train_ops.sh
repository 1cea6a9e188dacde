#!/usr/bin/env bash
# test_train_ops.sh: the operations of a training run through build/mtrain:
# one step trains at the peak lr and changes the weights; the end-of-run
# summary line; the start-up line; progress lines of initialising, loading, checkpoint writing, score,
# tokenize and eval; resuming a finished run says so; SIGTERM / SIGINT mid-run on
# 1 and on 2 ranks (sent to one rank: all agree) and SIGUSR1 to mpirun stop
# after a step with a checkpoint and exit 0, and the resumed run is
# bit-identical to an uninterrupted one; a second signal exits at once and
# leaves the checkpoints usable; threads: parallel.threads 0 = the CPUs
# divided by the ranks (shown in the ranks line), an oversubscribing setting
# warns, and OpenMP waits passively unless the user chose a policy. Guard
# rails: the stop line under checkpoint.resume: never, a warmup longer than
# the run, a seq_len beyond max_position_embeddings, progress on stderr (not
# in eval's tables), held-out perplexity of a run that never validated.
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib/lib.sh

# configs/tiny-cpu.yaml made smaller.
RUN="configs/tiny-cpu.yaml model.hidden_size=32 model.intermediate_size=64 train.steps=12 train.seq_len=64
     train.warmup_steps=0 train.min_lr=0 attention.block_size=16 log.every=1"
train() { "$MTRAIN" train $RUN "$@" >>"$tmp/out.txt" 2>&1; }
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_btl_vader_single_copy_mechanism=none

# One step of the default (cosine, no warmup) schedule: at lr, weights move.
train checkpoint.dir="$tmp/one" train.steps=1 log.dir="$tmp/one_logs"
train checkpoint.dir="$tmp/zero" train.steps=1 train.lr=0 log.dir="$tmp/zero_logs"
expect "steps=1 trains at the peak lr" 'grep -q "\"step\": 1, .*\"lr\": 0.003[,}]" "$tmp/one_logs/metrics.jsonl"'
expect "steps=1 changes the weights" '! cmp -s "$tmp/one/step_00000001/model.safetensors" "$tmp/zero/step_00000001/model.safetensors"'
# The streamed optimizer state: 24 header bytes, then one zstd frame of the
# moments m and v (2 x 4 x P bytes) that the zstd tool reads.
params=$(sed -n 's/^model: \([0-9]*\) parameters.*/\1/p' "$tmp/out.txt" | head -1)
raw=$(tail -c +25 "$tmp/one/step_00000001/optimizer.zst" | zstd -d -q | wc -c)
expect "optimizer.zst holds one zstd frame of 8 x $params bytes (got $raw)" '[ -n "$params" ] && [ "$raw" = $((8 * params)) ]'

# The summary line: steps, tokens (64 per step), time, tokens/s, best validation loss.
: >"$tmp/out.txt"
train checkpoint.dir="$tmp/sum" log.dir="$tmp/sum_logs" train.steps=6 log.val_every=3
expect "run summary line with steps, tokens, time, rate and best val loss" \
  'grep -Eq "^run summary: steps 1-6 \| 384 tokens \| [0-9.]+ s \| [0-9]+ tok/s \| best val loss [0-9.]+ \| peak RSS [0-9.]+ MiB \(planned [0-9.]+\)$" "$tmp/out.txt"'
best=$(sed -n 's/.*best val loss \([0-9.]*\).*/\1/p' "$tmp/out.txt")
lowest=$(sed -n 's/^validation | step [0-9]* | loss //p' "$tmp/out.txt" | sort -g | head -1)
expect "best val loss $best is the lowest validation loss $lowest" '[ -n "$best" ] && [ "$best" = "$lowest" ]'

# Progress lines (shown at once with MTRAIN_PROGRESS_SECONDS=0) while a
# model folder loads and a checkpoint is written, each closed by one line;
# the memory line counts the host memory a checkpoint write adds.
MTRAIN_PROGRESS_SECONDS=0 "$MTRAIN" train $RUN checkpoint.dir="$tmp/prog" log.dir="$tmp/prog" train.steps=1 \
  train.init_from="$tmp/one/step_00000001" >"$tmp/prog.out" 2>&1
expect "progress while loading a model folder, with rate and eta" \
  'grep -Eq "^loading $tmp/one/step_00000001: [0-9.]+/[0-9.]+ MiB \| [0-9.]+ MiB/s \| eta [0-9]+m[0-9]+s$" "$tmp/prog.out" && grep -Eq "^loading $tmp/one/step_00000001: [0-9.]+ MiB in [0-9.]+ s" "$tmp/prog.out"'
expect "progress while writing a checkpoint, with rate and eta" \
  'grep -Eq "^writing checkpoint $tmp/prog/step_00000001: [0-9.]+/[0-9.]+ MiB \| [0-9.]+ MiB/s \| eta" "$tmp/prog.out" && grep -Eq "^writing checkpoint $tmp/prog/step_00000001: [0-9.]+ MiB in [0-9.]+ s" "$tmp/prog.out"'
# The start-up's phases on one line before the first step, adding up to its
# total; the seeded initialisation's progress, closed by one line.
MTRAIN_PROGRESS_SECONDS=0 "$MTRAIN" train $RUN checkpoint.dir="$tmp/init" log.dir="$tmp/init" train.steps=1 \
  >"$tmp/init.out" 2>&1
expect "start-up phases on one line before the first step, adding up to its total" \
  'awk "/^start-up: [0-9.]+ s \\(configuration and ranks [0-9.]+, data loader [0-9.]+, memory plan and CPU peak [0-9.]+, allocation [0-9.]+, weights [0-9.]+, logs [0-9.]+\\)\$/ { for (i = 4; i <= NF; i++) if (\$i ~ /^[0-9.]+[,)]\$/) { sum += \$i; n++ } total = \$2; at = NR } /^step +1\\/1 / { first = NR } END { d = sum - total; exit !(n == 6 && at && first > at && d < 0.04 && d > -0.04) }" "$tmp/init.out"'
expect "progress while initialising the weights" \
  'grep -Eq "^initialising the weights: [0-9.]+/[0-9.]+ MiB \| [0-9.]+ MiB/s \| eta" "$tmp/init.out" && grep -Eq "^initialising the weights: [0-9.]+ MiB in [0-9.]+ s" "$tmp/init.out"'
seq 0 40 | tr '\n' ' ' >"$tmp/tokens.txt"
MTRAIN_PROGRESS_SECONDS=0 "$MTRAIN" score --model "$tmp/one/step_00000001" --tokens "$tmp/tokens.txt" >"$tmp/score.out" 2>&1
expect "progress while scoring, by layer" \
  'grep -Eq "^scoring 41 tokens: [0-9.]+/4.0 layers \| [0-9.]+ layers/s \| eta" "$tmp/score.out" && grep -q "^scoring 41 tokens: 4.0 layers in " "$tmp/score.out" && grep -q "^loss " "$tmp/score.out"'
expect "the memory line includes the checkpoint write" 'grep -Eq "^model: .*checkpoint write [0-9.]+ more on the host" "$tmp/prog.out"'
expect "short phases print no progress by default" '! grep -q "^loading\|^writing checkpoint" "$tmp/out.txt"'

# Progress of tokenize (over the input bytes) and of each eval task (the
# table rows stay whole between the progress lines).
for i in 1 2 3 4 5 6; do
  awk -v n="$i" 'BEGIN { for (j = 0; j < 200; j++) printf "{\"text\": \"doc %d line %d of words\"}\n", n, j }' >>"$tmp/docs.jsonl"
done
MTRAIN_PROGRESS_SECONDS=0 "$MTRAIN" tokenize --tokenizer bytes --input "$tmp/docs.jsonl" --output "$tmp/docs.shard" \
  >"$tmp/tok.out" 2>&1
expect "progress while tokenizing, with rate and eta" \
  'grep -Eq "^tokenizing: [0-9.]+/[0-9.]+ MB \| [0-9.]+ MB/s \| eta" "$tmp/tok.out" && grep -q "^tokenizing: .* MB in " "$tmp/tok.out"'
EVAL="$RUN model.vocab_size=258 data.train=$tmp/docs.shard checkpoint.dir=$tmp/ev log.dir=$tmp/ev eval.out=$tmp/ev/out"
"$MTRAIN" train $EVAL train.steps=2 >"$tmp/ev.out" 2>&1
MTRAIN_PROGRESS_SECONDS=0 "$MTRAIN" eval $EVAL eval.tasks=perplexity,passkey eval.lengths=128,160 eval.depths=0,1 \
  eval.samples=2 >"$tmp/ev.out" 2>&1
expect "progress of perplexity per length" 'grep -Eq "^perplexity at length 128: [0-9.]+/2.0 sequences \| [0-9.]+ sequences/s \| eta" "$tmp/ev.out"'
expect "progress of a task grid" 'grep -Eq "^passkey: [0-9.]+/8.0 samples \| .* samples/s \| eta" "$tmp/ev.out" && grep -q "^passkey: 8.0 samples in " "$tmp/ev.out"'
expect "the grid's rows stay whole" '[ "$(grep -Ec "^ +(128|160)( +[0-9]\.[0-9]{2}){2}$" "$tmp/ev.out")" = 2 ]'

# Progress goes to stderr: eval's tables on stdout stay whole when piped.
MTRAIN_PROGRESS_SECONDS=0 "$MTRAIN" eval $EVAL eval.tasks=perplexity,passkey eval.lengths=128 eval.depths=0 \
  eval.samples=1 >"$tmp/ev.stdout" 2>"$tmp/ev.stderr"
expect "progress on stderr only, none in the piped tables" \
  'grep -q "^passkey: 1.0 samples in " "$tmp/ev.stderr" && grep -q "^perplexity on heldout" "$tmp/ev.stdout" && ! grep -Eq "/s \| eta| in [0-9.]+ s \(" "$tmp/ev.stdout"'
# Held-out text of a run that never validated (log.val_every 0) was trained
# on: the perplexity table says so; with validation it does not.
expect "perplexity on heldout without validation says the text is not held out" \
  'grep -q "^not held out: log.val_every is 0" "$tmp/ev.stdout"'
"$MTRAIN" eval $EVAL log.val_every=1 eval.tasks=perplexity eval.lengths=128 eval.samples=1 >"$tmp/ev.stdout" 2>&1
expect "perplexity on heldout with validation has no such line" \
  'grep -q "^perplexity on heldout" "$tmp/ev.stdout" && ! grep -q "not held out" "$tmp/ev.stdout"'

# A warmup longer than the run is clamped to it with a one-line note; a
# seq_len beyond max_position_embeddings trains with one warning (rank 0's).
"$MTRAIN" train $RUN train.steps=2 train.warmup_steps=5 checkpoint.dir="$tmp/warm" log.dir="$tmp/warm" \
  >"$tmp/warm.out" 2>&1
rc=$?
expect "train.steps=2 with warmup_steps 5 trains, with one note" \
  '[ $rc -eq 0 ] && [ "$(grep -c "^note: train.warmup_steps 5 is more than train.steps 2: warmup clamped to 2 steps$" "$tmp/warm.out")" = 1 ] && grep -q "\"step\": 2, .*\"lr\": 0.003[,}]" "$tmp/warm/metrics.jsonl"'
mpirun --oversubscribe --bind-to none -np 2 "$MTRAIN" train $RUN parallel.cp=2 train.steps=1 train.seq_len=512 \
  checkpoint.resume=never checkpoint.dir="$tmp/long" log.dir="$tmp/long" >"$tmp/long.out" 2>&1
rc=$?
expect "seq_len 512 beyond max_position_embeddings 256 on 2 ranks: one warning" \
  '[ $rc -eq 0 ] && [ "$(grep -c "^warning: train.seq_len 512 is beyond model.max_position_embeddings 256" "$tmp/long.out")" = 1 ]'

# Resuming a finished run: one line, exit 0, nothing written.
: >"$tmp/out.txt"
train checkpoint.dir="$tmp/sum" log.dir="$tmp/sum_logs" train.steps=6 log.val_every=3
rc=$?
expect "resuming a finished run says so and exits 0" \
  '[ $rc -eq 0 ] && grep -q "^the run is finished: step 6 of train.steps = 6" "$tmp/out.txt" && ! grep -q "^step \|^run summary" "$tmp/out.txt"'

# Threads. nproc = the CPUs this test (and every rank, --bind-to none) may use.
cpus=$(nproc)
share=$((cpus / 2 > 0 ? cpus / 2 : 1))
mpirun --oversubscribe --bind-to none -np 2 "$MTRAIN" train $RUN parallel.cp=2 train.steps=1 checkpoint.resume=never \
  checkpoint.dir="$tmp/thr" log.dir="$tmp/thr" >"$tmp/thr.out" 2>&1
expect "2 ranks on $cpus CPUs: the ranks line shows $share thread(s) per rank, no warning" \
  'grep -q "^ranks: 2 = .*, $share threads\? per rank, launcher mpirun$" "$tmp/thr.out" && ! grep -q "^warning" "$tmp/thr.out"'
mpirun --oversubscribe --bind-to none -np 2 "$MTRAIN" train $RUN parallel.cp=2 train.steps=1 checkpoint.resume=never \
  checkpoint.dir="$tmp/thr" log.dir="$tmp/thr" parallel.threads="$cpus" >"$tmp/thr.out" 2>&1
expect "2 ranks x parallel.threads $cpus: one warning line" \
  '[ "$(grep -c "^warning: parallel.threads $cpus x 2 ranks on this node = $((2 * cpus)) threads on $cpus CPUs.*oversubscribed" "$tmp/thr.out")" = 1 ]'
train checkpoint.dir="$tmp/thr1" train.steps=1 parallel.threads=$((cpus + 1)) checkpoint.resume=never 2>"$tmp/thr1.err"
expect "one process with parallel.threads $((cpus + 1)): a warning" 'grep -q "^warning: parallel.threads $((cpus + 1)) x 1 ranks" "$tmp/out.txt"'
OMP_DISPLAY_ENV=true "$MTRAIN" train $RUN checkpoint.dir="$tmp/wait" train.steps=1 >"$tmp/wait.out" 2>&1
expect "OpenMP waits passively by default" 'grep -q "OMP_WAIT_POLICY = .PASSIVE." "$tmp/wait.out"'
OMP_WAIT_POLICY=active OMP_DISPLAY_ENV=true "$MTRAIN" train $RUN checkpoint.dir="$tmp/wait2" train.steps=1 >"$tmp/wait.out" 2>&1
expect "a wait policy the user sets is kept" 'grep -q "OMP_WAIT_POLICY = .ACTIVE." "$tmp/wait.out" && ! grep -q "PASSIVE" "$tmp/wait.out"'

# Signals. A long run (constant lr) stopped once 5 steps are logged; then the
# same run resumed to 3 steps past the stop, against an uninterrupted run of
# as many steps on as many ranks.
SIG_RUN="$RUN train.lr_schedule=constant log.every=1000"
launch() {  # launch NP ARGS...: mtrain train on NP ranks (1: no mpirun), in the background
  local np=$1
  shift
  if [ "$np" -gt 1 ]; then
    mpirun --oversubscribe --bind-to none -np "$np" "$MTRAIN" train $SIG_RUN parallel.cp="$np" "$@" &
  else
    "$MTRAIN" train $SIG_RUN "$@" &
  fi
}
wait_steps() {  # wait_steps METRICS N: until METRICS has N step lines (at most 10 min: a hang guard)
  for _ in $(seq 6000); do
    local n
    n=$(grep -c '"loss"' "$1" 2>/dev/null)
    [ "${n:-0}" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}
finish() {  # finish PID: its exit status, or kill -9 and 137 when it runs 10 min more (a hang guard)
  for _ in $(seq 6000); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$1" 2>/dev/null && pkill -9 -P "$1" && kill -9 "$1"
  wait "$1"
}
same() { cmp -s "$1/model.safetensors" "$2/model.safetensors" && cmp -s "$1/optimizer.zst" "$2/optimizer.zst"; }
# stop_and_resume NAME NP SIGNAL TARGET: TARGET is "rank0", "rank1" or "mpirun".
stop_and_resume() {
  local name=$1 np=$2 sig=$3 target=$4 dir="$tmp/$1"
  launch "$np" checkpoint.dir="$dir" log.dir="$dir/logs" train.steps=100000 >"$tmp/$name.out" 2>&1
  local pid=$! victim
  wait_steps "$dir/logs/metrics.jsonl" 5 || { bad "$name: run started" "no 5 steps within 10 min"; kill -9 "$pid"; return; }
  case $target in
    mpirun) victim=$pid ;;
    rank0) victim=$( ([ "$np" -gt 1 ] && pgrep -P "$pid" -x mtrain || echo "$pid") | sort -n | head -1) ;;
    rank1) victim=$(pgrep -P "$pid" -x mtrain | sort -n | tail -1) ;;
  esac
  [ -n "$victim" ] && kill -"$sig" "$victim"
  finish "$pid"
  local rc=$?
  local stopped
  stopped=$(sed -n "s/^stopped by SIG$sig after step \([0-9]*\) of 100000: checkpoint .* written.*/\1/p" "$tmp/$name.out")
  expect "$name: SIG$sig to $target: exit 0 with one line naming the step (rc $rc, step ${stopped:-none})" \
    '[ $rc -eq 0 ] && [ -n "$stopped" ]'
  [ -n "$stopped" ] || return
  local total=$((stopped + 3)) step
  step=$(printf 'step_%08d' "$stopped")
  expect "$name: checkpoint of step $stopped written" '[ -f "$dir/$step/state.json" ] && [ "$(cat "$dir/latest")" = "$step" ]'
  launch "$np" checkpoint.dir="$dir" log.dir="$dir/logs" train.steps="$total" >>"$tmp/$name.out" 2>&1
  wait $!
  launch "$np" checkpoint.dir="$dir.ref" log.dir="$dir.ref/logs" train.steps="$total" >"$tmp/$name.ref.out" 2>&1
  wait $!
  step=$(printf 'step_%08d' "$total")
  expect "$name: resumed to step $total bit-identical to an uninterrupted run" 'same "$dir/$step" "$dir.ref/$step"'
}
stop_and_resume term1 1 TERM rank0
stop_and_resume int1 1 INT rank0
expect "under checkpoint.resume: auto the stop line says the same command resumes" \
  'grep -q "^stopped by SIGINT .*; the same command resumes$" "$tmp/int1.out"'
# Under checkpoint.resume: never the same command starts over: the stop line
# says how to resume instead.
dir="$tmp/never"
launch 1 checkpoint.dir="$dir" log.dir="$dir/logs" train.steps=100000 checkpoint.resume=never >"$tmp/never.out" 2>&1
pid=$!
if wait_steps "$dir/logs/metrics.jsonl" 5; then
  kill -INT "$pid"
  finish "$pid"
  expect "under checkpoint.resume: never the stop line names checkpoint.resume=auto" \
    'grep -q "^stopped by SIGINT .*; the same command with checkpoint.resume=auto resumes (as it is, it starts over)$" "$tmp/never.out" && ! grep -q "the same command resumes" "$tmp/never.out"'
else
  bad "resume never: run started" "no 5 steps within 10 min"
  kill -9 "$pid"
fi
stop_and_resume term2 2 TERM rank1
stop_and_resume int2 2 INT rank0
stop_and_resume usr1_2 2 USR1 mpirun

# A second signal (another one: equal signals pending at once merge) during
# a longer step: exit at once with status 128 + the signal (SIGUSR1 or
# SIGTERM, whichever is delivered second); the checkpoints written
# before it are complete and the newest loads.
dir="$tmp/twice"
launch 1 checkpoint.dir="$dir" log.dir="$dir/logs" train.steps=100000 checkpoint.every=2 train.seq_len=1024 \
  model.max_position_embeddings=1024 >"$tmp/twice.out" 2>&1
pid=$!
if wait_steps "$dir/logs/metrics.jsonl" 5; then
  kill -USR1 "$pid"
  kill -TERM "$pid"
  finish "$pid"
  rc=$?
  expect "a second signal exits at once (status $rc)" \
    '{ [ $rc -eq 138 ] || [ $rc -eq 143 ]; } && grep -q "second signal" "$tmp/twice.out" && ! grep -q "^stopped by" "$tmp/twice.out"'
  newest=$(ls -d "$dir"/step_???????? | tail -1)
  launch 1 checkpoint.dir="$dir" log.dir="$dir/logs" train.steps=$((10#${newest##*_})) train.seq_len=1024 \
    model.max_position_embeddings=1024 >>"$tmp/twice.out" 2>&1
  wait $!
  rc=$?
  expect "after a second signal the newest checkpoint loads" '[ $rc -eq 0 ] && grep -q "^resumed from $newest" "$tmp/twice.out"'
else
  bad "second signal: run started" "no 5 steps within 10 min"
  kill -9 "$pid"
fi
exit $((failures > 0))

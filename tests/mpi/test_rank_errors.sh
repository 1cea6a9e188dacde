#!/usr/bin/env bash
# test_rank_errors.sh: under mpirun (2 ranks) an error prints once, in one
# piece: a config error (before MPI starts) and a damaged checkpoint (every
# rank reads it) by rank 0 alone; an error of rank 1 alone (its ZeRO-1 shard
# damaged, which only it reads) by rank 1, naming itself.
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib/lib.sh
mpirun_env
export OMP_NUM_THREADS=1

RUN="configs/tiny-cpu.yaml model.hidden_size=32 model.intermediate_size=64 train.steps=2 train.seq_len=64
     train.warmup_steps=0 attention.block_size=16 checkpoint.every=1 parallel.dp=2"
mpi_train() {  # mpi_train NAME ARGS...: 2 ranks into $tmp/NAME (stdout+stderr in $tmp/NAME.out)
  local name=$1
  shift
  # shellcheck disable=SC2086  # $RUN is a list of settings
  timeout 120 mpirun --oversubscribe --bind-to none -np 2 "$MTRAIN" train $RUN checkpoint.dir="$tmp/$name" \
    log.dir="$tmp/$name/logs" "$@" >"$tmp/$name.out" 2>&1 </dev/null
}
# once NAME RC OUT PATTERN: exit non-zero and one "mtrain:" line in OUT, matching PATTERN.
once() {
  local lines
  lines=$(grep -c '^mtrain: ' "$3")
  if [ "$2" -ne 0 ] && [ "$lines" = 1 ] && grep -q -- "^mtrain: $4" "$3" && ! grep -q "mtrain: .*mtrain:" "$3"; then
    ok "$1: one line"
  else bad "$1" "exit $2, $lines 'mtrain:' lines, wanted one matching '$4': $(grep '^mtrain' "$3" | head -4)"; fi
}

mpi_train config train.nope=1
once "a config error on 2 ranks" $? "$tmp/config.out" ".*train.nope"

mpi_train ck parallel.zero=1
cp -r "$tmp/ck" "$tmp/weights"
f="$tmp/weights/step_00000002/model.safetensors"
printf '\xca\xf2\x49\x71' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 64 )) conv=notrunc status=none
mpi_train weights parallel.zero=1 train.steps=3
once "damaged weights read by both ranks" $? "$tmp/weights.out" "$tmp/weights/step_00000002/model.safetensors: checksum"

cp -r "$tmp/ck" "$tmp/shard"
f="$tmp/shard/step_00000002/optimizer.00001-of-00002.zst"
printf '\xca\xf2\x49\x71' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 20 )) conv=notrunc status=none
mpi_train shard parallel.zero=1 train.steps=3
once "a damaged shard only rank 1 reads" $? "$tmp/shard.out" "rank 1: $f: "
exit $((failures > 0))

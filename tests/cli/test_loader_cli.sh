#!/usr/bin/env bash
# test_loader_cli.sh: `mtrain train` on shards made by `mtrain tokenize`:
# a run of 12 steps equals bitwise a run of 8 resumed to 12 (across an epoch
# boundary), the saved data cursor is the one used, a separate data.val glob,
# documents held out only when validation runs,
# `mtrain data` (summary, sequences sharing one token), and every bad input
# (empty glob, seq_len longer than the data, token id >= vocabulary, shard
# vocabulary larger than the model's, wrong magic, unsupported version,
# truncated file, checksum mismatch) as one line naming the file and the
# problem, with a non-zero exit.
set -uo pipefail
cd "$(dirname "$0")/../.."
mtrain=$(realpath "${MTRAIN:-build/mtrain}")
. tests/lib/lib.sh

# Ten small documents: eight for training (two shards), two for data.val.
for i in $(seq 1 10); do
  awk -v n="$i" 'BEGIN { for (j = 0; j < 12 + n; j++) printf "word%d ", (j * n) % 7 }' >"$tmp/doc$i.txt"
done
tokenize() { "$mtrain" tokenize --tokenizer bytes --output "$tmp/$1" --input "${@:2}" >/dev/null; }
tokenize a.shard "$tmp"/doc{1,2,3,4}.txt
tokenize b.shard "$tmp"/doc{5,6,7,8}.txt
tokenize val.shard "$tmp"/doc{9,10}.txt
mkdir "$tmp/bad"

cat >"$tmp/run.yaml" <<EOF
model:
  hidden_size: 32
  intermediate_size: 64
  num_layers: 2
  num_heads: 4
  num_kv_heads: 2
  vocab_size: 258
attention:
  block_size: 16
train:
  steps: 12
  seq_len: 32
  lr: 3e-3
  lr_schedule: constant
  micro_batches: 2
data:
  train: $tmp/[ab].shard
  val_sequences: 2
log:
  dir: $tmp/logs
  every: 100
  val_every: 4
EOF
train() { "$mtrain" train "$tmp/run.yaml" "$@" >"$tmp/out.txt" 2>&1; }
same_model() { cmp -s "$1/model.safetensors" "$2/model.safetensors"; }

# Reference: 12 steps = 24 sequences, more than one epoch.
train checkpoint.dir="$tmp/ref"
per_epoch=$(sed -n 's/.* = \([0-9]*\) sequences of 32 per epoch.*/\1/p' "$tmp/out.txt")
expect "12 steps on shards (2 shards, $per_epoch sequences per epoch) cross an epoch boundary" \
  '[ -f "$tmp/ref/step_00000012/model.safetensors" ] && grep -q "^data: 2 shards" "$tmp/out.txt" && [ "${per_epoch:-99}" -lt 24 ]'
expect "validation loss from the held-out stream is logged" 'grep -q "validation | step 12 | loss" "$tmp/out.txt"'

# 8 steps, then the same run resumed to 12.
train checkpoint.dir="$tmp/part" train.steps=8
cursor=$(sed -n 's/.*"data_cursor":[[:space:]]*\([0-9]*\).*/\1/p' "$tmp/part/step_00000008/state.json")
expect "the checkpoint at step 8 saves data cursor 16 (got $cursor)" '[ "$cursor" = 16 ]'
cp -r "$tmp/part" "$tmp/moved"
train checkpoint.dir="$tmp/part"
expect "resume logs the step it continued from" 'grep -q "resumed from $tmp/part/step_00000008: step 8" "$tmp/out.txt"'
expect "8 steps resumed to 12 equal 12 steps bitwise (model.safetensors)" 'same_model "$tmp/ref/step_00000012" "$tmp/part/step_00000012"'

# The cursor is what selects the data: resuming at cursor 17 (tokens_seen
# 17 x 32 with it, as state.json's fields must agree) ends elsewhere.
sed -i -e 's/"data_cursor":[[:space:]]*16/"data_cursor": 17/' -e 's/"tokens_seen":[[:space:]]*512/"tokens_seen": 544/' \
  "$tmp/moved/step_00000008/state.json"
train checkpoint.dir="$tmp/moved"
expect "a resume from another data cursor gives another model" \
  '[ -f "$tmp/moved/step_00000012/model.safetensors" ] && ! same_model "$tmp/ref/step_00000012" "$tmp/moved/step_00000012"'

# A separate validation glob.
train checkpoint.dir="$tmp/val" data.val="$tmp/val.shard" train.steps=2
expect "data.val names separate validation shards" 'grep -q "^data: 2 shards, 8 training documents.*validation: 2 sequences from 1 document of data.val (1 shard)" "$tmp/out.txt"'

# data.val: holdout withholds documents only when validation runs.
train checkpoint.dir="$tmp/held" train.steps=1
expect "with validation, documents are held out of data.train" 'grep -q "^data: 2 shards, [1-7] training documents.*held out of data.train" "$tmp/out.txt"'
train checkpoint.dir="$tmp/noval" train.steps=1 log.val_every=0
expect "without validation (log.val_every 0) nothing is held out" 'grep -q "^data: 2 shards, 8 training documents.*validation: off, nothing held out" "$tmp/out.txt"'

# mtrain data: the same summary as train; consecutive sequences share one
# token (the last target of sequence g is the first input of g+1), also
# across the epoch boundary.
"$mtrain" data "$tmp/run.yaml" --read 30 --show "$((per_epoch - 1))" >"$tmp/data1.txt" 2>&1
"$mtrain" data "$tmp/run.yaml" --show "$per_epoch" >"$tmp/data2.txt" 2>&1
last=$(sed -n 's/^tokens (32 inputs + 1 target): //p' "$tmp/data1.txt" | awk '{ print $NF }')
first=$(sed -n 's/^tokens (32 inputs + 1 target): //p' "$tmp/data2.txt" | awk '{ print $1 }')
expect "mtrain data prints the loader summary and reads sequences" \
  'grep -q "^data: 2 shards, .* = $per_epoch sequences of 32 per epoch" "$tmp/data1.txt" && grep -q "^read 30 sequences (960 tokens)" "$tmp/data1.txt"'
expect "mtrain data --show: the last sequence of epoch 0 ends with the first token of epoch 1's (got $last, $first)" \
  '[ -n "$last" ] && [ "$last" = "$first" ] && grep -q "(epoch 1, sequence 0 of $per_epoch)" "$tmp/data2.txt"'

# expect_error NAME SUBSTRING OVERRIDES...: train fails with one line on stderr holding SUBSTRING.
expect_error() {
  local name=$1 substring=$2; shift 2
  "$mtrain" train "$tmp/run.yaml" checkpoint.dir="$tmp/err" checkpoint.resume=never "$@" >/dev/null 2>"$tmp/err.txt"
  local rc=$? lines
  lines=$(wc -l <"$tmp/err.txt")
  if [ "$rc" -eq 0 ]; then bad "$name" "exited 0"
  elif [ "$lines" -ne 1 ]; then bad "$name" "$lines lines on stderr: $(head -c 300 "$tmp/err.txt")"
  elif ! grep -qF -- "$substring" "$tmp/err.txt"; then bad "$name" "message '$(cat "$tmp/err.txt")' lacks '$substring'"
  else ok "$name"; fi
}

expect_error "empty glob" "data.train: '$tmp/none/*.shard' matches no file" data.train="$tmp/none/*.shard"
expect_error "one pattern of a list matches nothing" "data.train: '$tmp/c*.shard' matches no file" \
  data.train="$tmp/a.shard,$tmp/c*.shard"
expect_error "empty data.val glob" "data.val: '$tmp/v*.x' matches no file" data.val="$tmp/v*.x"
expect_error "seq_len longer than the training data" \
  "data.train has" train.seq_len=500 data.val_sequences=1
grep -q "fewer than one sequence of train.seq_len + 1 = 501 tokens" "$tmp/err.txt" || bad "seq_len message" "$(cat "$tmp/err.txt")"
expect_error "seq_len longer than all data" "fewer than the 200001 of data.val_sequences = 2 validation sequences" \
  train.seq_len=100000
expect_error "data.val too short" "$tmp/val.shard: data.val has" data.val="$tmp/val.shard" data.val_sequences=50
expect_error "shard vocabulary larger than the model's" \
  "$tmp/a.shard: vocabulary size 258 is larger than the model's (expected <= model.vocab_size = 200)" model.vocab_size=200
expect_error "a shard named twice" "$tmp/a.shard: named twice" data.train="$tmp/a.shard,$tmp/[ab].shard"
expect_error "data.val with synthetic data" "data.val: $tmp/val.shard names shards but data.train is 'synthetic'" \
  data.train=synthetic data.val="$tmp/val.shard"

printf 'this is not a shard, only some text that is long enough' >"$tmp/bad/magic.shard"
expect_error "wrong magic" "$tmp/bad/magic.shard: not an mtrain shard" data.train="$tmp/bad/magic.shard"

cp "$tmp/a.shard" "$tmp/bad/version.shard"
printf '\003' | dd of="$tmp/bad/version.shard" bs=1 seek=8 conv=notrunc status=none
expect_error "unsupported version" "$tmp/bad/version.shard: unsupported shard version 3 (expected 1 or 2)" \
  data.train="$tmp/bad/version.shard"

head -c -9 "$tmp/a.shard" >"$tmp/bad/short.shard"
expect_error "truncated file" "$tmp/bad/short.shard: truncated" data.train="$tmp/bad/short.shard"

# A flipped byte inside frame 0 (bytes from 128): found when the frame is read.
cp "$tmp/a.shard" "$tmp/bad/frame.shard"
byte=$(od -An -tu1 -j 140 -N 1 "$tmp/bad/frame.shard" | tr -d ' ')
printf "\\$(printf '%03o' $((byte ^ 1)))" | dd of="$tmp/bad/frame.shard" bs=1 seek=140 conv=notrunc status=none
expect_error "frame checksum mismatch" "$tmp/bad/frame.shard: frame 0 (tokens" data.train="$tmp/bad/frame.shard"
grep -q "checksum mismatch" "$tmp/err.txt" || bad "frame checksum message" "$(cat "$tmp/err.txt")"

# Token ids >= vocabulary: the header claims vocabulary 100 for byte tokens
# (ids up to 256), resealed with XXH64 (docs/FORMATS.md: header checksum).
/usr/bin/python3 - "$tmp/a.shard" "$tmp/bad/ids.shard" >"$tmp/reseal.txt" 2>&1 <<'PY'
import struct, sys
M = (1 << 64) - 1
P1, P2, P3, P4, P5 = 11400714785074694791, 14029467366897019727, 1609587929392839161, 9650029242287828579, 2870177450012600261
rotl = lambda x, r: ((x << r) | (x >> (64 - r))) & M
def rnd(acc, lane): return (rotl((acc + lane * P2) & M, 31) * P1) & M
def xxh64(data):  # seed 0
    n, i = len(data), 0
    lanes = lambda j, k: struct.unpack_from("<Q", data, j + 8 * k)[0]
    if n >= 32:
        v = [(P1 + P2) & M, P2, 0, (-P1) & M]
        while i + 32 <= n:
            v = [rnd(v[k], lanes(i, k)) for k in range(4)]
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v: h = (((h ^ rnd(0, x)) * P1) + P4) & M
    else:
        h = P5
    h = (h + n) & M
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, lanes(i, 0)), 27) * P1 + P4) & M; i += 8
    if i + 4 <= n:
        h = (rotl(h ^ (struct.unpack_from("<I", data, i)[0] * P1 & M), 23) * P2 + P3) & M; i += 4
    while i < n:
        h = (rotl(h ^ (data[i] * P5 & M), 11) * P1) & M; i += 1
    h ^= h >> 33; h = h * P2 & M; h ^= h >> 29; h = h * P3 & M; h ^= h >> 32
    return h
def seal(header):
    return header[:120] + struct.pack("<Q", xxh64(header[:120] + bytes(8)))
data = bytearray(open(sys.argv[1], "rb").read())
if seal(bytes(data[:128])) != bytes(data[:128]): sys.exit("xxh64 does not reproduce the stored header checksum")
data[16:24] = struct.pack("<Q", 100)
data[:128] = seal(bytes(data[:128]))
open(sys.argv[2], "wb").write(data)
PY
if [ -s "$tmp/bad/ids.shard" ]; then ok "XXH64 helper reproduces the header checksum, patched shard written"
else bad "XXH64 helper" "$(cat "$tmp/reseal.txt")"; fi
expect_error "token id >= vocabulary" "$tmp/bad/ids.shard: document " data.train="$tmp/bad/ids.shard"
grep -qE "document [0-9]+: token [0-9]+ \(frame 0\) has id [0-9]+ \(expected < vocabulary size 100\)" "$tmp/err.txt" ||
  bad "token id message names document and id" "$(cat "$tmp/err.txt")"

exit $((failures > 0))

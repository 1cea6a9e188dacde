#!/usr/bin/env bash
# test_train_ops.sh: the operations of a training run through build/mtrain:
# one step trains at the peak lr and changes the weights.
set -u
cd "$(dirname "$0")/.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib.sh

# configs/tiny-cpu.yaml made smaller.
RUN="configs/tiny-cpu.yaml model.hidden_size=32 model.intermediate_size=64 train.steps=12 train.seq_len=64
     train.warmup_steps=0 train.min_lr=0 attention.block_size=16 log.every=1"
train() { "$MTRAIN" train $RUN "$@" >>"$tmp/out.txt" 2>&1; }

# One step of the default (cosine, no warmup) schedule: at lr, weights move.
train checkpoint.dir="$tmp/one" train.steps=1 log.dir="$tmp/one_logs"
train checkpoint.dir="$tmp/zero" train.steps=1 train.lr=0 log.dir="$tmp/zero_logs"
expect "steps=1 trains at the peak lr" 'grep -q "\"step\": 1, .*\"lr\": 0.003[,}]" "$tmp/one_logs/metrics.jsonl"'
expect "steps=1 changes the weights" '! cmp -s "$tmp/one/step_00000001/model.safetensors" "$tmp/zero/step_00000001/model.safetensors"'
exit $((failures > 0))

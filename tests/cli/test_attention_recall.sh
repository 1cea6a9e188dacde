#!/usr/bin/env bash
# test_attention_recall.sh: the sparse pattern's recall logged during
# training (log.attention_every) and log.min_recall's warning: per layer
# `attention_recall` (the recall sample against dense attention) and
# `attention_estimation_recall` in metrics.jsonl, both in the step line; a
# budget too small for log.min_recall warns once per layer and logged step,
# naming the layer, the recall and the setting to raise (the fixed lines, or
# top_p with topp); a pattern that holds every key (top_p 1), or
# min_recall 0, never warns.
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib/lib.sh

RUN="configs/tiny-cpu.yaml model.hidden_size=32 model.intermediate_size=64 train.steps=2 train.seq_len=128
     train.warmup_steps=0 log.every=1 checkpoint.final=false attention.type=sparse attention.block_size=8
     attention.last_q=16 attention.sink=1 attention.local=1 log.attention_every=1"
FIXED="attention.budget=fixed attention.vertical=1 attention.slash=1"
# train NAME ARGS...: stdout in $tmp/NAME.out, stderr in $tmp/NAME.err, logs in $tmp/NAME.
train() {
  local name=$1
  shift
  "$MTRAIN" train $RUN checkpoint.dir="$tmp/$name.ck" log.dir="$tmp/$name" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  expect "$name: trains" "[ $? -eq 0 ]"
}

train fixed $FIXED log.min_recall=0.99
expect "metrics.jsonl: attention_recall and attention_estimation_recall per layer, in (0, 1], at both steps" \
  "python3 -c '
import json, sys
rows = [json.loads(l) for l in open(\"$tmp/fixed/metrics.jsonl\") if \"attention_recall\" in l]
ok = len(rows) == 2 and all(len(r[k]) == 2 and all(0 < x <= 1 + 1e-6 for x in r[k])
                            for r in rows for k in (\"attention_recall\", \"attention_estimation_recall\"))
sys.exit(0 if ok else 1)'"
expect "step line: density, recall and the estimation rows' recall" \
  'grep -Eq "attn density 0\.[0-9]+ recall 0\.[0-9]+ est 0\.[0-9]+" "$tmp/fixed.out"'
expect "fixed 1/1 under min_recall 0.99: one warning per layer and step (4)" \
  '[ "$(grep -c "sparse attention recall" "$tmp/fixed.err")" = 4 ]'
expect "the warning names the step, the layer, the recall, the threshold and the fixed lines to raise" \
  'grep -Eq "^warning: step 2: layer 1: sparse attention recall 0\.[0-9]{3} is under log.min_recall 0.99: .*raise attention.vertical 1 / attention.slash 1" "$tmp/fixed.err"'

train topp attention.top_p=0.05 attention.max_vertical=1 attention.max_slash=1 log.min_recall=0.99
expect "budget topp under min_recall: the warning names top_p and the caps" \
  'grep -Eq "^warning: step 1: layer 0: sparse attention recall .*raise attention.top_p 0.05, or attention.max_vertical 1 / max_slash 1" "$tmp/topp.err"'

train whole attention.top_p=1 attention.max_vertical=100000 attention.max_slash=100000 log.min_recall=0.99
expect "a pattern holding every key (top_p 1): recall 1, no warning" \
  'grep -q "recall 1.000" "$tmp/whole.out" && ! grep -q "sparse attention recall" "$tmp/whole.err"'

train off $FIXED
expect "min_recall 0 (the default): no warning" '! grep -q "sparse attention recall" "$tmp/off.err"'

exit $((failures > 0))

#!/usr/bin/env bash
# test_train_packing.sh: data.packing through `mtrain train`. On synthetic
# data (one document per sequence) balanced packing deals each sequence to
# its own slot, so training is bit-identical to sequential packing (the
# sequences are assembled token for token); on a shard of short documents it
# changes what the steps see (another loss), and a run stopped after step 3
# and resumed to step 6 is bit-identical to an uninterrupted one, on 1 rank
# with 4 micro-batches and on 2 dp ranks with 2 each; `mtrain data --show`
# prints a step's sequences as balanced packing forms them, and padded packing
# trains and shows each sequence as one document's piece, its loss the mean
# over targets without the padding. Prints "ok NAME" /
# "FAIL NAME: why".
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib/lib.sh
mpirun_env

# Short documents of 5 to 60 words, bytes-tokenized into one shard.
awk 'BEGIN { srand(5); split("the a river town bright quiet stone winter map road house light old new small", w, " ");
  for (d = 0; d < 80; d++) { f = sprintf("'"$tmp"'/doc%02d.txt", d); s = ""; n = 5 + int(rand() * 55);
    for (i = 0; i < n; i++) s = s w[int(rand() * 15) + 1] " "; print s > f; close(f) } }'
"$MTRAIN" tokenize --tokenizer bytes --input "$tmp"/doc*.txt --output "$tmp/docs.shard" >/dev/null

RUN="configs/tiny-cpu.yaml model.hidden_size=32 model.intermediate_size=64 model.vocab_size=258 train.seq_len=64
     attention.block_size=16 train.warmup_steps=0 train.lr_schedule=constant parallel.threads=1 train.micro_batches=4
     log.every=1"
train() {  # train NAME STEPS ARGS...: one rank, checkpoints in $tmp/NAME
  local name=$1 steps=$2
  shift 2
  "$MTRAIN" train $RUN checkpoint.dir="$tmp/$name" log.dir="$tmp/$name/logs" train.steps="$steps" "$@" \
    >>"$tmp/$name.out" 2>&1
}
same() { cmp -s "$1/model.safetensors" "$2/model.safetensors" && cmp -s "$1/optimizer.zst" "$2/optimizer.zst"; }
first_loss() { sed -n 's/^{"step": 1, "loss": \([0-9.e+-]*\).*/\1/p' "$tmp/$1/logs/metrics.jsonl"; }

train syn_seq 3 data.packing=sequential
train syn_bal 3 data.packing=balanced
expect "synthetic data: balanced packing trains bit-identically to sequential" \
  'same "$tmp/syn_seq/step_00000003" "$tmp/syn_bal/step_00000003"'

DOCS="data.train=$tmp/docs.shard data.doc_mask=true data.reset_positions=true"
train doc_seq 1 $DOCS data.packing=sequential
train doc_bal 1 $DOCS data.packing=balanced
seq_loss=$(first_loss doc_seq)
bal_loss=$(first_loss doc_bal)
expect "documents: balanced packing changes the step's sequences (loss $bal_loss vs $seq_loss)" \
  '[ -n "$seq_loss" ] && [ -n "$bal_loss" ] && [ "$seq_loss" != "$bal_loss" ]'

train stop 3 $DOCS data.packing=balanced
train stop 6 $DOCS data.packing=balanced
train whole 6 $DOCS data.packing=balanced
expect "balanced packing: resumed after step 3 to step 6 bit-identical to an uninterrupted run" \
  'grep -q "^resumed from $tmp/stop/step_00000003" "$tmp/stop.out" && same "$tmp/stop/step_00000006" "$tmp/whole/step_00000006"'

dp2() {  # dp2 NAME STEPS: 2 dp ranks x 2 micro-batches
  mpirun --oversubscribe --bind-to none -np 2 "$MTRAIN" train $RUN $DOCS data.packing=balanced parallel.dp=2 \
    train.micro_batches=2 checkpoint.dir="$tmp/$1" log.dir="$tmp/$1/logs" train.steps="$2" >>"$tmp/$1.out" 2>&1
}
dp2 dp_stop 3
dp2 dp_stop 6
dp2 dp_whole 6
expect "balanced packing over 2 dp ranks: resumed after step 3 bit-identical to an uninterrupted run" \
  'grep -q "^resumed from $tmp/dp_stop/step_00000003" "$tmp/dp_stop.out" && same "$tmp/dp_stop/step_00000006" "$tmp/dp_whole/step_00000006"'

# mtrain data --show: the sequences as training forms them. Under balanced
# packing the step's four sequences (4..7) hold the (input, target) pairs of
# the sequential sequences 4..7, each pair once, cut into whole documents
# (every sequence starts one at 0), dealt otherwise than sequentially.
show() {  # show PACKING G...: what --show prints for each sequence G
  local packing=$1 g
  shift
  for g in "$@"; do "$MTRAIN" data $RUN $DOCS data.packing="$packing" --show "$g"; done
}
pairs() {  # the (input, target) pairs of shown sequences, sorted, one per line
  awk '/^tokens \(/ { n = split(substr($0, index($0, ":") + 2), t, " "); for (i = 1; i < n; i++) print t[i], t[i + 1] }
       /^inputs \(/ { n = split(substr($0, index($0, ":") + 2), x, " ") }
       /^targets \(/ { split(substr($0, index($0, ":") + 2), y, " "); for (i = 1; i <= n; i++) print x[i], y[i] }' | sort
}
show sequential 4 5 6 7 >"$tmp/show_seq.txt"
show balanced 4 5 6 7 >"$tmp/show_bal.txt"
pairs <"$tmp/show_seq.txt" >"$tmp/pairs_seq.txt"
pairs <"$tmp/show_bal.txt" >"$tmp/pairs_bal.txt"
expect "mtrain data --show, balanced: the step's sequences hold the sequential step's $(wc -l <"$tmp/pairs_seq.txt") (input, target) pairs, each once" \
  '[ "$(wc -l <"$tmp/pairs_seq.txt")" -eq 256 ] && cmp -s "$tmp/pairs_seq.txt" "$tmp/pairs_bal.txt"'
expect "mtrain data --show, balanced: four sequences of whole documents, not the sequential ones" \
  '[ "$(grep -c "^document starts: 0\( \|$\)" "$tmp/show_bal.txt")" -eq 4 ] &&
   [ "$(grep "^document starts" "$tmp/show_bal.txt")" != "$(grep "^document starts" "$tmp/show_seq.txt")" ]'
"$MTRAIN" data $RUN $DOCS data.packing=balanced parallel.dp=2 train.micro_batches=2 --show 5 >"$tmp/show_dp.txt"
expect "mtrain data --show, balanced over 2 dp ranks: sequence 5 is micro-batch 0 of dp rank 1 in the step 4..7" \
  'grep -q "^sequence 5 (balanced packing: sequence 1 of the step of sequences 4..7, micro-batch 0 on dp rank 1 of 2)" "$tmp/show_dp.txt"'

# Padded packing: every sequence one document's piece from position 0 (a
# start listed on its first piece), padding (input 0, target -1) only after
# the document's end (its <|endoftext|>, 256, the last input with a target
# of -1); the documents' ends show up within the first sequences.
show padded 0 1 2 3 4 5 6 7 >"$tmp/show_pad.txt"
expect "mtrain data --show, padded: each sequence one document from position 0, padding only after its end" \
  'awk "/^document starts:/ { if (\$0 != \"document starts: 0\" && \$0 != \"document starts:\") bad = 1 }
        /^inputs \(/ { n = split(substr(\$0, index(\$0, \":\") + 2), x, \" \") }
        /^targets \(/ { split(substr(\$0, index(\$0, \":\") + 2), y, \" \"); pad = 0
          for (i = 1; i <= n; i++) { if (y[i] == -1) { if (!pad++ && x[i] != 256) bad = 1
                                                       if (i < n && (x[i + 1] != 0 || y[i + 1] != -1)) bad = 1 }
                                     else if (pad) bad = 1 }
          if (pad) ended++ }
        END { exit bad || ended < 2 }" "$tmp/show_pad.txt" && [ "$(grep -c "^targets (64)" "$tmp/show_pad.txt")" -eq 8 ]'
train doc_pad 1 $DOCS data.packing=padded
pad_loss=$(first_loss doc_pad)
expect "padded packing trains on the document pieces (loss $pad_loss vs $seq_loss sequential)" \
  '[ -n "$pad_loss" ] && [ "$pad_loss" != "$seq_loss" ] && [ "$pad_loss" != "$bal_loss" ]'
# Synthetic data is one whole document a sequence: padded packing trains on
# it as sequential does (the step's targets are every position).
train syn_pad 1 data.packing=padded
expect "padded packing on synthetic data trains as sequential (step 1: $(first_loss syn_pad))" \
  '[ -n "$(first_loss syn_pad)" ] && [ "$(first_loss syn_pad)" = "$(first_loss syn_seq)" ]'
# The loss is the mean over targets, padding excluded: at initialisation
# about ln(258) per target under either packing (a mean over every position
# would be lower by the step's share of padding).
expect "padded packing's loss is the mean over its targets, padding excluded (step 1: $pad_loss, sequential $seq_loss)" \
  'awk -v p="$pad_loss" -v s="$seq_loss" "BEGIN { exit !(p > 0.98 * s && p < 1.02 * s) }"'

[ "$failures" -eq 0 ]

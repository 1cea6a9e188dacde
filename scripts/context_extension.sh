#!/usr/bin/env bash
# context_extension.sh: the context-extension story on CPU. A small
# byte-level model learns passkey retrieval at 256 tokens, is extended 8x to
# 2048 tokens with YaRN and a fine-tune that runs sparse ring attention on 2
# MPI ranks, and its passkey accuracy by length is measured before and after
# (the same evaluation, sparse ring attention on 2 ranks, both times).
#   bash scripts/context_extension.sh        (about 15 minutes on 2 cores)
# Every stage prints its step lines (with ETA) and progress as it goes.
# Writes context_extension/: passkey.png (accuracy by length, before and
# after), results_before.json / results_after.json (every length x depth
# cell), summary.txt, and the logs and checkpoints of each stage.
# The environment varies it (scripts/sparse_vs_dense.sh runs it so):
#   OUT=DIR             the folder (context_extension)
#   SEED=S              train.seed of every training stage (the run file's 1)
#   FINETUNE=dense      the extension fine-tune with dense ring attention (sparse)
#   EVAL_ATTENTION=dense both evaluations with dense ring attention (sparse)
#   EVAL_ARGS="k=v .."  more overrides of both evaluations (eval.tasks=..., eval.samples=...)
#   COPY_STEPS, SHORT_STEPS, LONG_STEPS, SHORT_SAMPLES, LONG_SAMPLES  the stages' sizes
#   RESUME=1            continue OUT where it stopped: the sample shards and
#                       evaluations kept, each training stage from its newest
#                       checkpoint (every 100 steps), a finished one skipped
#   UNTIL=before        stop after the before evaluation
#   SHORT_MODEL=DIR     extend this short model (a checkpoint folder) instead of
#                       training one: stages 1 and 2 skipped (scripts/sparse_vs_dense.sh
#                       extends one short model in every arm)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-context_extension}
cfg=configs/context-extension.yaml
mtrain=build/mtrain
short=256 long=2048 ranks=2
factor=$((long / short))
copy_steps=${COPY_STEPS:-400} short_steps=${SHORT_STEPS:-3000} long_steps=${LONG_STEPS:-3000}
short_samples=${SHORT_SAMPLES:-24000} long_samples=${LONG_SAMPLES:-12000}
lengths=250,500,1000,2000
resume=${RESUME:-0}
[ "$resume" = 1 ] || rm -rf "$out"
mkdir -p "$out"
source scripts/cpu_ranks.sh
# Every training stage: the seed, and with RESUME=1 checkpoints to resume from.
stage="train.seed=${SEED:-1}"
[ "$resume" = 1 ] && stage="$stage checkpoint.resume=auto checkpoint.every=100"
# Sparse attention for everything that runs on the ring: a fixed budget per
# head over 32-token blocks (at 2048 tokens about a quarter of the causal
# score elements: `attn density` in the logs), blocks striped over the ranks,
# each ring hop sending only the K/V blocks still needed.
sparse="attention.type=sparse attention.budget=fixed attention.vertical=32 attention.slash=32 attention.sink=32
        attention.local=64 attention.ring_send=selected"
dense="attention.type=dense attention.ring_send=selected"
finetune=$sparse eval_attention=$sparse
[ "${FINETUNE:-sparse}" = dense ] && finetune=$dense
[ "${EVAL_ATTENTION:-sparse}" = dense ] && eval_attention=$dense
# The extended model: YaRN over the 256-token original context. beta_fast 2
# and beta_slow 0.5 are the defaults (32, 1) scaled to this model: YaRN keeps
# dimensions turning more than beta_fast times over the original context, and
# at 256 tokens beta_fast 32 keeps only wavelengths under 8 tokens, which
# breaks the short-offset attention that matching "pass key is" relies on
# (the model then relearns retrieval from scratch); beta_fast 2 keeps
# wavelengths under 128 tokens, as beta_fast 32 does at 4K tokens.
yarn="model.max_position_embeddings=$long model.rope_scaling.type=yarn model.rope_scaling.factor=$factor
      model.rope_scaling.original_max_position_embeddings=$short model.rope_scaling.beta_fast=2
      model.rope_scaling.beta_slow=0.5"
last() { echo "$1/$(cat "$1/latest")"; }

# Passkey samples (byte tokenizer) whose lengths vary smoothly from MIN to MAX
# (geometric steps), so that the distance from the key to the question takes
# hundreds of values: with a handful of lengths the model learns to fetch from
# fixed distances instead of finding the key, and that does not extend.
samples() {  # samples NAME MIN MAX COUNT SEED
  local name=$1 min=$2 max=$3 count=$4 seed=$5 part
  [ "$resume" = 1 ] && [ -f "$out/$name.shard" ] && return
  : >"$out/$name.jsonl"
  for part in 0 1 2 3; do  # eval.lengths takes 32 lengths: 4 interleaved sets
    local set
    set=$(python3 -c "print(','.join(sorted({str(round($min * ($max / $min) ** ((i + $part / 4) / 31)))
                                               for i in range(32) if i + $part / 4 <= 31})))")
    $mtrain tasks $cfg --count $((count / 4)) --output "$out/part.jsonl" eval.lengths="$set" \
      eval.seed=$((seed + part)) >/dev/null
    cat "$out/part.jsonl" >>"$out/$name.jsonl"
  done
  rm "$out/part.jsonl"
  $mtrain tokenize --tokenizer bytes --input "$out/$name.jsonl" --output "$out/$name.shard" >/dev/null
}
echo "== data: passkey samples of 130..$((short - 6)) and 130..$((long - 8)) tokens"
[ -n "${SHORT_MODEL:-}" ] || samples short 130 $((short - 6)) "$short_samples" 10
samples long 130 $((long - 8)) "$long_samples" 20

if [ -z "${SHORT_MODEL:-}" ]; then
# 1. Copying first (the built-in synthetic data repeats segments): induction
#    heads form here in a few hundred steps; on passkey text alone they take
#    far longer, because only the answer digits reward copying.
echo "== 1. $copy_steps steps of copying at $short tokens (synthetic data)"
$mtrain train $cfg $stage data.train=synthetic train.steps="$copy_steps" checkpoint.dir="$out/copy" log.dir="$out/copy"
# 2. Passkey retrieval at the short context.
echo "== 2. $short_steps steps of passkey retrieval at $short tokens"
$mtrain train $cfg $stage data.train="$out/short.shard" train.init_from="$(last "$out/copy")" train.steps="$short_steps" \
  train.micro_batches=8 train.lr=1e-3 train.min_lr=1e-4 checkpoint.dir="$out/short" log.dir="$out/short"
fi
short_model=${SHORT_MODEL:-$(last "$out/short")}

evaluate() {  # evaluate NAME MODEL [overrides]: passkey by length and depth on the ring
  local name=$1 model=$2
  shift 2
  [ "$resume" = 1 ] && [ -f "$out/results_$name.json" ] && return
  run_ranks $ranks eval $cfg eval.model="$model" eval.lengths=$lengths eval.out="$out/eval_$name" $eval_attention \
    ${EVAL_ARGS:-} "$@"
  cp "$out/eval_$name/results.json" "$out/results_$name.json"
}
# 3. Before: the short model as trained (plain RoPE), at 1x..8x its context.
echo "== 3. before: the $short-token model at lengths $lengths (${EVAL_ATTENTION:-sparse} ring attention, $ranks ranks)"
evaluate before "$short_model" model.max_position_embeddings=$long
[ "${UNTIL:-}" = before ] && exit 0

# 4. Extension: YaRN factor 8 and a fine-tune at 2048 tokens, sparse ring
#    attention over the ranks (cp = ranks: each holds half of every sequence).
echo "== 4. extension: YaRN x$factor, $long_steps steps at $long tokens, ${FINETUNE:-sparse} ring attention on $ranks ranks"
run_ranks $ranks train $cfg $stage $yarn $finetune train.seq_len=$long train.micro_batches=1 train.lr=1e-3 train.min_lr=1e-4 \
  train.warmup_steps=10 data.train="$out/long.shard" data.val_sequences=2 train.init_from="$short_model" \
  train.steps="$long_steps" checkpoint.dir="$out/long" log.dir="$out/long" log.every=500 log.attention_every=500 \
  log.val_every="$long_steps"

# 5. After: the extended model, same evaluation.
echo "== 5. after: the extended model at lengths $lengths"
evaluate after "$(last "$out/long")" $yarn

# Accuracy by length (mean over depths), before and after.
python3 - "$out" <<'PY' >"$out/summary.txt"
import json, sys
out = sys.argv[1]
acc = {}
for name in ("before", "after"):
    cells = [t for t in json.load(open(f"{out}/results_{name}.json"))["tasks"] if t["task"] == "passkey"]
    for t in cells:
        c = acc.setdefault(t["length"], {}).setdefault(name, [0, 0])
        c[0] += t["correct"]
        c[1] += t["samples"]
print("# length  before  after   (passkey exact-match accuracy, mean over depths)")
for length in sorted(l for l in acc if len(acc[l]) == 2):   # the lengths both evaluations ran
    b, a = (acc[length][n][0] / acc[length][n][1] for n in ("before", "after"))
    print(f"{length:8d}  {b:6.3f}  {a:6.3f}")
PY
gnuplot <<GP
set terminal pngcairo size 900,500
set output '$out/passkey.png'
set title "mtrain context extension on CPU: passkey accuracy of a $short-token model\\nbefore and after YaRN x$factor + $long_steps steps at $long tokens (sparse ring attention, $ranks MPI ranks)" font ',10'
set xlabel 'prompt length (tokens)'
set ylabel 'passkey exact-match accuracy'
set logscale x 2
set xrange [200:2500]
set yrange [-0.05:1.05]
set grid
set key bottom left
set arrow from $short, graph 0 to $short, graph 1 nohead dt 2
set label 'trained context' at $short, graph 0.95 offset 1,0
plot '$out/summary.txt' using 1:2 with linespoints lw 2 pt 7 title 'before (plain RoPE, trained at $short)', \
     '' using 1:3 with linespoints lw 2 pt 5 title 'after (YaRN x$factor, fine-tuned at $long)'
GP
echo
echo "== result ($out/summary.txt, plot $out/passkey.png)"
cat "$out/summary.txt"

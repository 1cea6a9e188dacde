#!/usr/bin/env bash
# sparse_vs_dense.sh: is a model trained with sparse attention as good as one
# trained with dense attention, everything else the same? The context-extension
# recipe (scripts/context_extension.sh) trains its short model once (seed 1);
# then for each of SEEDS seeds its extension fine-tune runs twice from that
# model, once with sparse ring attention (the recipe's fixed budget) and once
# with dense ring attention (same data, steps, schedule and seed: the seed
# orders the fine-tune's data and picks its held-out documents). Each extended
# model gets the same dense `mtrain eval` (passkey, NIAH and RULER by length x
# depth at 500, 1000 and 2000 tokens; perplexity by length on the fine-tune's
# held-out documents), and one table shows per task and length each arm's
# mean over the seeds and its spread (sample standard deviation; the smallest
# and largest seed).
#   bash scripts/sparse_vs_dense.sh        (3 seeds: the short model and six fine-tunes, about 45 minutes on 2 cores)
# Interrupted, the same command resumes every arm where it stopped
# (context_extension.sh with RESUME=1: from its newest checkpoint); FRESH=1
# starts over. Environment: SEEDS (3), OUT (sparse_vs_dense), and
# context_extension.sh's sizes (COPY_STEPS, SHORT_STEPS, LONG_STEPS,
# SHORT_SAMPLES, LONG_SAMPLES) and EVAL_ARGS (e.g. eval.samples=2).
# Writes OUT/base/ (the short model), OUT/seedS/ARM/ (each fine-tune's folder,
# results_after.json its evaluation), OUT/table.txt and OUT/table.json.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-sparse_vs_dense}
seeds=${SEEDS:-3}
[ "${FRESH:-0}" = 1 ] && rm -rf "$out"
mkdir -p "$out"
echo "== the short model, once ($out/base)"
OUT="$out/base" SEED=1 EVAL_ATTENTION=dense RESUME=1 UNTIL=before bash scripts/context_extension.sh
short_model=$(realpath "$out/base/short/$(cat "$out/base/short/latest")")
for seed in $(seq 1 "$seeds"); do
  for arm in dense sparse; do
    dir="$out/seed$seed/$arm"
    echo "== seed $seed: the $arm fine-tune ($dir)"
    mkdir -p "$dir"
    cp -n "$out/base/long.shard" "$out/base/results_before.json" "$dir/"   # kept: RESUME=1 skips both
    # The held-out documents of the fine-tune (its data, seq_len, seed and val_sequences) for perplexity.
    OUT="$dir" SEED="$seed" FINETUNE="$arm" EVAL_ATTENTION=dense RESUME=1 SHORT_MODEL="$short_model" \
      EVAL_ARGS="eval.tasks=perplexity,passkey,niah,ruler eval.lengths=500,1000,2000 eval.text=heldout data.train=$dir/long.shard
                 train.seq_len=2048 train.seed=$seed data.val_sequences=2 ${EVAL_ARGS:-}" \
      bash scripts/context_extension.sh
  done
done

python3 - "$out" "$seeds" <<'PY'
import json, math, sys
out, seeds = sys.argv[1], int(sys.argv[2])
# score[(task, length)][arm] = one number per seed: accuracy over depths, or perplexity.
score = {}
for seed in range(1, seeds + 1):
    for arm in ("dense", "sparse"):
        r = json.load(open(f"{out}/seed{seed}/{arm}/results_after.json"))
        acc = {}
        for cell in r["tasks"]:
            a = acc.setdefault((cell["task"], cell["length"]), [0, 0])
            a[0] += cell["correct"]
            a[1] += cell["samples"]
        for key, (c, n) in acc.items():
            score.setdefault(key, {}).setdefault(arm, []).append(c / n)
        for row in r["perplexity"]:
            score.setdefault(("perplexity", row["length"]), {}).setdefault(arm, []).append(row["perplexity"])

def stats(x):
    mean = sum(x) / len(x)
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1)) if len(x) > 1 else float("nan")
    return mean, sd, min(x), max(x)

rows, lines = [], []
lines.append(f"# {seeds} seeds per arm; mean, standard deviation over seeds [min, max]; accuracy (mean over depths)"
             " or perplexity; dense eval of both arms")
lines.append(f"{'task':16s} {'length':>6s}  {'dense':>30s}  {'sparse':>30s}  {'sparse - dense':>14s}")
for (task, length) in sorted(score, key=lambda k: (k[0] != "perplexity", k[0], k[1])):
    d, s = stats(score[(task, length)]["dense"]), stats(score[(task, length)]["sparse"])
    cell = lambda m: f"{m[0]:7.3f} sd {m[1]:6.3f} [{m[2]:6.3f}, {m[3]:6.3f}]"
    lines.append(f"{task:16s} {length:6d}  {cell(d):>30s}  {cell(s):>30s}  {s[0] - d[0]:14.3f}")
    rows.append({"task": task, "length": length, "dense": score[(task, length)]["dense"],
                 "sparse": score[(task, length)]["sparse"]})
open(f"{out}/table.txt", "w").write("\n".join(lines) + "\n")
json.dump({"seeds": seeds, "rows": rows}, open(f"{out}/table.json", "w"), indent=1)
print("\n".join(lines))
PY
echo "== table: $out/table.txt"

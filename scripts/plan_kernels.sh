#!/usr/bin/env bash
# plan_kernels.sh: the planned CUDA training step per kernel (predictions,
# not measurements): `build/mtrain plan --kernels` for the
# Qwen2.5-0.5B and 3B shapes (the model sections of their run files) at
# 32K, 128K and 512K tokens on one GPU (cp 1, dp 1, no ZeRO sharding,
# activation checkpointing, the run files' loss chunk), first a summary
# table (memory plan, the kernels' derived time bound and MFU on the
# A100-80GB and H100, for dense and for the run files' sparse attention),
# then the per-kernel table of every sparse case. Markdown on stdout.
#   bash scripts/plan_kernels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/mtrain ] || make -s build/mtrain

declare -A base=([0.5B]=configs/qwen2.5-0.5b-128k-8xa100.yaml [3B]=configs/qwen2.5-3b-512k-32xa100.yaml)
lengths=(32768 131072 524288)

# plan MODEL N ATTENTION: the plan of one case, with its kernel table.
plan() {
  local n=$2
  build/mtrain plan "${base[$1]}" --gpu a100-80g --kernels parallel.cp=1 parallel.dp=1 \
    parallel.zero=0 train.micro_batches=1 train.recompute=full train.seq_len="$n" \
    model.max_position_embeddings="$((n > 131072 ? n : 131072))" attention.type="$3" || [ $? -eq 3 ]  # 3: does not fit
}

echo "| model | tokens | attention | GiB per GPU (fits A100-80GB / H100) | A100 derived s (MFU) | H100 derived s (MFU) | measured A100 s (MFU) | measured H100 s (MFU) |"
echo "|---|---|---|---|---|---|---|---|"
for model in 0.5B 3B; do
  for n in "${lengths[@]}"; do
    for attention in dense sparse; do
      plan "$model" "$n" "$attention" | awk -v model="$model" -v n="$n" -v att="$attention" '
        /^  total / { gib = $2 }
        /^fits: / { fits = $2 }
        /^FLOPs per step/ { split($0, f, "density "); split(f[2], d, " "); density = d[1] }
        /^(a100-80g|h100): the kernels. bounds add up to/ {
          gsub(/[,%]/, " ")
          cell[$1] = sprintf("%.2f (%.1f%%)", $8, $15)
        }
        END {
          label = att == "dense" ? "dense" : sprintf("sparse, density %.3f", density)
          printf "| %s | %dK | %s | %.1f (%s) | %s | %s | | |\n", model, n / 1024, label, gib, fits,
                 cell["a100-80g:"], cell["h100:"]
        }'
    done
  done
done
for model in 0.5B 3B; do
  for n in "${lengths[@]}"; do
    echo
    echo "#### $model, $((n / 1024))K tokens, sparse attention"
    plan "$model" "$n" sparse | sed -n '/^| kernel/,$p'
  done
done

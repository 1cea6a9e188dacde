#!/usr/bin/env bash
# bench_cpu.sh: CPU training throughput (forward+backward+AdamW) and peak
# memory of a ~20M-parameter Qwen2 at 2K and 8K tokens, side by side with
# PyTorch (CPU fp32 eager, same shapes, scripts/bench_cpu_torch.py).
# Prints a markdown table for docs/PERFORMANCE.md.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s all
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# vocab hidden inter layers heads kv_heads: 20.7M parameters (tied), head dim 64.
shape=(8192 512 1376 6 8 2)
cat >"$tmp/run.yaml" <<YAML
model: {vocab_size: ${shape[0]}, hidden_size: ${shape[1]}, intermediate_size: ${shape[2]}, num_layers: ${shape[3]}, num_heads: ${shape[4]}, num_kv_heads: ${shape[5]}}
attention: {block_size: 64}
train: {steps: 4, lr: 1e-4, warmup_steps: 0}
checkpoint: {dir: $tmp/ckpt, resume: never}
log: {dir: $tmp/log}
YAML
echo "device: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $(date -u +%F)"
echo
echo "| tokens | recompute | mtrain tok/s | mtrain peak RSS MiB | torch tok/s | torch peak RSS MiB | mtrain / torch |"
echo "|---|---|---|---|---|---|---|"
for T in 2048 8192; do
  for ckpt in none full; do
    rm -rf "$tmp/log" "$tmp/ckpt"
    /usr/bin/time -f %M -o "$tmp/rss" build/mtrain train "$tmp/run.yaml" train.seq_len=$T \
      train.recompute=$ckpt >/dev/null
    # best of steps 2..4 (step 1 warms up)
    ours=$(grep -o '"tokens_per_s": [0-9.]*' "$tmp/log/metrics.jsonl" | tail -n 3 | awk '{print $2}' | sort -g | tail -n 1)
    our_rss=$(( $(cat "$tmp/rss") / 1024 ))
    if [ "$ckpt" = none ]; then
      /usr/bin/time -f %M -o "$tmp/trss" /usr/bin/python3 scripts/bench_cpu_torch.py $T "${shape[@]}" >"$tmp/torch"
      theirs=$(awk '{print $2}' "$tmp/torch")
      their_rss=$(( $(cat "$tmp/trss") / 1024 ))
    fi
    ratio=$(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.2f", a / b }')
    echo "| $T | $ckpt | ${ours%.*} | $our_rss | $theirs | $their_rss | $ratio |"
  done
done

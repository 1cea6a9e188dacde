#!/usr/bin/env bash
# bench_train.sh: training throughput on one GPU, mtrain against Hugging Face
# transformers, then the longest context one GPU trains.
#   1. mtrain (build/cuda/mtrain, train.backend=cuda, dense attention,
#      activation checkpointing) and scripts/bench_train_hf.py
#      (Qwen2ForCausalLM: SDPA attention, gradient checkpointing, bf16
#      autocast, fused AdamW) on the same model shape, one sequence of TOKENS
#      random tokens per step, STEPS steps (the first is not timed). Prints
#      tokens/s and MFU of both and the ratio (goals: ≥ 1.3× and MFU ≥ 45%).
#      MFU is mtrain's: model FLOPs at the GPU profile's bf16 peak
#      (hardware.gpu, from nvidia-smi's name); the peer's is the same FLOPs
#      per token at its tokens/s.
#   2. The longest sequence mtrain trains for 2 steps on the 0.5B shape with
#      its run file's sparse attention: 32768 doubled until a run fails or
#      MAX_TOKENS (default 1048576) is reached (goal 512K).
# Without a GPU it exits 1 with one line.
#   scripts/bench_train.sh [0.5b|3b] [TOKENS] [STEPS]     default 0.5b 32768 10
# Shapes: the model sections of configs/qwen2.5-0.5b-128k-8xa100.yaml and
# configs/qwen2.5-3b-512k-32xa100.yaml. Logs go to $OUT when set, else
# build/bench-train.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "bench_train.sh: no GPU visible (nvidia-smi lists none); this benchmark trains on one GPU" >&2
  exit 1
fi
shape=${1:-0.5b} tokens=${2:-32768} steps=${3:-10}
case "$shape" in
  0.5b) base=configs/qwen2.5-0.5b-128k-8xa100.yaml ;;
  3b) base=configs/qwen2.5-3b-512k-32xa100.yaml ;;
  *) echo "bench_train.sh: shape '$shape' (expected 0.5b or 3b)" >&2; exit 2 ;;
esac
[[ $tokens =~ ^[0-9]+$ && $tokens -ge 2 && $steps =~ ^[0-9]+$ && $steps -ge 2 ]] ||
  { echo "bench_train.sh: TOKENS '$tokens' and STEPS '$steps' (expected integers, at least 2 each)" >&2; exit 2; }
out=${OUT:-build/bench-train}
mkdir -p "$out"
make -s build/cuda/mtrain >/dev/null

# The datasheet profile of GPU 0 (trainer/plan.c) from its name and memory.
read -r gpu_name gpu_mib < <(nvidia-smi -i 0 --query-gpu=name,memory.total --format=csv,noheader,nounits |
                             awk -F', ' '{ gsub(/ /, "_", $1); print $1, $2 }')
case "$gpu_name" in
  *A100*) if [ "$gpu_mib" -gt 60000 ]; then gpu=a100-80g; else gpu=a100-40g; fi ;;
  *H100*) gpu=h100 ;;
  *H200*) gpu=h200 ;;
  *) gpu=none ;;
esac
echo "GPU 0: $gpu_name, $gpu_mib MiB (profile $gpu)"

# mtrain_run NAME TOKENS STEPS OVERRIDES...: one run on GPU 0; its log in
# $out/NAME.log, metrics in $out/NAME/metrics.jsonl; the exit status of mtrain.
mtrain_run() {
  local name=$1 n=$2 s=$3; shift 3
  rm -rf "$out/$name"
  build/cuda/mtrain train "$base" train.init_from=none train.backend=cuda data.train=synthetic \
    parallel.dp=1 parallel.cp=1 parallel.zero=0 train.micro_batches=1 train.recompute=full \
    train.seq_len="$n" train.steps="$s" train.warmup_steps=0 train.lr_schedule=constant \
    model.max_position_embeddings="$((n > 131072 ? n : 131072))" hardware.gpu="$gpu" \
    checkpoint.dir="$out/$name/ck" checkpoint.resume=never checkpoint.overwrite=true \
    log.dir="$out/$name" log.every=1 "$@" >"$out/$name.log" 2>&1
}

# Mean of KEY over the steps after the first of a metrics.jsonl.
mean_after_first() {
  /usr/bin/python3 -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
print(sum(r[sys.argv[2]] for r in rows) / len(rows))' "$1" "$2"
}

echo "== throughput: $shape, $tokens tokens per step, $steps steps"
mtrain_run dense "$tokens" "$steps" attention.type=dense ||
  { echo "bench_train.sh: mtrain failed (see $out/dense.log):"; tail -n 3 "$out/dense.log"; exit 1; }
mt_tps=$(mean_after_first "$out/dense/metrics.jsonl" tokens_per_s)
mt_mfu=$(mean_after_first "$out/dense/metrics.jsonl" mfu)
build/cuda/mtrain config "$base" train.init_from=none >"$out/config.yaml"
hf_tps=
if /usr/bin/python3 scripts/bench_train_hf.py "$out/config.yaml" "$tokens" "$steps" cuda >"$out/hf.log" 2>&1; then
  hf_tps=$(awk '$1 == "hf_tokens_per_s" { print $2 }' "$out/hf.log")
else
  echo "transformers peer failed (see $out/hf.log): $(tail -n 1 "$out/hf.log")"
fi
echo
echo "| system | tokens/s | MFU |"
echo "|---|---:|---:|"
awk -v t="$mt_tps" -v m="$mt_mfu" 'BEGIN { printf "| mtrain | %.0f | %.1f%% |\n", t, 100 * m }'
if [ -n "$hf_tps" ]; then
  awk -v t="$hf_tps" -v mt="$mt_tps" -v m="$mt_mfu" \
    'BEGIN { printf "| transformers | %.0f | %.1f%% |\n", t, 100 * m * t / mt
             printf "\nmtrain / transformers: %.2fx (goal >= 1.3x), mtrain MFU %.1f%% (goal >= 45%%)\n", mt / t, 100 * m }'
fi

echo
echo "== longest context, 0.5B shape, sparse attention (2 steps per length)"
base=configs/qwen2.5-0.5b-128k-8xa100.yaml
max=${MAX_TOKENS:-1048576} n=32768 longest=0
while [ "$n" -le "$max" ]; do
  if mtrain_run "context_$n" "$n" 2; then
    echo "$n tokens: trains ($(awk '/^run summary/ { print $0 }' "$out/context_$n.log" | cut -c1-100))"
    longest=$n
  else
    echo "$n tokens: fails: $(grep -m1 -i 'out of memory\|mtrain:' "$out/context_$n.log" || tail -n 1 "$out/context_$n.log")"
    break
  fi
  n=$((n * 2))
done
echo "longest context trained on one GPU: $longest tokens (goal 524288)"

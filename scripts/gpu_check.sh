#!/usr/bin/env bash
# gpu_check.sh: the one command for a GPU machine, run from the GPU bundle
# (make gpu-bundle, scripts/gpu_bundle.sh): nothing is compiled there. Nine
# stages, each under its own time limit (`timeout`, the whole stage stopped
# past it); a stage that fails, is skipped or runs out of time says so in its
# summary line and the next one runs regardless:
#   device     GPU, driver, clocks, memory (nvidia-smi); the cuBLASLt and NCCL in use
#   sweep      every attention kernel variant on the sweep's shapes and the
#              cost model's micro-benchmarks (bin/gpu_sweep_attention): its
#              table, $OUT/sweep.tsv, is what scripts/sweep_table.sh turns into
#              the trainer's choice of variant (the sim: small shapes)
#   tests      the GPU test programs (bin/gpu_test_*) at full size (the sim: two, small)
#   sanitizer  compute-sanitizer memcheck, racecheck and synccheck on the small
#              cases of the attention, sparse, ops and matmul tests (the sim:
#              its AddressSanitizer build and another seed, matmul only)
#   attention  dense flash attention forward + backward against PyTorch SDPA
#              (flash and cuDNN) at 4K, 16K and 64K tokens, head dims 128 and
#              64, GQA 16:2 (TFLOP/s, ratio; scripts/bench_attention.py); the
#              sparse pipeline at ~95% and ~90% sparsity against our dense
#              (speed-up ÷ ideal speed-up, the ideal being 1 / density)
#   train      the CUDA backend: a tiny model on the bundle's shard; the
#              Qwen2.5-0.5B shape (random init) at 8K and 32K tokens per step
#              against transformers' Qwen2ForCausalLM in bf16 with the same
#              activation checkpointing (scripts/bench_train_hf.py): tokens/s,
#              MFU, peak memory (nvidia-smi, sampled) against the memory plan
#              mtrain prints at start (within 10%)
#   dw_stream  the first training size with train.dw_stream off and on, a few
#              steps each: tokens/s of each (whether the dW GEMMs on a second
#              stream pay) and their losses within 1%
#   agreement  20 steps of 8K tokens from the same weights (transformers'
#              random init, saved as a Hugging Face folder that mtrain starts
#              from) on the same sequences (`mtrain data --show`): losses
#              within 2% step by step
#   context    the longest sequence the 0.5B shape trains a step, sparse and
#              dense: 32K doubled while runs succeed, each run bounded
# Limits: 564 s in all on a GPU. $OUT (default ./gpu-check) receives
# summary.txt, written after every stage (one line per stage, then each
# stage's figures), one log per stage, NAME.log, and sweep.tsv: 11 files. Scratch
# (metrics) goes to $TMPDIR; the training runs write no checkpoint
# (checkpoint.final=false: 5.6 GB and 11-14 s each at 0.5B).
#   OUT=DIR gpu-bundle/run gpu_check.sh    on the GPU machine (python3 on PATH: PyTorch's, or PYTHON=)
#   ... gpu_check.sh --stages A,B          only the stages named, in the usual order (a second, shorter run
#                                          for what failed), e.g. --stages tests,train,agreement,context
#   scripts/gpu_check.sh --sim             here: the same stages on the sim builds (build/sim/) at tiny
#                                          sizes; the PyTorch stages and nvidia-smi skipped, one line each
set -uo pipefail
script=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
mode=gpu
if [ "${1:-}" = --sim ]; then mode=sim; shift; fi
stages='' stages_given=''
if [ "${1:-}" = --stages ]; then stages_given=1 stages=${2:-}; shift; [ $# -gt 0 ] && shift; fi
python=${PYTHON:-python3}
if [ $mode = sim ]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  bin=$root/build/sim/tests mtrain=$root/build/sim/mtrain
  hf_script=$root/scripts/bench_train_hf.py bench_py=$root/scripts/bench_attention.py
else
  root=${MTRAIN_BUNDLE:-}
  if [ -z "$root" ] || [ ! -x "$root/bin/mtrain" ]; then
    echo "gpu_check.sh: run it from the GPU bundle (make gpu-bundle; then OUT=DIR gpu-bundle/run gpu_check.sh)," \
         "or here with --sim" >&2
    exit 2
  fi
  bin=$root/bin mtrain=$root/bin/mtrain
  hf_script=$root/scripts/bench_train_hf.py bench_py=$root/scripts/bench_attention.py
fi
configs=$root/configs
out=${OUT:-gpu-check}
flag=
[ $mode = sim ] && flag=--sim

# ---- helpers of the stages (each stage runs as `gpu_check.sh [--sim] --stage NAME` under timeout)

# result TEXT: one figure of this stage, into its log and the summary.
result() { echo "$*"; echo "$*" >>"$GPU_CHECK_WORK/$stage.result"; }
# failed TEXT: a figure that fails the stage.
failed() { result "FAIL $*"; stage_rc=1; }
# skipped TEXT: a part of the stage that does not run here, in one line.
skipped() { result "skipped: $*"; }

# gpu_profile: the datasheet profile of GPU 0 (trainer/plan.c), or none.
gpu_profile() {
  local name mib
  [ $mode = sim ] && { echo none; return; }
  IFS=, read -r name mib < <(nvidia-smi -i 0 --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null)
  case "$name" in
    *A100*) if [ "${mib// /}" -gt 60000 ]; then echo a100-80g; else echo a100-40g; fi ;;
    *H100*) echo h100 ;;
    *H200*) echo h200 ;;
    *) echo none ;;
  esac
}

# train_run NAME TOKENS STEPS ARGS...: mtrain on the CUDA backend, one
# sequence of TOKENS per step, activation checkpointing, constant lr; the
# model of $base (the 0.5B run file; under the sim the tiny one) with ARGS;
# log $work/NAME.log, metrics $work/NAME/metrics.jsonl; on a GPU the most
# memory nvidia-smi saw in use, sampled every 100 ms, in $work/NAME.mem (MiB).
# $run_limit (seconds, unset: none) bounds the run (exit 124 past it).
train_run() {
  local name=$1 n=$2 s=$3 sampler='' rc
  shift 3
  rm -rf "${work:?}/$name"
  if [ $mode = gpu ]; then
    nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$work/$name.smi" 2>/dev/null &
    sampler=$!
  fi
  timeout -k 5 "${run_limit:-0}" "$mtrain" train "$base" train.init_from=none train.backend=cuda data.train=synthetic parallel.dp=1 parallel.cp=1 \
    parallel.zero=0 train.micro_batches=1 train.recompute=full train.seq_len="$n" train.steps="$s" \
    train.warmup_steps=0 train.lr_schedule=constant model.max_position_embeddings="$((n > 131072 ? n : 131072))" \
    hardware.gpu="$gpu" checkpoint.dir="$work/$name/ck" checkpoint.every=0 checkpoint.final=false \
    checkpoint.resume=never log.dir="$work/$name" log.every=1 "${model_args[@]}" "$@" >"$work/$name.log" 2>&1 </dev/null
  rc=$?
  if [ -n "$sampler" ]; then
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    sort -n "$work/$name.smi" | tail -n 1 >"$work/$name.mem"
  fi
  tail -n 4 "$work/$name.log"
  return $rc
}

# metric NAME KEY [after_first]: the mean of KEY over the steps of run NAME
# (after_first: without the first step), or "-".
metric() {
  awk -v key="\"$2\":" -v skip="${3:-}" '{ for (i = 1; i < NF; i++) if ($i == key) { v = $(i + 1); sub(/[,}]/, "", v)
       if (!(skip && NR == 1)) { s += v; n++ } } } END { if (n) printf "%.6g\n", s / n; else print "-" }' \
    "$work/$1/metrics.jsonl" 2>/dev/null || echo -
}

# plan_gib NAME: the total of the memory plan that run NAME printed at start (GiB), or "-".
plan_gib() { awk '/^memory plan \(cuda backend/ { for (i = 1; i <= NF; i++) if ($i == "=") v = $(i + 1) }
  END { print v ? v : "-" }' "$work/$1.log"; }

# ---- the stages

stage_device() {
  if [ $mode = sim ]; then
    result "device: the CPU execution model of CUDA (build/sim/, docs/SIM.md), $(nproc) CPUs"
    skipped "nvidia-smi (no GPU under the sim)"
    return
  fi
  nvidia-smi || { failed "nvidia-smi failed: no GPU visible"; return; }
  nvidia-smi -q -d CLOCK,PERFORMANCE,POWER
  result "GPU: $(nvidia-smi -i 0 --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,persistence_mode \
    --format=csv,noheader | sed 's/, / | /g') (name | driver | memory | SM clock now | SM clock max | memory clock | power limit | persistence)"
  result "libraries: LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}; python3: $(command -v "$python") ($("$python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -n 1))"
  command -v compute-sanitizer >/dev/null && result "compute-sanitizer: $(compute-sanitizer --version | tail -n 1)"
}

# The sweep's table into $out/sweep.tsv; its micro-benchmarks and each kind's best variant at the longest
# causal shape into the summary.
stage_sweep() {
  local args=() rc
  [ $mode = sim ] && args=(small --repeats 1)
  echo "== gpu_sweep_attention ${args[*]}"
  mkdir -p "$out"
  "$bin/gpu_sweep_attention" "${args[@]}" --out "$out/sweep.tsv" >"$work/sweep.out" 2>&1
  rc=$?
  cat "$work/sweep.out"
  cat "$out/sweep.tsv" 2>/dev/null
  if [ $rc -ne 0 ]; then
    failed "gpu_sweep_attention (exit $rc): $({ grep -m 2 -E '^FAIL|cudasim|error' "$work/sweep.out" || tail -n 1 "$work/sweep.out"; } | tr '\n' ' ' | cut -c1-200)"
    return
  fi
  result "ok gpu_sweep_attention: $(tail -n 1 "$work/sweep.out"); table: $out/sweep.tsv"
  result "micro-benchmarks: $(awk '/^# [a-z0-9_]+ [0-9.e+-]+$/ { printf "%s%s %s", n++ ? ", " : "", $2, $3 }' "$out/sweep.tsv")"
  awk -F'\t' '$1 !~ /^#/ && $1 != "variant" && $4 ~ /^(causal|sparse)_/ { k = $2 " d=" $3; split($4, s, "_")
         if (s[2] + 0 < max[k]) next
         if (s[2] + 0 > max[k]) { max[k] = s[2] + 0; best[k] = "" }
         if (best[k] == "" || $8 + 0 > tf[k]) { best[k] = $1 " " $4; tf[k] = $8 + 0 } }
       END { for (k in best) printf "best %s: %s, %.4g TFLOP/s\n", k, best[k], tf[k] }' "$out/sweep.tsv" |
    sort | while read -r line; do result "$line"; done
}

stage_tests() {
  local name rc start arg=
  [ $mode = sim ] && arg=small && result "sim: ${test_programs[*]} (small; tests/sim/test_sim.sh runs every one under three seeds)"
  for name in "${test_programs[@]}"; do
    prog=$bin/$name
    echo "== $name $arg"
    start=$SECONDS
    timeout -k 5 "$per_test" "$bin/$name" $arg >"$work/test.out" 2>&1
    rc=$?
    cat "$work/test.out"
    if [ $rc -eq 0 ] && ! grep -q '^FAIL' "$work/test.out"; then
      result "ok $name ($((SECONDS - start)) s): $(tail -n 1 "$work/test.out" | cut -c1-120)"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      failed "$name: past its ${per_test} s"
    else
      failed "$name (exit $rc): $({ grep -m 2 -E '^FAIL|error|cudasim' "$work/test.out" || tail -n 1 "$work/test.out"; } | tr '\n' ' ' | cut -c1-200)"
    fi
  done
}

# sanitize LABEL COMMAND...: one sanitizer run, its summary line.
sanitize() {
  local label=$1 rc start=$SECONDS
  shift
  echo "== $label: $*"
  timeout -k 5 "$per_sanitizer" "$@" >"$work/san.out" 2>&1
  rc=$?
  cat "$work/san.out"
  local summary
  summary=$(grep -m 1 -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed, .* failed' "$work/san.out" | cut -c1-100)
  if [ $rc -eq 0 ]; then result "ok $label ($((SECONDS - start)) s): ${summary:-$(tail -n 1 "$work/san.out" | cut -c1-100)}"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then failed "$label: past its ${per_sanitizer} s"
  else failed "$label (exit $rc): ${summary:-$(grep -m 2 -E '^FAIL|=========|AddressSanitizer|cudasim' "$work/san.out" | tr '\n' ' ' | cut -c1-200)}"; fi
}

stage_sanitizer() {
  if [ $mode = sim ]; then
    # The sim's analogues: AddressSanitizer builds for memcheck; another order of blocks and streams (seed 2) and
    # the sim's own barrier and warp rules for racecheck and synccheck.
    # Only matmul here (the others take minutes under the sim; tests/sim/test_sim.sh runs them all).
    sanitize "memcheck (sim: AddressSanitizer) matmul" "$bin/gpu_test_matmul_asan" small
    sanitize "racecheck + synccheck (sim: seed 2, barrier rules) matmul" env CUDASIM_SEED=2 "$bin/gpu_test_matmul" small
    return
  fi
  local cs
  cs=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" 2>/dev/null)
  [ -n "$cs" ] || { failed "compute-sanitizer neither on PATH nor in ${CUDA_HOME:-/usr/local/cuda}/bin"; return; }
  # Most informative first: memcheck everywhere, then the shared-memory kernels' races, then barriers; racecheck
  # of the sparse kernels last, with the rest of the stage's time (it needs more than 30 s on an H200).
  local run left
  for run in memcheck:attention memcheck:sparse memcheck:ops memcheck:matmul racecheck:attention \
             synccheck:attention synccheck:sparse synccheck:ops synccheck:matmul racecheck:ops racecheck:matmul; do
    sanitize "${run%%:*} ${run#*:}" "$cs" --tool "${run%%:*}" --error-exitcode 1 "$bin/gpu_test_${run#*:}" small
  done
  left=$((GPU_CHECK_DEADLINE - $(date +%s) - 2))
  if [ "$left" -lt 5 ]; then failed "racecheck sparse: not run (the stage's time is spent)"; return; fi
  per_sanitizer=$left sanitize "racecheck sparse" "$cs" --tool racecheck --error-exitcode 1 "$bin/gpu_test_sparse" small
}

stage_attention() {
  local d n
  for d in 128 64; do
    echo "== dense, head dim $d: ${sizes[*]}"
    if ! "$bin/gpu_bench_attention" --head-dim "$d" "${sizes[@]}" >"$work/mt_$d.txt" 2>&1; then
      failed "gpu_bench_attention --head-dim $d: $(tail -n 1 "$work/mt_$d.txt")"
      continue
    fi
    cat "$work/mt_$d.txt"
    while read -r _ n f b; do
      result "mtrain dense N=$n d=$d: fwd $f ms, bwd $b ms; $(awk -v n="$n" -v d="$d" -v f="$f" -v b="$b" \
        'BEGIN { fl = 2 * n * n * d * 16; printf "%.0f / %.0f TFLOP/s", fl / f / 1e9, 2.5 * fl / b / 1e9 }')"
    done <"$work/mt_$d.txt"
    if [ $mode = sim ]; then
      skipped "PyTorch SDPA, head dim $d (PyTorch's CUDA stages need a GPU)"
    elif PYTHONUNBUFFERED=1 "$python" "$bench_py" "$work/mt_$d.txt" --head-dim "$d" "${sizes[@]}" >"$work/sdpa_$d.txt" 2>&1; then
      cat "$work/sdpa_$d.txt"
      grep -E '^\| [0-9]' "$work/sdpa_$d.txt" | while read -r line; do result "d=$d $line"; done
      result "(columns: N | mtrain fwd / bwd ms | mtrain fwd / bwd TFLOP/s | SDPA flash | SDPA cuDNN | best SDPA ms (TFLOP/s) | mtrain ÷ best SDPA)"
    else
      cat "$work/sdpa_$d.txt"
      failed "PyTorch SDPA, head dim $d: $(tail -n 1 "$work/sdpa_$d.txt")"
    fi
  done
  if [ $mode = sim ]; then
    skipped "the sparse benchmark (its smallest length takes minutes under the sim; gpu_test_sparse covers its kernels)"
    return
  fi
  local fraction
  for fraction in 0.0125 0.04; do
    echo "== sparse, slash fraction $fraction: ${sparse_sizes[*]}"
    if "$bin/gpu_bench_sparse" --slash-fraction "$fraction" "${sparse_sizes[@]}" >"$work/sparse.txt" 2>&1; then
      cat "$work/sparse.txt"
      awk '$1 == "sparse" { printf "sparse N=%d density %.1f%% (sparsity %.1f%%): dense %.1f ms%s, sparse %.1f ms, estimation+index %.1f ms: speed-up %.2fx of ideal %.1fx = %.2f\n",
           $2, 100 * $6, 100 - 100 * $6, $3, ($7 == 1 ? "" : " (est.)"), $4, $5, $3 / $4, 1 / $6, $3 / $4 * $6 }' \
        "$work/sparse.txt" | while read -r line; do result "$line"; done
    else
      cat "$work/sparse.txt"
      failed "gpu_bench_sparse --slash-fraction $fraction: $(tail -n 1 "$work/sparse.txt")"
    fi
  done
}

# throughput TOKENS STEPS: mtrain and (on a GPU) transformers at TOKENS per step.
throughput() {
  local n=$1 s=$2 tps mfu plan peak hf_tps hf_peak
  echo "== throughput, $n tokens per step, $s steps"
  if ! train_run "dense_$n" "$n" "$s" attention.type=dense; then
    failed "mtrain at $n tokens/step: $(grep -m 1 'mtrain:\|out of memory' "$work/dense_$n.log" || tail -n 1 "$work/dense_$n.log")"
    return
  fi
  tps=$(metric "dense_$n" tokens_per_s after_first) mfu=$(metric "dense_$n" mfu after_first) plan=$(plan_gib "dense_$n")
  if [ $mode = gpu ]; then
    peak=$(cat "$work/dense_$n.mem")
    result "mtrain $n tokens/step: $tps tokens/s, MFU $(awk -v m="$mfu" 'BEGIN { printf "%.1f%%", 100 * m }'), peak memory $peak MiB (nvidia-smi) against the plan's $plan GiB: $(awk -v p="$peak" -v g="$plan" \
      'BEGIN { r = p / (g * 1024); printf "%.3f of it%s", r, (r > 0.9 && r < 1.1) ? " (within 10%)" : " (NOT within 10%)" }')"
    awk -v p="$peak" -v g="$plan" 'BEGIN { r = p / (g * 1024); exit !(r > 0.9 && r < 1.1) }' || stage_rc=1
    "$mtrain" config "$base" train.init_from=none >"$work/config.yaml"
    if "$python" "$hf_script" "$work/config.yaml" "$n" "$s" cuda >"$work/hf_$n.log" 2>&1; then
      hf_tps=$(awk '$1 == "hf_tokens_per_s" { print $2 }' "$work/hf_$n.log")
      hf_peak=$(awk '$1 == "hf_peak_mib" { print $2 }' "$work/hf_$n.log")
      result "transformers $n tokens/step: $hf_tps tokens/s, MFU $(awk -v m="$mfu" -v t="$hf_tps" -v mt="$tps" 'BEGIN { printf "%.1f%%", 100 * m * t / mt }'), peak memory $hf_peak MiB (allocated); mtrain ÷ transformers: $(awk -v a="$tps" -v b="$hf_tps" 'BEGIN { printf "%.2fx", a / b }')"
    else
      failed "transformers at $n tokens/step: $(tail -n 1 "$work/hf_$n.log")"
    fi
  else
    result "mtrain (sim) $n tokens/step: $tps tokens/s, memory plan $plan GiB printed at start"
    [ "$plan" != - ] || failed "no memory plan printed at start of the run"
    skipped "measured peak against the plan (no nvidia-smi under the sim)"
    skipped "transformers at $n tokens/step (PyTorch's CUDA stages need a GPU)"
  fi
}

# The first training size, 20 steps: mtrain and transformers from the same weights on the same sequences, loss by loss.
stage_agreement() {
  local n=${train_sizes[0]} s=20 g
  if [ $mode = sim ]; then
    "$mtrain" data "$base" train.init_from=none train.seq_len="$n" data.train=synthetic parallel.dp=1 parallel.cp=1 \
      train.micro_batches=1 "${model_args[@]}" --show 1 2>&1 | grep -q "^tokens ($n inputs + 1 target): " || failed "mtrain data --show printed no sequence"
    result "mtrain data --show prints the sequences of the run"
    skipped "loss agreement with transformers (PyTorch's CUDA stages need a GPU)"
    return
  fi
  echo "== loss agreement: $s steps of $n tokens from the same weights and sequences"
  "$mtrain" config "$base" train.init_from=none >"$work/config.yaml"
  # Step S trains on sequence S - 1; one process per sequence, 8 at a time (each start maps cuBLASLt and NCCL).
  for g in $(seq 0 $((s - 1))); do
    "$mtrain" data "$base" train.init_from=none train.seq_len="$n" data.train=synthetic parallel.dp=1 parallel.cp=1 \
      train.micro_batches=1 --show "$g" 2>/dev/null | sed -n 's/^tokens ([0-9]* inputs + 1 target): //p' >"$work/seq_$g" &
    [ $(((g + 1) % 8)) -eq 0 ] && wait
  done
  wait
  for g in $(seq 0 $((s - 1))); do cat "$work/seq_$g"; done >"$work/sequences.txt"
  if [ "$(wc -l <"$work/sequences.txt")" -ne "$s" ]; then failed "mtrain data printed no sequences"; return; fi
  if ! "$python" "$hf_script" "$work/config.yaml" "$n" "$s" cuda --init-out "$work/init" --sequences "$work/sequences.txt" \
       >"$work/hf_agree.log" 2>&1; then
    failed "transformers (loss agreement): $(tail -n 1 "$work/hf_agree.log")"
    return
  fi
  if ! train_run agree "$n" "$s" attention.type=dense train.init_from="$work/init" train.lr=1e-5 train.min_lr=1e-6 train.beta1=0.9 \
       train.beta2=0.95 train.weight_decay=0.1 train.eps=1e-8 train.grad_clip=0; then
    failed "mtrain from the transformers weights: $(grep -m 1 'mtrain:' "$work/agree.log" || tail -n 1 "$work/agree.log")"
    return
  fi
  awk '$1 == "hf_step" { print $2, $3 }' "$work/hf_agree.log" >"$work/hf_losses.txt"
  awk '{ for (i = 1; i < NF; i++) if ($i == "\"loss\":") { v = $(i + 1); sub(/,/, "", v); print NR, v } }' \
    "$work/agree/metrics.jsonl" >"$work/mt_losses.txt"
  local worst
  worst=$(join "$work/mt_losses.txt" "$work/hf_losses.txt" | awk '{ d = $2 - $3; d = d < 0 ? -d : d; r = d / $3
    if (r > w) { w = r; at = $1 } n++ } END { printf "%d %.4f %d", n, w, at }')
  read -r count rel at <<<"$worst"
  result "losses, mtrain vs transformers (step: mtrain transformers): $(join "$work/mt_losses.txt" "$work/hf_losses.txt" | awk '{ printf "%d: %.4f %.4f; ", $1, $2, $3 }')"
  if [ "$count" -eq "$s" ] && awk -v r="$rel" 'BEGIN { exit !(r <= 0.02) }'; then
    result "ok loss agreement: $count steps, largest relative difference $rel (step $at) <= 0.02"
  else
    failed "loss agreement: $count of $s steps compared, largest relative difference $rel (step $at; expected <= 0.02)"
  fi
}

stage_train() {
  echo "== tiny model on the CUDA backend"
  local data=synthetic losses
  [ -f "$root/data/docs.shard" ] && data=$root/data/docs.shard
  if "$mtrain" train "$configs/tiny-cpu.yaml" train.backend=cuda data.train="$data" train.steps="$tiny_steps" \
       train.warmup_steps=1 log.every=1 log.dir="$work/tiny" checkpoint.dir="$work/tiny/ck" checkpoint.final=false \
       "${tiny_model[@]}" "${tiny_args[@]}" >"$work/tiny.log" 2>&1 </dev/null; then
    tail -n 3 "$work/tiny.log"
    losses=$(awk '/^step .* loss / { for (i = 1; i < NF; i++) if ($i == "loss") print $(i + 1) }' "$work/tiny.log" | tr '\n' ' ')
    # Finite, and over 10 steps or more falling.
    if awk -v l="$losses" -v steps="$tiny_steps" 'BEGIN { n = split(l, a, " "); if (n != steps) exit 1
         for (i = 1; i <= n; i++) if (!(a[i] + 0 > 0 && a[i] + 0 < 100)) exit 1; exit !(n < 10 || a[n] < a[1]) }'; then
      result "ok tiny model on $(basename "$data"): losses $losses(finite$([ "$tiny_steps" -ge 10 ] && echo ", falling"))"
    else
      failed "tiny model on $(basename "$data"): losses $losses(expected $tiny_steps finite ones, falling over 10 steps or more)"
    fi
  else
    failed "tiny model on the CUDA backend: $(grep -m 1 'mtrain:\|cudasim' "$work/tiny.log" || tail -n 1 "$work/tiny.log")"
  fi
  local n
  for n in "${train_sizes[@]}"; do throughput "$n" "$throughput_steps"; done
}

# The first training size with the dW GEMMs on one stream, then on two (train.dw_stream), $dw_steps steps
# each: tokens/s after the first step, and the mean losses within 1% (the same GEMMs; on a GPU the
# attention backward's atomics add in another order).
stage_dw_stream() {
  local n=${train_sizes[0]} dw off on
  for dw in off on; do
    if ! train_run "dw_$dw" "$n" "$dw_steps" attention.type=dense train.dw_stream=$dw >/dev/null; then
      failed "train.dw_stream=$dw at $n tokens/step: $(grep -m 1 'mtrain:\|out of memory' "$work/dw_$dw.log" || tail -n 1 "$work/dw_$dw.log")"
      return
    fi
  done
  off=$(metric dw_off tokens_per_s after_first) on=$(metric dw_on tokens_per_s after_first)
  result "train.dw_stream at $n tokens/step: off $off tokens/s, on $on tokens/s: on ÷ off $(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.3f", a / b }')"
  off=$(metric dw_off loss) on=$(metric dw_on loss)
  if awk -v a="$on" -v b="$off" 'BEGIN { d = a - b; exit !(d < 0 ? -d <= 0.01 * b : d <= 0.01 * b) }'; then
    result "ok train.dw_stream on: mean loss $on, off: $off (within 1%)"
  else
    failed "train.dw_stream on: mean loss $on, off: $off (expected within 1%)"
  fi
}

# Sparse first, until half the stage's time is spent; then dense until its end. Each run gets at most
# $per_context seconds; a length with less than 5 s left is not tried.
stage_context() {
  local attn n longest rc start args until left
  for attn in sparse dense; do
    longest=0 n=$context_start
    args=(attention.type=dense) until=$((GPU_CHECK_DEADLINE - 2))
    [ $attn = sparse ] && args=("${sparse_args[@]}") until=$(($(date +%s) + (GPU_CHECK_DEADLINE - $(date +%s)) / 2))
    while [ "$n" -le "$context_max" ]; do
      start=$SECONDS left=$((until - $(date +%s)))
      if [ "$left" -lt 5 ]; then echo "$attn $n tokens: not tried (the stage's time is spent)"; break; fi
      run_limit=$((left < per_context ? left : per_context))
      train_run "context_${attn}_$n" "$n" 1 "${args[@]}" >/dev/null
      rc=$?
      if [ $rc -eq 0 ]; then
        echo "$attn $n tokens: trains ($((SECONDS - start)) s; peak $(cat "$work/context_${attn}_$n.mem" 2>/dev/null || echo -) MiB)"
        longest=$n
      elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "$attn $n tokens: not finished within $run_limit s"
        break
      else
        echo "$attn $n tokens: fails: $(grep -m 1 -i 'out of memory\|does not fit\|mtrain:' "$work/context_${attn}_$n.log" || tail -n 1 "$work/context_${attn}_$n.log")"
        break
      fi
      n=$((n * 2))
    done
    local why="the first length that failed, ran past its time or was not tried: $n"
    [ "$n" -gt "$context_max" ] && why="every length up to the search's bound $context_max trained"
    result "longest sequence trained one step, $attn: $longest tokens ($why)"
    [ "$longest" -gt 0 ] || stage_rc=1
  done
}

# hold: waits until its limit stops it; no list of stages names it (GPU_CHECK_LIMITS="hold:1 ...": how
# tests/sim/test_gpu_check.sh checks a stage past its limit, whatever the machine's speed).
stage_hold() { sleep infinity; }

# ---- sizes: the GPU's, or tiny ones under the sim
# The tiny model with the CUDA kernels' head dim (64) and the bytes tokenizer's vocabulary (the bundle's shard).
tiny_model=(model.vocab_size=258 model.hidden_size=128 model.intermediate_size=256 model.num_heads=2 model.num_kv_heads=1 model.head_dim=64)
if [ $mode = gpu ]; then
  test_programs=()
  for prog in "$bin"/gpu_test_*; do test_programs+=("$(basename "$prog")"); done
  model_args=()
  base=$configs/qwen2.5-0.5b-128k-8xa100.yaml
  sizes=(4096 16384 65536) sparse_sizes=(65536 131072)
  train_sizes=(8192 32768) throughput_steps=6 tiny_steps=20 tiny_args=() dw_steps=4
  context_start=32768 context_max=1048576 per_context=40   # start-up of a 0.5B run: 5-8 s
  per_test=45 per_sanitizer=30
  sparse_args=()   # the run file's: top_p 0.9 in blocks of 128
  limits=(device:12 sweep:90 tests:70 sanitizer:55 attention:52 train:130 dw_stream:35 agreement:45 context:75)
else
  test_programs=(gpu_test_matmul gpu_test_cub)
  model_args=("${tiny_model[@]}")
  base=$configs/tiny-cpu.yaml
  sizes=(64) sparse_sizes=()
  train_sizes=(128) throughput_steps=2 tiny_steps=3 tiny_args=(train.seq_len=64 model.max_position_embeddings=64) dw_steps=2
  # Limits that only a hang reaches: the sim's speed depends on the machine's load (a busy 2-core CI).
  context_start=64 context_max=128 per_context=600
  per_test=600 per_sanitizer=600
  sparse_args=(attention.type=sparse attention.block_size=64 attention.budget=fixed attention.vertical=4
               attention.slash=1 attention.sink=4 attention.local=1)
  limits=(device:600 sweep:600 tests:1200 sanitizer:1200 attention:1200 train:1200 dw_stream:600 agreement:600 context:2400)
fi
# GPU_CHECK_LIMITS="NAME:SECONDS ...": other stages or limits (tests/sim/test_gpu_check.sh; stage_hold).
[ -n "${GPU_CHECK_LIMITS:-}" ] && read -r -a limits <<<"$GPU_CHECK_LIMITS"
# --stages A,B: those stages only (each with its limit), in the order above.
if [ -n "$stages_given" ]; then
  selected=()
  for entry in "${limits[@]}"; do
    [[ ",$stages," == *",${entry%%:*},"* ]] && selected+=("$entry")
  done
  for name in ${stages//,/ }; do
    [[ " ${limits[*]%%:*} " == *" $name "* ]] && continue
    echo "gpu_check.sh: --stages: no stage '$name' (expected names from: ${limits[*]%%:*}, comma-separated)" >&2
    exit 2
  done
  [ ${#selected[@]} -gt 0 ] || { echo "gpu_check.sh: --stages: no stage named (expected names from: ${limits[*]%%:*}, comma-separated)" >&2; exit 2; }
  limits=("${selected[@]}")
fi

if [ "${1:-}" = --stage ]; then
  stage=$2 stage_rc=0
  work=$GPU_CHECK_WORK
  gpu=$(gpu_profile)
  "stage_$stage"
  exit $stage_rc
fi

# ---- the check: every stage under its limit, the summary after each
mkdir -p "$out" || exit 1
GPU_CHECK_WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 1
export GPU_CHECK_WORK
trap 'rm -rf "$GPU_CHECK_WORK"' EXIT
summary=$out/summary.txt
lines=()
write_summary() {
  {
    echo "gpu_check.sh ($mode) $(date -u '+%Y-%m-%d %H:%M UTC'), from $root"
    printf '%s\n' "${lines[@]}"
    for entry in "${limits[@]}"; do
      name=${entry%%:*}
      [ -s "$GPU_CHECK_WORK/$name.result" ] || continue
      echo
      echo "## $name"
      cat "$GPU_CHECK_WORK/$name.result"
    done
  } >"$summary.tmp" && mv "$summary.tmp" "$summary"
}
for entry in "${limits[@]}"; do
  name=${entry%%:*} limit=${entry#*:}
  start=$SECONDS
  GPU_CHECK_DEADLINE=$(($(date +%s) + limit)) timeout -k 10 "$limit" bash "$script" $flag --stage "$name" \
    >"$out/$name.log" 2>&1
  rc=$?
  took=$((SECONDS - start))
  case $rc in
    0) status=ok ;;
    124|137) status=TIMEOUT; echo "stage $name stopped at its limit of $limit s" >>"$out/$name.log" ;;
    *) status=FAIL ;;
  esac
  lines+=("$(printf '%-7s %-10s %4d s of %4d s  (%s.log)' "$status" "$name" "$took" "$limit" "$name")")
  echo "${lines[-1]}"
  write_summary
done
echo "summary: $summary"
! grep -qE '^(FAIL|TIMEOUT) ' <(printf '%s\n' "${lines[@]}")

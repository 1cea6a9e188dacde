# test_cuda_backend.sh: train.backend from the command line. Without a GPU,
# build/mtrain (the CPU build) and build/cuda/mtrain refuse `cuda` with one
# line saying what is missing and run `auto` on the CPU; build/sim/mtrain trains
# 50 steps on the CUDA backend under the sim (docs/SIM.md) with losses that
# follow the CPU backend's from the same seed and synthetic data (every step
# within 2e-2 relative, the final loss within 2%: bf16 activations, see
# tests/sim/gpu_test_backend.c) and prints its GPU's memory plan at start, and
# stops with one line when cuBLASLt has no algorithm for a GEMM; a CUDA
# run stopped at step 25 and resumed ends with the same bits as the
# uninterrupted one (the same CUDASIM_SEED: the same block order); under
# another block order, resumed or not, within 1e-3 (the attention backward's
# fp32 atomics); a run resumed across backends (CPU steps 1-25, CUDA 26-40,
# CPU 41-50) follows the CPU's loss curve; and `mtrain score` and `mtrain
# eval` on the CUDA backend give the CPU's loss; with documents and sparse
# attention the CUDA backend's losses follow the CPU's too.
#   MTRAIN=path/to/mtrain bash tests/sim/test_cuda_backend.sh   (default build/mtrain)
cd "$(dirname "$0")/../.."
source tests/lib/lib.sh
mtrain=${MTRAIN:-build/mtrain}
sim=build/sim/mtrain

# A model the CUDA attention takes (head_dim 64), small enough for the sim.
model="model.hidden_size=128 model.intermediate_size=256 model.num_heads=2 model.num_kv_heads=1 model.head_dim=64"
# A constant learning rate, so that a run of train.steps=N continued to 50 is the 50-step run.
run() {  # BINARY BACKEND STEPS NAME [overrides]
  $1 train configs/tiny-cpu.yaml $model train.backend=$2 train.steps=$3 train.warmup_steps=1 train.seq_len=128 \
    train.lr_schedule=constant train.lr=1e-3 checkpoint.every=25 log.every=1 checkpoint.dir="$tmp/ck-$4" \
    log.dir="$tmp/log-$4" "${@:5}" >"$tmp/$4.out" 2>"$tmp/$4.err"
}

# On a machine with a GPU the refusal does not apply (not counted). Both
# builds: the CPU one and, when nvcc built it, the one with the CUDA backend.
if ! nvidia-smi -L >/dev/null 2>&1; then
  for bin in "$mtrain" $( [ -x build/cuda/mtrain ] && echo build/cuda/mtrain ); do
    auto=auto-$(echo "$bin" | tr / -)
    run "$bin" cuda 1 refuse
    rc=$?
    expect "$bin: train.backend=cuda without CUDA in the build or a GPU: exit 1 ($rc), one line ($(cat "$tmp/refuse.err"))" \
      "[ $rc -eq 1 ] && [ \$(wc -l <'$tmp/refuse.err') -eq 1 ] &&
       grep -Eq '^mtrain: train\.backend: cuda: (this build has no CUDA backend|no GPU visible)' '$tmp/refuse.err'"
    run "$bin" auto 2 "$auto"
    rc=$?
    expect "$bin: train.backend=auto without a GPU trains on the CPU: exit $rc, 2 steps" \
      "[ $rc -eq 0 ] && [ \$(grep -c '^step ' '$tmp/$auto.out') -eq 2 ]"
  done
fi

if [ ! -x "$sim" ]; then
  bad "sim build" "$sim missing (make build-sim)"
  exit 1
fi
steps=50
run "$sim" cpu $steps cpu
run "$sim" cuda $steps cuda
rc=$?
expect "sim: train.backend=cuda trains $steps steps (exit $rc; $(tail -n 1 "$tmp/cuda.err"))" \
  "[ $rc -eq 0 ] && [ \$(grep -c '^step ' '$tmp/cuda.out') -eq $steps ]"
# A cuBLASLt without an algorithm for a GEMM (the sim told to have none):
# one line naming the problem and the library's status, exit 1, no step.
CUDASIM_CUBLASLT_NO_ALGORITHM=1 run "$sim" cuda 1 no_algorithm
rc=$?
expect "sim: cuBLASLt with no algorithm stops the run with one line (exit $rc: $(grep -m1 'no algorithm' "$tmp/no_algorithm.err"))" \
  "[ $rc -eq 1 ] && [ \$(grep -c '^step ' '$tmp/no_algorithm.out') -eq 0 ] &&
   [ \$(grep -c 'cuBLASLt has no algorithm' '$tmp/no_algorithm.err') -eq 1 ] &&
   grep -Eq '^mtrain: model/matmul_cuda\.cu:[0-9]+: matmul \(CUDA\): cuBLASLt has no algorithm for m [0-9]+ n [0-9]+ k [0-9]+ \(CUBLAS_STATUS_NOT_SUPPORTED\)$' '$tmp/no_algorithm.err'"
# The memory plan at start (CUDA backend only): every item, and the total of
# `mtrain plan --gpu h100` for the same run; dense (the 50-step run) and
# sparse (one step: the sparse estimation and index too).
check_plan() {  # NAME ITEMS... (after --) OVERRIDES...
  local name=$1 item missing= items=()
  shift
  while [ "$1" != -- ]; do items+=("$1"); shift; done
  shift
  local total line
  total=$($sim plan configs/tiny-cpu.yaml $model train.seq_len=128 "$@" --gpu h100 | awk '$1 == "total" { printf "%.2f", $2 }')
  line=$(grep '^memory plan (cuda backend, one GPU): ' "$tmp/$name.out")
  for item in 'weights bf16 (compute)' 'weights fp32 (master)' 'gradients fp32' 'AdamW moments fp32' \
    'activations bf16' 'attention scratch fp32' 'LM-head chunk' 'cuBLASLt workspace' 'CUDA context, NCCL buffers' \
    "${items[@]}"; do
    grep -qF "$item" <<<"$line" || missing="$missing, $item"
  done
  expect "sim: $name: the CUDA backend prints its memory plan at start, total $total GiB as mtrain plan --gpu h100 (missing: ${missing#, }; $line)" \
    "[ -n '$total' ] && [ -z '$missing' ] && grep -q '= $total GiB\$' <<<'$line'"
}
check_plan cuda --
expect "sim: the CPU backend prints no GPU memory plan" "! grep -q '^memory plan' '$tmp/cpu.out'"
run "$sim" cuda 1 plan-sparse attention.type=sparse
check_plan plan-sparse 'sparse estimation and index' -- attention.type=sparse
losses() { sed -n 's/^step .*| loss \([0-9.]*\) |.*/\1/p' "$@"; }
# FILE_A FILE_B: the worst relative difference of their loss columns, and the final one's.
compare_losses() {
  paste "$1" "$2" | awk '{ r = ($2 - $1) / $1; if (r < 0) r = -r; if (r > w) w = r } END { printf "%.2e %.2e %d", w, r, NR }'
}
losses "$tmp/cpu.out" >"$tmp/loss-cpu"
losses "$tmp/cuda.out" >"$tmp/loss-cuda"
read -r worst final n <<<"$(compare_losses "$tmp/loss-cpu" "$tmp/loss-cuda")"
expect "sim: the CUDA backend's losses follow the CPU's over $steps steps ($n steps; worst relative $worst <= 2e-2, final $final <= 2e-2; cpu $(tail -n 1 "$tmp/loss-cpu"), cuda $(tail -n 1 "$tmp/loss-cuda"))" \
  "[ $n -eq $steps ] && awk 'BEGIN { exit !($worst <= 2e-2 && $final <= 2e-2) }'"

# Documents with sparse attention: data.doc_mask on a shard of short
# documents (bytes), fixed budgets; the CUDA backend's losses follow the
# CPU's within the same 2e-2 over 4 steps, and both log a density below 1.
awk 'BEGIN { srand(7); split("the a river town bright quiet stone winter map road house light", w, " ");
  for (d = 0; d < 60; d++) { f = sprintf("'"$tmp"'/doc%02d.txt", d); s = ""; n = 3 + int(rand() * 80);
    for (i = 0; i < n; i++) s = s w[int(rand() * 12) + 1] " "; print s > f; close(f) } }'
"$sim" tokenize --tokenizer bytes --input "$tmp"/doc*.txt --output "$tmp/docs.shard" >/dev/null
doc_run="model.vocab_size=258 data.train=$tmp/docs.shard data.doc_mask=true train.seq_len=256 log.attention_every=1
  attention.type=sparse attention.budget=fixed attention.vertical=8 attention.slash=4 attention.sink=4 attention.local=16"
run "$sim" cpu 4 docs-cpu $doc_run
run "$sim" cuda 4 docs-cuda $doc_run
rc=$?
losses "$tmp/docs-cpu.out" >"$tmp/loss-docs-cpu"
losses "$tmp/docs-cuda.out" >"$tmp/loss-docs-cuda"
read -r worst final n <<<"$(compare_losses "$tmp/loss-docs-cpu" "$tmp/loss-docs-cuda")"
densities() { sed -n 's/.*"attention_density": \[\([^]]*\)\].*/\1/p' "$1/metrics.jsonl" | tr ',' '\n'; }
dense_layers=$( (densities "$tmp/log-docs-cpu"; densities "$tmp/log-docs-cuda") | awk '$1 >= 1 || $1 <= 0' | wc -l)
logged=$( (densities "$tmp/log-docs-cpu"; densities "$tmp/log-docs-cuda") | wc -l)
expect "sim: sparse attention with documents: the CUDA backend's losses follow the CPU's (exit $rc, $n steps; worst relative $worst <= 2e-2), densities in (0, 1) ($logged logged, $dense_layers not)" \
  "[ $rc -eq 0 ] && [ $n -eq 4 ] && awk 'BEGIN { exit !($worst <= 2e-2) }' && [ $logged -gt 0 ] && [ $dense_layers -eq 0 ]"

# Stopped after step 25 (step 50's checkpoint lost), resumed on the CUDA backend: the same bits.
last=step_$(printf %08d $steps)
cp -r "$tmp/ck-cuda" "$tmp/ck-cuda-resume"
rm -rf "$tmp/ck-cuda-resume/$last"
run "$sim" cuda $steps cuda-resume
rc=$?
expect "sim: a CUDA run resumed from step 25 runs (exit $rc; $(grep -m 1 '^resumed from' "$tmp/cuda-resume.out"))" \
  "[ $rc -eq 0 ] && grep -q '^resumed from .*step_00000025: step 25' '$tmp/cuda-resume.out'"
expect "sim: resumed on the CUDA backend at step 25, step $steps is bit-identical to the uninterrupted run (model.safetensors, optimizer.zst)" \
  "cmp -s '$tmp/ck-cuda/$last/model.safetensors' '$tmp/ck-cuda-resume/$last/model.safetensors' &&
   cmp -s '$tmp/ck-cuda/$last/optimizer.zst' '$tmp/ck-cuda-resume/$last/optimizer.zst'"

# Bits across block orders: the attention backward sums dq, dk and dv with
# fp32 atomicAdd, in the order blocks finish. With 5 key tiles (T = 320) two
# runs under different CUDASIM_SEEDs (block orders, as two runs on a GPU)
# may end with other bits (the line says which), and so may a resume under
# another seed; each within 1e-3 (max |a - b| / max |b| per tensor) of the
# uninterrupted run: the atomics' order changes fp32 sums in the last bits,
# which move a few bf16 roundings; a lost or repeated AdamW step moves the
# weights by far more (checked: step 2 against step 4 differs by > 1e-2).
# AdamW's eps is 1e-3 here: k_proj.bias has a zero gradient in exact
# arithmetic (a constant added to every score of a row), so its computed one
# is rounding noise, which eps 1e-8 would turn into steps of the full lr
# (g / (|g| + eps)) and another order of the atomics into weights 0.1-0.5 apart.
order_run="train.seq_len=320 train.eps=1e-3 checkpoint.every=2"
run "$sim" cuda 4 order $order_run
CUDASIM_SEED=2 run "$sim" cuda 4 order-seed2 $order_run
rc1=$?
cp -r "$tmp/ck-order" "$tmp/ck-order-resume"
rm -rf "$tmp/ck-order-resume/step_00000004"
CUDASIM_SEED=2 run "$sim" cuda 4 order-resume $order_run
rc2=$?
max_rel() {  # A B: the largest max |a - b| / max |b| over the tensors of two model.safetensors
  /usr/bin/python3 -c 'import sys; sys.path.insert(0, "tests/lib"); import harness
a, b = harness.read_safetensors(sys.argv[1]), harness.read_safetensors(sys.argv[2])
print("%.2e" % max(harness.rel_err(a[k], b[k]) for k in b))' "$1" "$2"
}
ref4=$tmp/ck-order/step_00000004/model.safetensors
step_rel=$(max_rel "$ref4" "$tmp/ck-order/step_00000002/model.safetensors")
for other in order-seed2 order-resume; do
  got=$tmp/ck-$other/step_00000004/model.safetensors
  rel=$(max_rel "$ref4" "$got")
  bits=same; cmp -s "$ref4" "$got" || bits=different
  rc=$([ $other = order-seed2 ] && echo $rc1 || echo $rc2)
  expect "sim: T=320, $other (CUDASIM_SEED=2) against CUDASIM_SEED=1 uninterrupted: exit $rc, $bits bits, within $rel <= 1e-3 (one AdamW step apart: $step_rel > 1e-2)" \
    "[ $rc -eq 0 ] && [ -n '$rel' ] && [ -n '$step_rel' ] && awk 'BEGIN { exit !($rel <= 1e-3 && $step_rel > 1e-2) }'"
done

# Across backends: the CPU run's step 25, then the CUDA backend to step 40, then the CPU to 50.
cp -r "$tmp/ck-cpu" "$tmp/ck-cross"
rm -rf "$tmp/ck-cross/$last"
run "$sim" cuda 40 cross
rc1=$?
losses "$tmp/cross.out" >"$tmp/loss-cross"
run "$sim" cpu $steps cross
rc2=$?
losses "$tmp/cross.out" >>"$tmp/loss-cross"
read -r worst final n <<<"$(compare_losses <(tail -n 25 "$tmp/loss-cpu") "$tmp/loss-cross")"
expect "sim: resumed cpu -> cuda (steps 26-40) -> cpu (41-$steps): exit $rc1 and $rc2, $n steps follow the CPU run (worst relative $worst <= 2e-2, final $final <= 2e-2)" \
  "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $n -eq 25 ] && grep -q '^resumed from .*step_00000040: step 40' '$tmp/cross.out' &&
   [ -f '$tmp/ck-cross/$last/model.safetensors' ] && awk 'BEGIN { exit !($worst <= 2e-2 && $final <= 2e-2) }'"
# mtrain score on the last checkpoint: the same loss on both backends.
awk 'BEGIN { srand(3); for (i = 0; i < 100; i++) printf "%d ", int(rand() * 256); print "" }' >"$tmp/tokens.txt"
for b in cpu cuda; do
  $sim score --model "$tmp/ck-cpu/step_$(printf %08d $steps)" --tokens "$tmp/tokens.txt" train.backend=$b \
    >"$tmp/score-$b.out" 2>"$tmp/score-$b.err"
done
a=$(sed -n 's/^loss //p' "$tmp/score-cpu.out") c=$(sed -n 's/^loss //p' "$tmp/score-cuda.out")
expect "sim: mtrain score train.backend=cuda gives the CPU's loss (cuda $c, cpu $a; relative 1e-2)" \
  "[ -n '$a' ] && [ -n '$c' ] && awk -v a='$a' -v c='$c' 'BEGIN { r = (c - a) / a; if (r < 0) r = -r; exit !(r <= 1e-2) }'"
# mtrain eval (perplexity) on the same checkpoint: the same loss on both backends.
for b in cpu cuda; do
  $sim eval configs/tiny-cpu.yaml $model train.backend=$b train.seq_len=128 checkpoint.dir="$tmp/ck-cpu" \
    eval.tasks=perplexity eval.lengths=128 eval.samples=1 eval.out="$tmp/eval-$b" >/dev/null 2>&1
done
eval_loss() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["perplexity"][0]["loss"])' \
  "$tmp/eval-$1/results.json" 2>/dev/null; }
a=$(eval_loss cpu) c=$(eval_loss cuda)
expect "sim: mtrain eval train.backend=cuda gives the CPU's perplexity loss (cuda $c, cpu $a; relative 1e-2)" \
  "[ -n '$a' ] && [ -n '$c' ] && awk -v a='$a' -v c='$c' 'BEGIN { r = (c - a) / a; if (r < 0) r = -r; exit !(r <= 1e-2) }'"
exit $((failures > 0))

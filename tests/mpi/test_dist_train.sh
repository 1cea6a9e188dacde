#!/usr/bin/env bash
# test_dist_train.sh: `mtrain train` and `mtrain score` over dp × cp MPI ranks
# (Open MPI, --oversubscribe: the ranks share the cores) against the same run
# on one rank, on a tiny model (2 layers, 32 wide, GQA 4:2, 128 tokens in
# blocks of 16) so that each run takes about a second.
#   one step     for dp × cp = 1×2, 2×1, 1×4, 2×2 and every layout: the step's
#                loss and the weights of the checkpoint written after it equal
#                a single-rank run with micro_batches = dp;
#   score        under mpirun (cp = 2, 4, every layout; 20 tokens on 4
#                ranks, two of them empty; RoPE positions restarting at
#                documents on cp 2) = single-rank score: loss and
#                every gradient tensor;
#   20 steps     cp = 4 tracks cp = 1 step by step;
#   buckets      the gradient all-reduce in small buckets equals one
#                all-reduce (dp 2: bit for bit) and one rank (dp 2 × cp 2);
#   ZeRO-1       parallel.zero=1 (moments sharded over dp × cp) equals zero=0
#                (dp 2, cp 2: bit for bit; dp 2 × cp 2), and a sharded run
#                resumed from its checkpoint equals one that never stopped,
#                also when resumed on other world sizes (dp 2 on one rank,
#                dp 2 × cp 2 on dp 2: re-sharded);
#                hierarchical ring (4 = 2×2) equals flat;
#   validation   loss before and after the step equals one rank (3 sequences
#                over dp 2);
#   sparse       attention with dp = 2 (cp = 1), and on the ring (cp = 2, 4;
#                ring_send full and selected), equals one rank;
#   documents    data.doc_mask on a shard of short documents: cp = 2 (every
#                layout), 4 (hierarchical; dense ring_send selected), sparse
#                cp = 4 (ring_send full and selected; fewer ring bytes than
#                without documents) equal one rank; score --docs on 4 ranks
#                (every layout) equals one rank;
#   rank 0       alone writes metrics.jsonl lines and prints step lines;
#   bad input    score with dp > 1 ends with one line.
# Tolerances (fp32; only the summation order differs: attention merged chunk by
# chunk by log-sum-exp, gradients summed over ranks in another order):
#   loss        relative 1e-5 (one step), 1e-4 (each of 20 steps)
#   weights     max |w - w_ref| < 1e-6 per tensor after one AdamW step with
#               lr 1e-2 and eps 1e-3 (so the update g / (|g| + eps) is smooth
#               in g; a wrong gradient scale moves weights by ~1e-3)
#   score grads max |g - g_ref| / max |g_ref| < 1e-5 per tensor
# Prints "ok NAME" / "FAIL NAME: why".
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PY=/usr/bin/python3

ok() { echo "ok $1"; }
bad() { echo "FAIL $1: $2"; }

if [ ! -x build/mtrain ]; then
  bad dist_train_binary "build/mtrain is missing (run make build/mtrain)"
  exit 1
fi
export OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

MODEL="model.hidden_size=32 model.intermediate_size=64 model.num_layers=2 model.num_heads=4 model.num_kv_heads=2"
RUN="$MODEL train.seq_len=128 attention.block_size=16 train.lr_schedule=constant train.lr=1e-2 train.warmup_steps=0
     train.eps=1e-3 train.grad_clip=0 log.val_every=1 data.val_sequences=3 log.every=1 checkpoint.resume=never"

# train NAME NP ARGS...: configs/tiny-cpu.yaml on NP ranks (1: no mpirun) into
# $tmp/NAME (log and checkpoints); stdout+stderr in $tmp/NAME.out.
train() {
  local name=$1 np=$2
  shift 2
  local launch=()
  [ "$np" -gt 1 ] && launch=(mpirun --oversubscribe --bind-to none -np "$np")
  timeout 120 "${launch[@]}" build/mtrain train configs/tiny-cpu.yaml $RUN \
    log.dir="$tmp/$name" checkpoint.dir="$tmp/$name" "$@" >"$tmp/$name.out" 2>&1
}

# The comparisons, in Python (Debian's, with numpy): exit 0 when within
# tolerance, else print why.
compare() { "$PY" - "$@" <<'PY'
import json, sys
import numpy as np
sys.path.insert(0, "tests/lib")
from harness import read_raw

def tensors(path):
    return {k: np.frombuffer(raw, "<f4").astype(np.float64) for k, (_, _, raw) in read_raw(path).items()}

def losses(path, key="loss"):
    return [json.loads(l)[key] for l in open(path) if f'"{key}"' in l]

what = sys.argv[1]
if what in ("losses", "val_losses"):  # losses A B TOL [COUNT]: metrics.jsonl, each within TOL relative
    key = "loss" if what == "losses" else "val_loss"
    a, b, tol = losses(sys.argv[2], key), losses(sys.argv[3], key), float(sys.argv[4])
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else len(b)
    if len(a) != steps or len(b) != steps:
        sys.exit(f"{len(a)} and {len(b)} loss lines (expected {steps})")
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    if worst > tol:
        sys.exit(f"loss differs by {worst:.2e} relative (> {tol}): {a[:3]} vs {b[:3]}")
elif what in ("weights", "grads"):  # weights A B TOL: absolute; grads A B TOL: relative to max |B|
    a, b, tol = tensors(sys.argv[2]), tensors(sys.argv[3]), float(sys.argv[4])
    if a.keys() != b.keys():
        sys.exit("different tensor names")
    for k in b:
        err = np.abs(a[k] - b[k]).max()
        if what == "grads" and np.abs(b[k]).max() > 0:
            err /= np.abs(b[k]).max()
        if err > tol:
            sys.exit(f"{k} differs by {err:.2e} (> {tol})")
PY
}

# expect NAME CMD...: ok when CMD succeeds, else FAIL with its output.
expect() {
  local name=$1 why
  shift
  if why=$("$@" 2>&1); then ok "$name"; else bad "$name" "$why"; fi
}

# same_step NAME REF: one step of run NAME equals run REF (loss, validation
# loss before and after the step, weights).
same_step() {
  local ckpt=step_00000001/model.safetensors
  if [ ! -f "$tmp/$1/$ckpt" ]; then bad "$1" "no checkpoint: $(tail -n 3 "$tmp/$1.out" | tr '\n' ' ')"; return; fi
  expect "$1_loss" compare losses "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" 1e-5 1
  expect "$1_val_loss" compare val_losses "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" 1e-5 2
  expect "$1_weights" compare weights "$tmp/$1/$ckpt" "$tmp/$2/$ckpt" 1e-6
}

# --- one training step: dp × cp against one rank ---

train ref1 1 train.steps=1 train.micro_batches=1
train ref2 1 train.steps=1 train.micro_batches=2
# The references must differ from each other, or the comparisons could not fail.
if compare weights "$tmp/ref1/step_00000001/model.safetensors" "$tmp/ref2/step_00000001/model.safetensors" 1e-6 \
  >/dev/null 2>&1; then bad dist_train_references_differ "micro_batches 1 and 2 give the same weights"
else ok dist_train_references_differ; fi

train dp2 2 train.steps=1 parallel.dp=2
same_step dp2 ref2
# The gradient all-reduce in buckets of 0.01 MiB (several per layer, started
# during the backward) adds the same 2 values as one all-reduce: bit for bit.
train dp2_buckets 2 train.steps=1 parallel.dp=2 parallel.bucket_mb=0.01
expect dist_train_buckets_bitwise compare weights "$tmp/dp2_buckets/step_00000001/model.safetensors" \
  "$tmp/dp2/step_00000001/model.safetensors" 0
for layout in contiguous zigzag striped; do
  train "cp2_$layout" 2 train.steps=1 parallel.cp=2 attention.layout=$layout
  same_step "cp2_$layout" ref1
  train "cp4_$layout" 4 train.steps=1 parallel.cp=4 attention.layout=$layout
  same_step "cp4_$layout" ref1
  train "dp2cp2_$layout" 4 train.steps=1 parallel.dp=2 parallel.cp=2 attention.layout=$layout
  same_step "dp2cp2_$layout" ref2
done
train dp2cp2_buckets 4 train.steps=1 parallel.dp=2 parallel.cp=2 parallel.bucket_mb=0.01
same_step dp2cp2_buckets ref2

# Sparse attention with dp only (cp = 1: each rank's pattern on its own sequence).
SPARSE="attention.type=sparse attention.budget=fixed attention.vertical=2 attention.slash=2 attention.sink=0 attention.local=16"
train sparse_ref2 1 train.steps=1 train.micro_batches=2 $SPARSE
train sparse_dp2 2 train.steps=1 parallel.dp=2 $SPARSE
same_step sparse_dp2 sparse_ref2
if compare weights "$tmp/sparse_ref2/step_00000001/model.safetensors" "$tmp/ref2/step_00000001/model.safetensors" \
  1e-6 >/dev/null 2>&1; then bad dist_train_sparse_differs "sparse and dense steps give the same weights"
else ok dist_train_sparse_differs; fi

# Sparse attention on the ring: the pattern is estimated over the cp ranks
# and must give the single-rank step (a fixed budget keeps it sparse).
train sparse_ref1 1 train.steps=1 $SPARSE
for layout in zigzag striped; do
  train "sparse_cp2_$layout" 2 train.steps=1 parallel.cp=2 attention.layout=$layout $SPARSE
  same_step "sparse_cp2_$layout" sparse_ref1
done
train sparse_cp4_selected 4 train.steps=1 parallel.cp=4 attention.ring_send=selected log.attention_every=1 $SPARSE
same_step sparse_cp4_selected sparse_ref1
train sparse_cp4_full 4 train.steps=1 parallel.cp=4 attention.ring_send=full log.attention_every=1 $SPARSE
same_step sparse_cp4_full sparse_ref1
# Both modes log the ring's bytes; selected sends fewer.
ring_bytes() { sed -n 's/.*"ring_bytes": \([0-9]*\).*/\1/p' "$tmp/$1/metrics.jsonl"; }
full=$(ring_bytes sparse_cp4_full) selected=$(ring_bytes sparse_cp4_selected)
if [ -n "$full" ] && [ -n "$selected" ] && [ "$selected" -lt "$full" ] && [ "$selected" -gt 0 ]; then
  ok dist_train_ring_bytes_logged
else bad dist_train_ring_bytes_logged "ring_bytes full '$full', selected '$selected'"; fi

# Rank 0 alone logs: one metrics line and one step line for the step.
lines=$(grep -c '"loss"' "$tmp/dp2cp2_striped/metrics.jsonl")
steps=$(grep -c '^step ' "$tmp/dp2cp2_striped.out")
if [ "$lines" -eq 1 ] && [ "$steps" -eq 1 ]; then ok dist_train_rank0_logs
else bad dist_train_rank0_logs "$lines metrics lines and $steps step lines (expected 1 and 1)"; fi

# --- ZeRO-1 and the hierarchical ring ---

train dp2_zero 2 train.steps=1 parallel.dp=2 parallel.zero=1
same_step dp2_zero dp2
train dp2cp2_zero 4 train.steps=1 parallel.dp=2 parallel.cp=2 parallel.zero=1
same_step dp2cp2_zero dp2cp2_striped
train cp2_zero 2 train.steps=1 parallel.cp=2 attention.layout=striped parallel.zero=1
same_step cp2_zero cp2_striped
# On 2 ranks the reduce-scatter adds the same 2 values as the all-reduce: bit for bit.
expect dist_train_zero_dp2_bitwise compare weights "$tmp/dp2_zero/step_00000001/model.safetensors" \
  "$tmp/dp2/step_00000001/model.safetensors" 0
expect dist_train_zero_cp2_bitwise compare weights "$tmp/cp2_zero/step_00000001/model.safetensors" \
  "$tmp/cp2_striped/step_00000001/model.safetensors" 0
train cp4_hier 4 train.steps=1 parallel.cp=4 parallel.cp_inner=2 attention.ring=hierarchical
same_step cp4_hier cp4_striped

# Resume under ZeRO-1: 3 steps straight = 2 steps, then resume for the third.
train zero3 2 train.steps=3 parallel.dp=2 parallel.zero=1
train zero_resume 2 train.steps=2 parallel.dp=2 parallel.zero=1
train zero_resume 2 train.steps=3 parallel.dp=2 parallel.zero=1 checkpoint.resume=auto
if grep -q '^resumed from .*step_00000002' "$tmp/zero_resume.out"; then
  expect dist_train_zero_resume_weights compare weights "$tmp/zero_resume/step_00000003/model.safetensors" \
    "$tmp/zero3/step_00000003/model.safetensors" 0
  if cmp -s "$tmp/zero_resume/step_00000003/optimizer.00000-of-00002.zst" \
       "$tmp/zero3/step_00000003/optimizer.00000-of-00002.zst" &&
     cmp -s "$tmp/zero_resume/step_00000003/optimizer.00001-of-00002.zst" \
       "$tmp/zero3/step_00000003/optimizer.00001-of-00002.zst"; then
    ok dist_train_zero_resume_moments
  else bad dist_train_zero_resume_moments "a moments shard differs from the uninterrupted run's"; fi
else
  bad dist_train_zero_resume "did not resume: $(tail -n 3 "$tmp/zero_resume.out" | tr '\n' ' ')"
fi

# Another world size resumes (the moments re-shard): the third step on one
# rank with micro_batches 2 reads the sequences dp 2 would, so it matches.
train zero_reshard 2 train.steps=2 parallel.dp=2 parallel.zero=1
train zero_reshard 1 train.steps=3 train.micro_batches=2 checkpoint.resume=auto
if grep -q '^resumed from .*step_00000002' "$tmp/zero_reshard.out"; then
  expect dist_train_resume_other_world_size compare weights "$tmp/zero_reshard/step_00000003/model.safetensors" \
    "$tmp/zero3/step_00000003/model.safetensors" 1e-6
else
  bad dist_train_resume_other_world_size "did not resume: $(tail -n 3 "$tmp/zero_reshard.out" | tr '\n' ' ')"
fi

# The moments sharded over dp × cp = 4 ranks resume on 2 (dp 2, cp 1).
train zero_dpcp 4 train.steps=2 parallel.dp=2 parallel.cp=2 parallel.zero=1
train zero_dpcp 2 train.steps=3 parallel.dp=2 parallel.zero=1 checkpoint.resume=auto
if grep -q '^resumed from .*step_00000002' "$tmp/zero_dpcp.out"; then
  expect dist_train_zero_dpcp_resume_other_world_size compare weights \
    "$tmp/zero_dpcp/step_00000003/model.safetensors" "$tmp/zero3/step_00000003/model.safetensors" 1e-6
else
  bad dist_train_zero_dpcp_resume_other_world_size "did not resume: $(tail -n 3 "$tmp/zero_dpcp.out" | tr '\n' ' ')"
fi

# --- 20 steps: cp = 4 tracks cp = 1 ---

train long1 1 train.steps=20 train.eps=1e-8 checkpoint.every=0 log.val_every=0
train long4 4 train.steps=20 train.eps=1e-8 checkpoint.every=0 log.val_every=0 parallel.cp=4 attention.layout=zigzag
expect dist_train_20_steps_cp4 compare losses "$tmp/long4/metrics.jsonl" "$tmp/long1/metrics.jsonl" 1e-4 20

# --- documents (data.doc_mask) over the ring ---

# A shard of short documents (byte tokens; 4 to 70 tokens each), so that a
# sequence of 128 packs several and documents cross block and rank boundaries.
"$PY" -c '
import json, random
random.seed(11)
for d in range(120):
    print(json.dumps({"text": "".join(random.choice("abcdefgh ") for _ in range(random.randrange(3, 70)))}))
' >"$tmp/docs.jsonl"
build/mtrain tokenize --tokenizer bytes --input "$tmp/docs.jsonl" --output "$tmp/docs.shard" >"$tmp/tok.out" 2>&1 ||
  bad dist_train_docs_shard "tokenize failed: $(tail -n 2 "$tmp/tok.out" | tr '\n' ' ')"
DOCS="model.vocab_size=258 data.train=$tmp/docs.shard data.doc_mask=true"
train docs_ref1 1 train.steps=1 $DOCS
train nodocs_ref1 1 train.steps=1 $DOCS data.doc_mask=false
# The mask must change the step, or the comparisons below could not fail.
if compare weights "$tmp/docs_ref1/step_00000001/model.safetensors" "$tmp/nodocs_ref1/step_00000001/model.safetensors" \
  1e-6 >/dev/null 2>&1; then bad dist_train_doc_mask_differs "data.doc_mask true and false give the same weights"
else ok dist_train_doc_mask_differs; fi
for layout in contiguous zigzag striped; do
  train "docs_cp2_$layout" 2 train.steps=1 parallel.cp=2 attention.layout=$layout $DOCS
  same_step "docs_cp2_$layout" docs_ref1
done
train docs_cp4_hier 4 train.steps=1 parallel.cp=4 parallel.cp_inner=2 attention.ring=hierarchical $DOCS
same_step docs_cp4_hier docs_ref1
# Dense ring_send selected: each hop carries only blocks of the receivers' documents.
train docs_cp4_selected 4 train.steps=1 parallel.cp=4 attention.layout=contiguous attention.ring_send=selected $DOCS
same_step docs_cp4_selected docs_ref1
# Sparse on the ring with documents (per-document sinks, fixed budget).
train docs_sparse_ref1 1 train.steps=1 $DOCS $SPARSE attention.sink=2
for send in full selected; do
  train "docs_sparse_cp4_$send" 4 train.steps=1 parallel.cp=4 attention.ring_send=$send log.attention_every=1 \
    $DOCS $SPARSE attention.sink=2
  same_step "docs_sparse_cp4_$send" docs_sparse_ref1
done
train docs_sparse_cp4_nodocs 4 train.steps=1 parallel.cp=4 attention.ring_send=selected log.attention_every=1 \
  $DOCS $SPARSE attention.sink=2 data.doc_mask=false
# Documents leave fewer key blocks that a rank's queries use: fewer ring bytes.
docs=$(ring_bytes docs_sparse_cp4_selected) nodocs=$(ring_bytes docs_sparse_cp4_nodocs)
if [ -n "$docs" ] && [ -n "$nodocs" ] && [ "$docs" -lt "$nodocs" ]; then ok dist_train_docs_fewer_ring_bytes
else bad dist_train_docs_fewer_ring_bytes "ring_bytes with documents '$docs', without '$nodocs'"; fi

# --- mtrain score under mpirun ---

model=$tmp/ref1/step_00000001
"$PY" -c 'import random; random.seed(7); print(" ".join(str(random.randrange(256)) for _ in range(117)))' \
  >"$tmp/tokens.txt"
# score NAME NP ARGS...: stdout in $tmp/NAME.out, errors in $tmp/NAME.err.
score() {
  local name=$1 np=$2
  shift 2
  local launch=()
  [ "$np" -gt 1 ] && launch=(mpirun --oversubscribe --bind-to none -np "$np")
  timeout 120 "${launch[@]}" build/mtrain score --model "$model" --tokens "$tmp/tokens.txt" \
    "$@" attention.block_size=16 >"$tmp/$name.out" 2>"$tmp/$name.err"
}
score score1 1 --grads "$tmp/score1.safetensors"
ref_loss=$(sed -n 's/^loss //p' "$tmp/score1.out")
for layout in contiguous zigzag striped; do
  for np in 2 4; do
    name=score_${np}_$layout
    score "$name" "$np" --grads "$tmp/$name.safetensors" attention.layout=$layout
    rc=$?
    if [ "$rc" -ne 0 ]; then bad "$name" "exit status $rc: $(tail -n 3 "$tmp/$name.err" | tr '\n' ' ')"; continue; fi
    loss=$(sed -n 's/^loss //p' "$tmp/$name.out")
    if [ "$(grep -c '^loss ' "$tmp/$name.out")" -ne 1 ]; then bad "${name}_loss" "expected one loss line"
    elif awk -v a="$loss" -v b="$ref_loss" 'BEGIN { d = (a - b) / b; exit !(d < 1e-5 && d > -1e-5) }'; then
      ok "${name}_loss"
    else bad "${name}_loss" "loss $loss, single rank $ref_loss"; fi
    expect "${name}_grads" compare grads "$tmp/$name.safetensors" "$tmp/score1.safetensors" 1e-5
  done
done

# RoPE positions restarting at documents (data.reset_positions, no mask) on
# cp 2: every rank derives them from its global positions, as one rank does.
echo "10 40 41 77" >"$tmp/reset_docs.txt"
score reset1 1 --grads "$tmp/reset1.safetensors" --docs "$tmp/reset_docs.txt" data.reset_positions=true
score reset2 2 --grads "$tmp/reset2.safetensors" --docs "$tmp/reset_docs.txt" data.reset_positions=true \
  attention.layout=zigzag
reset1=$(sed -n 's/^loss //p' "$tmp/reset1.out") reset2=$(sed -n 's/^loss //p' "$tmp/reset2.out")
if [ -n "$reset2" ] && [ -n "$reset1" ] && [ "$reset1" != "$ref_loss" ] &&
   awk -v a="$reset2" -v b="$reset1" 'BEGIN { d = (a - b) / b; exit !(d < 1e-5 && d > -1e-5) }'; then
  expect score_2_reset_positions compare grads "$tmp/reset2.safetensors" "$tmp/reset1.safetensors" 1e-5
else bad score_2_reset_positions "loss '$reset2', single rank '$reset1' (global positions $ref_loss): $(tail -n 2 "$tmp/reset2.err" | tr '\n' ' ')"; fi

# 20 tokens in blocks of 16 on 4 ranks, contiguous: ranks 2 and 3 hold none
# and still take part in the ring.
cut -d' ' -f1-20 "$tmp/tokens.txt" >"$tmp/short.txt"
cp "$tmp/tokens.txt" "$tmp/long.txt"
cp "$tmp/short.txt" "$tmp/tokens.txt"
score short1 1 --grads "$tmp/short1.safetensors"
score short4 4 --grads "$tmp/short4.safetensors" attention.layout=contiguous
short1=$(sed -n 's/^loss //p' "$tmp/short1.out") short4=$(sed -n 's/^loss //p' "$tmp/short4.out")
if [ -n "$short4" ] && awk -v a="$short4" -v b="$short1" 'BEGIN { d = (a - b) / b; exit !(d < 1e-5 && d > -1e-5) }'; then
  expect score_4_empty_ranks compare grads "$tmp/short4.safetensors" "$tmp/short1.safetensors" 1e-5
else bad score_4_empty_ranks "loss '$short4', single rank $short1: $(tail -n 2 "$tmp/short4.err" | tr '\n' ' ')"; fi
cp "$tmp/long.txt" "$tmp/tokens.txt"

# Documents (--docs): starts crossing blocks and ranks, one-token documents.
echo "5 6 7 30 33 64 90 116" >"$tmp/docs.txt"
score docs1 1 --grads "$tmp/docs1.safetensors" --docs "$tmp/docs.txt" data.doc_mask=true
docs1=$(sed -n 's/^loss //p' "$tmp/docs1.out")
if [ -n "$docs1" ] && [ "$docs1" != "$ref_loss" ]; then ok score_docs_differs
else bad score_docs_differs "loss with documents '$docs1', without $ref_loss"; fi
for layout in contiguous zigzag striped; do
  name=score_docs_4_$layout
  score "$name" 4 --grads "$tmp/$name.safetensors" --docs "$tmp/docs.txt" data.doc_mask=true attention.layout=$layout
  loss=$(sed -n 's/^loss //p' "$tmp/$name.out")
  if [ -n "$loss" ] && awk -v a="$loss" -v b="$docs1" 'BEGIN { d = (a - b) / b; exit !(d < 1e-5 && d > -1e-5) }'; then
    expect "${name}_grads" compare grads "$tmp/$name.safetensors" "$tmp/docs1.safetensors" 1e-5
  else bad "$name" "loss '$loss', single rank $docs1: $(tail -n 2 "$tmp/$name.err" | tr '\n' ' ')"; fi
done

# --- bad input: one line from rank 0, non-zero exit ---

# expect_error NAME PATTERN FILE CMD...: CMD (writing its messages to FILE) fails with one matching line.
expect_error() {
  local name=$1 pattern=$2 file=$3
  shift 3
  "$@"
  local rc=$? lines
  lines=$(grep -c '^mtrain: ' "$file")
  if [ "$rc" -eq 0 ]; then bad "$name" "exit status 0"
  elif [ "$lines" -ne 1 ]; then bad "$name" "$lines 'mtrain:' lines (expected 1): $(tr '\n' ' ' <"$file")"
  elif ! grep -Eq -- "^mtrain: $pattern" "$file"; then bad "$name" "message '$(grep '^mtrain: ' "$file")' does not match '$pattern'"
  else ok "$name"
  fi
}
expect_error dist_score_dp_refused 'mtrain score: parallel\.dp 2: .*expected parallel\.dp 1' "$tmp/bad.err" \
  score bad 2 parallel.dp=2
expect_error dist_score_logits_refused 'mtrain score: --logits with 2 ranks' "$tmp/bad.err" \
  score bad 2 --logits "$tmp/l.safetensors"

#!/usr/bin/env bash
# test_checkpoint_shards.sh: ZeRO-1 checkpoints written as one moments shard
# per rank (optimizer.K-of-N.zst + optimizer.index.json, docs/FORMATS.md) and
# resumed on other grids, through build/mtrain under mpirun (tiny model, 4
# sequences per step: dp 2 × 2 micro-batches). A checkpoint of step 2 written
# by dp 2 resumes for step 3:
#   dp 2 (ZeRO)          bit-identical to the run that never stopped (weights
#                        and every shard file);
#   dp 1 (no ZeRO), dp 4, dp 2 × cp 2 (ZeRO)
#                        re-sharded: step 3's loss within 1e-5 relative and the
#                        weights within 1e-6 of the run that never stopped (the
#                        gradient sums run in another order: the tolerances of
#                        tests/mpi/test_dist_train.sh);
#   without ZeRO         a dp 2 checkpoint without ZeRO resumed under ZeRO is
#                        bit-identical (ZeRO on dp 2 equals no ZeRO bit for bit);
# a damaged, a missing and a folder shard, and the shards of another step,
# stop the resume with one line naming the file;
# a rank killed after writing its shard (MTRAIN_TEST_FAULT kill:1@shard)
# leaves no step folder, and the run resumes from the previous checkpoint to
# the same bytes.
# On the sim's CUDA backend (build/sim/mtrain, the fp32 master sharded too), a
# dp 2 checkpoint resumes on one GPU.
set -u
cd "$(dirname "$0")/../.."
MTRAIN=${MTRAIN:-build/mtrain}
. tests/lib/lib.sh
mpirun_env
export OMP_NUM_THREADS=1

RUN="configs/tiny-cpu.yaml model.hidden_size=32 model.intermediate_size=64 model.num_layers=2 model.num_heads=4
     model.num_kv_heads=2 train.seq_len=128 attention.block_size=16 train.lr_schedule=constant train.lr=1e-2
     train.warmup_steps=0 train.eps=1e-3 train.grad_clip=0 log.every=1 checkpoint.every=1 checkpoint.keep=100"
train() {  # train NP NAME ARGS...: run NAME in $tmp/NAME on NP ranks (stdout+stderr appended to $tmp/NAME.out)
  local np=$1 name=$2
  shift 2
  local launch=()
  [ "$np" -gt 1 ] && launch=(mpirun --oversubscribe --bind-to none -np "$np")
  timeout 120 "${launch[@]}" "$MTRAIN" train $RUN checkpoint.dir="$tmp/$name" log.dir="$tmp/$name/logs" "$@" \
    >>"$tmp/$name.out" 2>&1 </dev/null
}
# Files of step 3 byte for byte: model.safetensors and the moments shards.
same3() {
  local a="$tmp/$1/step_00000003" b="$tmp/$2/step_00000003" f
  [ -f "$a/optimizer.index.json" ] && cmp -s "$a/model.safetensors" "$b/model.safetensors" || return 1
  for f in "$b"/optimizer.*-of-*.zst; do cmp -s "$f" "$a/$(basename "$f")" || return 1; done
}
# close NAME: step 3 of NAME against ref: loss within 1e-5 relative, weights within 1e-6.
close() {
  /usr/bin/python3 - "$tmp/$1" "$tmp/ref" <<'PY'
import json, sys
import numpy as np
sys.path.insert(0, "tests/lib")
from harness import read_raw
run, ref = sys.argv[1], sys.argv[2]
def loss3(d):
    return [json.loads(l)["loss"] for l in open(d + "/logs/metrics.jsonl") if '"step": 3,' in l][0]
def weights(d):
    return {k: np.frombuffer(raw, "<f4") for k, (_, _, raw) in read_raw(d + "/step_00000003/model.safetensors").items()}
a, b = loss3(run), loss3(ref)
if abs(a - b) > 1e-5 * abs(b):
    sys.exit(f"step 3 loss {a} vs {b}")
wa, wb = weights(run), weights(ref)
worst = max(float(np.abs(wa[k].astype(np.float64) - wb[k]).max()) for k in wb)
if worst > 1e-6:
    sys.exit(f"weights differ by {worst:.2e}")
PY
}
resumed() { grep -q "^resumed from .*step_00000002" "$tmp/$1.out"; }
# from NAME: a copy of the dp 2 ZeRO checkpoint run through step 2.
from() { mkdir -p "$tmp/$1" && cp -r "$tmp/ck/step_00000002" "$tmp/$1/" && echo step_00000002 >"$tmp/$1/latest"; }

train 2 ref parallel.dp=2 train.micro_batches=2 parallel.zero=1 train.steps=3 checkpoint.resume=never
train 2 ck parallel.dp=2 train.micro_batches=2 parallel.zero=1 train.steps=2 checkpoint.resume=never
expect "shards: dp 2 writes optimizer.00000-of-00002.zst, optimizer.00001-of-00002.zst and the index, no optimizer.zst" \
  '[ -f "$tmp/ck/step_00000002/optimizer.00000-of-00002.zst" ] && [ -f "$tmp/ck/step_00000002/optimizer.00001-of-00002.zst" ] &&
   grep -q "\"file\":.*optimizer.00001-of-00002.zst" "$tmp/ck/step_00000002/optimizer.index.json" &&
   ! [ -e "$tmp/ck/step_00000002/optimizer.zst" ]'

from dp2
train 2 dp2 parallel.dp=2 train.micro_batches=2 parallel.zero=1 train.steps=3
expect "shards_resume_dp2: same grid, bit-identical weights and shards" 'resumed dp2 && same3 dp2 ref'
from dp1
train 1 dp1 train.micro_batches=4 train.steps=3
expect "shards_resume_dp1: one rank without ZeRO reads every shard (loss, weights within tolerance)" \
  'resumed dp1 && close dp1 && [ -f "$tmp/dp1/step_00000003/optimizer.zst" ]'
expect "shards_resume_dp1_note: the resume names the grid it changes" \
  'grep -q "^note: the checkpoint.s steps were made on dp 2 x cp 1, .*, 4 sequences a step; this run.s are on dp 1 x cp 1, .*, 4 sequences a step" "$tmp/dp1.out"'
from dp4
train 4 dp4 parallel.dp=4 parallel.zero=1 train.steps=3
expect "shards_resume_dp4: four shards from two (loss, weights within tolerance)" \
  'resumed dp4 && close dp4 && [ -f "$tmp/dp4/step_00000003/optimizer.00003-of-00004.zst" ]'
from dp2cp2
train 4 dp2cp2 parallel.dp=2 parallel.cp=2 train.micro_batches=2 parallel.zero=1 train.steps=3
expect "shards_resume_dp2_cp2: sharded over dp 2 × cp 2 (loss, weights within tolerance)" 'resumed dp2cp2 && close dp2cp2'

train 2 plain parallel.dp=2 train.micro_batches=2 train.steps=2 checkpoint.resume=never
train 2 plain parallel.dp=2 train.micro_batches=2 parallel.zero=1 train.steps=3
expect "shards_from_unsharded: a checkpoint without ZeRO resumes under ZeRO, bit-identical" 'resumed plain && same3 plain ref'

# Damaged and missing shards: one line naming the file.
refused() {  # refused NAME WHAT PATTERN: resuming NAME on one rank fails with one line matching PATTERN
  local name=$1 pattern=$3
  train 1 "$name" train.micro_batches=4 train.steps=3
  local rc=$?
  expect "$2: exit non-zero, one line" \
    '[ $rc -ne 0 ] && [ "$(grep -vc "^warning" "$tmp/$name.out")" = 1 ] && grep -q "$pattern" "$tmp/$name.out"'
}
from flip
f="$tmp/flip/step_00000002/optimizer.00001-of-00002.zst"
byte=$(( $(stat -c %s "$f") - 20 ))
flipped=$(( ($(od -An -tu1 -j"$byte" -N1 "$f") + 1) % 256 ))
printf "\\$(printf %03o "$flipped")" | dd of="$f" bs=1 seek="$byte" conv=notrunc status=none
refused flip "shards_damaged" "step_00000002/optimizer.00001-of-00002.zst: \(damaged\|checksum mismatch\)"
from missing
rm "$tmp/missing/step_00000002/optimizer.00000-of-00002.zst"
refused missing "shards_missing" "step_00000002/optimizer.00000-of-00002.zst: cannot open"

# The moments are bound to their step: step 1's index and shards in step 2
# are refused (state.json records the index's XXH64), naming the index; a
# shard that is a folder is named.
from bound
cp "$tmp/ck/step_00000001"/optimizer.* "$tmp/bound/step_00000002/"
refused bound "shards_of_step_1_in_step_2" \
  "step_00000002/optimizer.index.json: XXH64 [0-9a-f]*, state.json records [0-9a-f]* (the optimizer state of another checkpoint)"
from shard_dir
rm "$tmp/shard_dir/step_00000002/optimizer.00001-of-00002.zst"
mkdir "$tmp/shard_dir/step_00000002/optimizer.00001-of-00002.zst"
refused shard_dir "shards_folder" "step_00000002/optimizer.00001-of-00002.zst: is a folder (expected a file)"

# A rank killed after writing its shard of step 2: step 1 stays the latest and resumes to the same bytes.
MTRAIN_TEST_FAULT=kill:1@shard#2 train 2 kill parallel.dp=2 train.micro_batches=2 parallel.zero=1 train.steps=3 \
  checkpoint.resume=never
rc=$?
expect "shards_kill: the killed write leaves no step_00000002 (exit $rc)" \
  '[ $rc -ne 0 ] && [ -f "$tmp/kill/step_00000001/optimizer.index.json" ] && ! [ -e "$tmp/kill/step_00000002" ]'
train 2 kill parallel.dp=2 train.micro_batches=2 parallel.zero=1 train.steps=3
expect "shards_kill_resume: resumed from step 1, bit-identical at step 3" \
  'grep -q "^resumed from .*step_00000001" "$tmp/kill.out" && same3 kill ref'

# The CUDA backend under the sim, where ZeRO-1 shards the fp32 master as well
# (model.safetensors is gathered from it): a dp 2 checkpoint of step 2
# resumed on one GPU follows the dp 2 run that never stopped within the
# tolerances of tests/sim/test_cuda_multi.sh for another grid (bf16 gradients
# summed in another order: loss 2e-4 relative, weights 4e-3).
sim_setup checkpoint_shards
RUN="$SIM_RUN checkpoint.resume=never checkpoint.every=1 attention.block_size=32"
sim_train cuda_ref 2 2 parallel.dp=2 parallel.zero=1
sim_train cuda_ck 2 2 parallel.dp=2 parallel.zero=1 train.steps=2
mkdir -p "$tmp/cuda_dp1" && cp -r "$tmp/cuda_ck/step_00000002" "$tmp/cuda_dp1/" && echo step_00000002 >"$tmp/cuda_dp1/latest"
sim_train cuda_dp1 1 1 train.micro_batches=2 checkpoint.resume=auto
read -r loss weights < <(runs_differ cuda_dp1 cuda_ref)
expect "shards_cuda_dp2_to_dp1: the sim's CUDA ZeRO-1 dp 2 shards resumed on one GPU (loss $loss, weights $weights)" \
  "resumed cuda_dp1 && [ -f '$tmp/cuda_ck/step_00000002/optimizer.00001-of-00002.zst' ] && below '$loss' 2e-4 &&
   below '$weights' 4e-3"
exit $((failures > 0))

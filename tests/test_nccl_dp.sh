#!/usr/bin/env bash
# test_nccl_dp.sh: data parallelism on the CUDA backend under the sim
# (build/sim/mtrain, docs/SIM.md; the sim's NCCL runs over MPI), 2 ranks under
# mpirun on a node of CUDASIM_DEVICES=2 GPUs, 3 steps of a small model:
#   nccl       dp 2 with parallel.comm: nccl (the gradient all-reduce on the
#              device arena through NCCL; the ranks line says so) equals one
#              rank with micro_batches 2: every step's loss (relative 1e-5)
#              and the weights of the last checkpoint (max |w - w_ref| < 1e-6),
#              under CUDASIM_SEED 1, 2 and 3 (the sim's interleavings);
#   mpi        parallel.comm: mpi (staged through host memory) gives the same
#              weights as nccl, bit for bit (a sum of 2 fp32 values rounds once
#              whatever the order);
#   control    one rank with micro_batches 1 differs from micro_batches 2 by
#              more than the weight tolerance (a reduction that dropped a
#              rank's gradient would fail the first check);
#   one GPU    nccl with 2 ranks on a node with 1 GPU ends with one line.
# Only the fp32 summation order of the gradients differs between the runs
# (the bf16 activations and kernels are the same per sequence), hence
# tolerances far below bf16's. AdamW with lr 1e-2 and eps 1e-3 (the update
# g / (|g| + eps) is smooth in g): a wrong gradient moves weights by ~1e-3.
cd "$(dirname "$0")/.."
source tests/lib.sh
mpirun_env
export OMP_NUM_THREADS=1
sim=build/sim/mtrain
PY=/usr/bin/python3
if [ ! -x "$sim" ]; then
  bad nccl_dp_binary "$sim missing (make build/sim/mtrain)"
  exit 1
fi

RUN="model.hidden_size=128 model.intermediate_size=256 model.num_layers=2 model.num_heads=2 model.num_kv_heads=1
     model.head_dim=64 train.backend=cuda train.steps=3 train.seq_len=128 train.lr_schedule=constant train.lr=1e-2
     train.warmup_steps=0 train.eps=1e-3 train.grad_clip=0 log.every=1 checkpoint.resume=never"

# train NAME NP DEVICES ARGS...: on NP ranks (1: no mpirun) seeing DEVICES
# GPUs, into $tmp/NAME (metrics and checkpoints); stdout+stderr in $tmp/NAME.out.
train() {
  local name=$1 np=$2 devices=$3
  shift 3
  local launch=()
  [ "$np" -gt 1 ] && launch=(mpirun --oversubscribe --bind-to none -np "$np")
  CUDASIM_DEVICES=$devices timeout 120 "${launch[@]}" "$sim" train configs/tiny-cpu.yaml $RUN \
    log.dir="$tmp/$name" checkpoint.dir="$tmp/$name" "$@" >"$tmp/$name.out" 2>&1
}

# differ A B: the largest |loss_a - loss_b| / |loss_b| over the steps of
# metrics.jsonl, then the largest |w_a - w_b| over the tensors of the last
# checkpoint; "-" for a run without both.
differ() { "$PY" - "$tmp/$1" "$tmp/$2" <<'PY'
import json, os, sys
import numpy as np
sys.path.insert(0, "tests")
from harness import read_raw

def run(folder):
    losses = [json.loads(line)["loss"] for line in open(os.path.join(folder, "metrics.jsonl"))]
    weights = read_raw(os.path.join(folder, "step_00000003", "model.safetensors"))
    return losses, {k: np.frombuffer(raw, "<f4").astype(np.float64) for k, (_, _, raw) in weights.items()}

try:
    (la, wa), (lb, wb) = run(sys.argv[1]), run(sys.argv[2])
except (OSError, ValueError, KeyError):
    print("- -")
    sys.exit()
loss = max(abs(x - y) / abs(y) for x, y in zip(la, lb)) if len(la) == len(lb) == 3 else float("inf")
weights = max(np.abs(wa[k] - wb[k]).max() for k in wb) if wa.keys() == wb.keys() else float("inf")
print(f"{loss:.3e} {weights:.3e}")
PY
}
below() { awk -v x="$1" -v tol="$2" 'BEGIN { exit !(x != "-" && x + 0 <= tol + 0) }'; }

train ref 1 1 train.micro_batches=2
train single 1 1 train.micro_batches=1
train nccl 2 2 parallel.dp=2
rc=$?
train mpi 2 2 parallel.dp=2 parallel.comm=mpi

expect "nccl_dp_runs: dp 2 over NCCL trains 3 steps (exit $rc; $(grep -m1 '^mtrain' "$tmp/nccl.out"))" \
  "[ $rc -eq 0 ] && [ \$(grep -c '^step ' '$tmp/nccl.out') -eq 3 ]"
expect "nccl_dp_uses_nccl: the ranks line names NCCL for nccl and not for mpi" \
  "grep -q '^ranks: 2 = dp 2 x cp 1 .*gradients over NCCL' '$tmp/nccl.out' &&
   grep -q '^ranks: 2 = dp 2' '$tmp/mpi.out' && ! grep -q '^ranks:.*NCCL' '$tmp/mpi.out'"
read -r loss weights < <(differ nccl ref)
expect "nccl_dp_equals_one_rank: dp 2 over NCCL = one rank with micro_batches 2 (loss $loss <= 1e-5 relative, weights $weights <= 1e-6)" \
  "below '$loss' 1e-5 && below '$weights' 1e-6"
for seed in 2 3; do
  CUDASIM_SEED=$seed train nccl_seed$seed 2 2 parallel.dp=2
  read -r loss weights < <(differ nccl_seed$seed ref)
  expect "nccl_dp_equals_one_rank_seed$seed: the same under CUDASIM_SEED=$seed (loss $loss, weights $weights)" \
    "below '$loss' 1e-5 && below '$weights' 1e-6"
done
read -r loss weights < <(differ mpi nccl)
expect "nccl_dp_mpi_equals_nccl: parallel.comm: mpi = nccl (loss $loss, weights $weights: both 0)" \
  "below '$loss' 0 && below '$weights' 0"
read -r loss weights < <(differ single ref)
expect "nccl_dp_control: micro_batches 1 and 2 differ by more than the tolerance (weights $weights > 1e-6)" \
  "[ '$weights' != - ] && ! below '$weights' 1e-6"

train onegpu 2 1 parallel.dp=2
rc=$?
lines=$(grep -c '^mtrain' "$tmp/onegpu.out")
expect "nccl_dp_one_gpu: nccl with 2 ranks on 1 GPU ends with one line (exit $rc, $lines line(s): $(grep -m1 '^mtrain' "$tmp/onegpu.out"))" \
  "[ $rc -ne 0 ] && [ $lines -eq 1 ] &&
   grep -q '^mtrain: parallel.comm: nccl: 2 ranks on a node with 1 GPU (NCCL needs a GPU per rank' '$tmp/onegpu.out' &&
   ! grep -q '^step ' '$tmp/onegpu.out'"
exit $((failures > 0))
